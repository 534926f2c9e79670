"""Verify the attestations GitHub Actions made keyless (actions/attest@v4) with the GitHub CLI.

.github/workflows/images.yml attests each staging digest; promote asks gh about each predicate type:

    gh attestation verify oci://<registry>/<repo>@sha256:<hex> --repo OWNER/REPO
        [--signer-workflow OWNER/REPO/.github/workflows/images.yml] --predicate-type T --format json

gh fetches the Sigstore bundles GitHub's attestation API holds for the digest, checks each against
Sigstore's trust root, the signing certificate's repository (and workflow), and that the statement's
subject is this digest; it exits non-zero when no attestation of type T passes. With --format json it
prints a JSON array, one object per verified attestation, whose verificationResult.statement holds the
subject, predicateType and predicate (gh's `attestation verify --help`, "Additional Policy
Enforcement"); Kiln reads the verdict's predicate there to require passed. Kiln does not verify Sigstore
certificates itself: gh does, with the trust root it ships.

The types are what actions/attest@v4 writes: its generated SLSA provenance (https://slsa.dev/provenance/v1),
an SPDX SBOM as https://spdx.dev/Document/v<spdxVersion> (actions/attest src/sbom.ts: SPDX-2.3 ->
https://spdx.dev/Document/v2.3), and Kiln's verdict as given (predicate-type).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from typing import Any, Callable

from ..attest import verdict

PROVENANCE = ("provenance", "https://slsa.dev/provenance/v1")
SBOM = ("SBOM", "https://spdx.dev/Document/v2.3")
VERDICT = ("selftest verdict", verdict.PREDICATE_TYPE)

Run = Callable[[list[str]], subprocess.CompletedProcess]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300)


@dataclass(frozen=True)
class GhVerifier:
    repo: str                              # OWNER/REPO the attestations are linked with
    signer_workflow: str | None = None     # OWNER/REPO/.github/workflows/images.yml
    require_verdict: bool = True
    gh: str = "gh"
    run: Run = _run

    def argv(self, subject: str, predicate_type: str) -> list[str]:
        argv = [self.gh, "attestation", "verify", f"oci://{subject}", "--repo", self.repo,
                "--predicate-type", predicate_type, "--format", "json"]
        return argv + (["--signer-workflow", self.signer_workflow] if self.signer_workflow else [])

    def __call__(self, name: str, digest: str) -> list[str]:
        """Problems with the image name@digest (empty when every attestation verified)."""
        subject, problems = f"{name}@{digest}", []
        for what, ptype in (SBOM, PROVENANCE) + ((VERDICT,) if self.require_verdict else ()):
            try:
                r = self.run(self.argv(subject, ptype))
            except FileNotFoundError:
                return [f"{subject}: `{self.gh}` is not installed: GitHub's runners have it; elsewhere install the "
                        "GitHub CLI, or verify with a key (--key)"]
            if r.returncode != 0:
                said = (r.stderr or r.stdout).strip().splitlines()
                problems.append(f"{subject}: no {what} attestation ({ptype}) verified by `gh attestation verify "
                                f"--repo {self.repo}`: {said[-1] if said else f'exit {r.returncode}'}. Fix: attest "
                                "it in the workflow (actions/attest), or promote an image this repository built")
                continue
            if ptype == verdict.PREDICATE_TYPE:
                problems += self._verdict(subject, r.stdout)
        return problems

    @staticmethod
    def _verdict(subject: str, out: str) -> list[str]:
        try:
            results: Any = json.loads(out)
        except ValueError:
            return [f"{subject}: `gh attestation verify --format json` printed no JSON for the verdict"]
        preds = [((r.get("verificationResult") or {}).get("statement") or {}).get("predicate")
                 for r in results if isinstance(r, dict)] if isinstance(results, list) else []
        if not preds:
            return [f"{subject}: gh verified no selftest verdict it could read"]
        failed = [p for p in preds if verdict.failures(p)]
        if failed:
            said = verdict.describe(failed[0]) if isinstance(failed[0], dict) else "no predicate"
            return [f"{subject}: the GPU gate's verdict is {said}. Fix: an image that failed its gate is never "
                    "promoted: fix what the selftest found, then build and gate again"]
        return []
