"""Promote-on-pass: copy staging tags to release tags, all or nothing, after every image passed.

CI builds each target into a staging tag (images/build/tags.py) and runs its selftest; only then does
the promote job call this once for the whole run. Nothing is written until every pair has been
checked: each staging manifest exists, its digest is verified (signed, its SBOM, provenance and a
passing GPU gate verdict attested about that very digest: `verify`, one of the two verifiers below),
each release tag lives in the staging tag's repository (a manifest copy, no layer moves), and no
immutable release tag already names a different image (an immutable tag never moves; re-promoting the
same digest is a no-op). Then the immutable tags are written, then the moving ones (e.g. `<target>`).

    key_verifier   signed with a key the user holds (`build.py sign`): images/attest/verify.py
    GhVerifier     attested keyless in GitHub Actions: `gh attestation verify`
                   (images/ci/gh_attestations.py)

`docker buildx bake --push` tags each image as it finishes even when a later target fails
(docker/buildx#1089); this is the opposite.

Speaks the OCI distribution API directly (GET/PUT /v2/<repo>/manifests/<ref>) with the Bearer
token flow registries use (ghcr.io, Docker Hub); credentials from $KILN_REGISTRY_USER and
$KILN_REGISTRY_PASSWORD (in GitHub Actions: github.actor and GITHUB_TOKEN).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Sequence

from ..attest.keys import PublicKey
from ..attest.verify import VerifyFailed, verify_digest
from ..pins.resolve import split_ref
from ..registry import Manifest, RegistryClient, RegistryError, parse_ref, sha256_digest

# (repository name as registry/repo, manifest digest) -> problems, one line each; empty when it verified.
Verifier = Callable[[str, str], list[str]]


class PromoteError(RegistryError):
    pass


@dataclass(frozen=True)
class Promotion:
    staging: str                    # repo:staging-tag
    immutable: tuple[str, ...]      # release tags that must never move
    moving: tuple[str, ...] = ()    # release tags that follow the latest promotion


def client_from_env(scheme: str = "https") -> RegistryClient:
    return RegistryClient(scheme=scheme, username=os.environ.get("KILN_REGISTRY_USER") or None,
                          password=os.environ.get("KILN_REGISTRY_PASSWORD") or None)


def key_verifier(client: RegistryClient, key: PublicKey, *, require_verdict: bool = True) -> Verifier:
    """Verify with images/attest/verify.py against a public key."""
    def check(name: str, digest: str) -> list[str]:
        try:
            verify_digest(client, parse_ref(f"{name}@{digest}"), digest, key, require_verdict=require_verdict)
        except VerifyFailed as e:
            return e.problems
        except RegistryError as e:
            return [f"{name}@{digest}: could not be verified: {e}"]
        return []
    return check


def promote(promotions: Sequence[Promotion], client: RegistryClient, verify: Verifier) -> list[str]:
    """Check everything (`verify` every staging digest), then write. Returns one line per image verified and
    per tag: written / already there."""
    problems: list[str] = []
    plan: list[tuple[str, Manifest, bool]] = []      # (release ref, manifest, immutable)
    verified: list[str] = []
    for p in promotions:
        s_reg, s_repo, _ = split_ref(p.staging)
        staged = client.get(p.staging)
        if staged is None:
            problems.append(f"{p.staging}: no such staging image (did its build push it?)")
            continue
        digest = sha256_digest(staged.body)          # what is copied is what is verified: the bytes, hashed here
        found = verify(parse_ref(p.staging).name, digest)
        if found:
            problems += found
            continue
        verified.append(f"verified {p.staging} ({digest})")
        for ref, immutable in [(r, True) for r in p.immutable] + [(r, False) for r in p.moving]:
            reg, repo, _ = split_ref(ref)
            if (reg, repo) != (s_reg, s_repo):
                problems.append(f"{ref}: not in the staging image's repository {s_reg}/{s_repo}")
                continue
            if immutable:
                current = client.get(ref)
                if current is not None and current.digest != staged.digest:
                    problems.append(f"{ref}: already names {current.digest}, not {staged.digest}: an immutable "
                                    "tag never moves (bump the version or the engine pin)")
                    continue
                if current is not None:
                    plan.append((ref, staged, True))   # same digest: reported, not rewritten
                    continue
            plan.append((ref, staged, immutable))
    if problems:
        raise PromoteError("nothing promoted:\n  - " + "\n  - ".join(problems))
    done: list[str] = list(verified)
    for ref, manifest, immutable in sorted(plan, key=lambda x: not x[2]):
        current = client.get(ref) if immutable else None
        if current is not None and current.digest == manifest.digest:
            done.append(f"{ref} already {manifest.digest}")
            continue
        client.put(ref, manifest)
        done.append(f"{ref} -> {manifest.digest}")
    return done
