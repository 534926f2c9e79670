"""What .github/workflows/images.yml runs, as commands a person can run too.

    python -m images.ci matrix --run-id ID [--image REPO]
        the build matrix: every target that can be released (floating ones are listed in
        `skipped`, never built for release), with its immutable release tag and staging tag
    python -m images.ci gate --target T --image REF (--local | --runpod) [--timeout S]
        start a staging image on a GPU and wait for the supervisor's selftest verdict (images/ci/gate.py)
    python -m images.ci digest --image REF
        the manifest digest a reference names (sha256:…), hashed from the bytes the registry serves
    python -m images.ci verdict --gate verdict.json
        the signed verdict's predicate (https://kiln.dev/selftest-verdict/v1) from what `gate` printed
    python -m images.ci promote --run-id ID --targets a,b [--image REPO] (--key FILE | --gh-repo O/R) [--ungated]
        verify every staging image, then copy every staging tag of the run to its release tags, all or
        nothing (images/ci/promote.py): --key checks `build.py sign`'s signatures with a public key
        (or $KILN_VERIFY_KEY), --gh-repo the keyless attestations the workflow made (`gh attestation verify`)

Exit 0 on success, 1 when a gate fails, 2 on a usage or configuration error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from supervisor.errors import KilnError

from ..build import tags
from ..pins.lock import load_lock, pins_for
from ..target import load_target, target_names


def matrix(run_id: str, repository: str | None = None) -> dict:
    lock = load_lock()
    include, skipped = [], []
    for name in target_names():
        target = load_target(name)
        pins = pins_for(target, lock)
        floating = tags.floating_keys(target, pins)
        if floating:
            skipped.append({"target": name, "why": "unresolved pins: " + ", ".join(floating)})
            continue
        release = tags.release_tag(target, pins, repository)
        repo = release.rpartition(":")[0]
        include.append({
            "target": name,
            "engine": target.engine,
            "gpu": target.is_gpu,
            "release": release,
            "moving": f"{repo}:{name}",
            "staging": tags.staging_tag(release, run_id),
            "cache": f"{repo}-cache:{name}",
            "binaries_store": target.binaries_repo or "",
        })
    return {"include": include, "skipped": skipped}


def _verifier(args: argparse.Namespace, client):  # type: ignore[no-untyped-def]
    from ..attest import keys
    from .gh_attestations import GhVerifier
    from .promote import key_verifier

    key_file = args.key or (Path(os.environ[keys.VERIFY_KEY_ENV]) if os.environ.get(keys.VERIFY_KEY_ENV) else None)
    if key_file is not None and args.gh_repo:
        raise KilnError(f"--gh-repo and --key (or ${keys.VERIFY_KEY_ENV}): choose one way to verify")
    if args.gh_repo:
        return GhVerifier(args.gh_repo, args.gh_signer_workflow, require_verdict=not args.ungated)
    if key_file is None:
        raise KilnError("promote verifies every image before it moves a tag: --key FILE (the public key of "
                        f"`build.py sign`'s key, or ${keys.VERIFY_KEY_ENV}) or --gh-repo OWNER/REPO (attested "
                        "keyless by the images workflow)")
    return key_verifier(client, keys.load_public(key_file), require_verdict=not args.ungated)


def _promote(args: argparse.Namespace) -> int:
    from .promote import Promotion, client_from_env, promote

    wanted = [t for t in args.targets.split(",") if t]
    rows = {row["target"]: row for row in matrix(args.run_id, args.image)["include"]}
    unknown = [t for t in wanted if t not in rows]
    if unknown or not wanted:
        raise KilnError(f"--targets: {', '.join(unknown) or '(none)'} not releasable in this run "
                        f"(releasable: {', '.join(rows) or 'none'})")
    promotions = [Promotion(rows[t]["staging"], (rows[t]["release"],), (rows[t]["moving"],)) for t in wanted]
    client = client_from_env(scheme=args.scheme)
    for line in promote(promotions, client, _verifier(args, client)):
        print(line)
    if args.ungated:
        print("note: --ungated: promoted without a GPU gate verdict (signature, SBOM and provenance verified)")
    return 0


def _digest(args: argparse.Namespace) -> int:
    from ..registry import client_for, parse_ref

    image = parse_ref(args.image)
    found = client_for(image.registry).manifest(image)
    if found is None:
        raise KilnError(f"--image {args.image}: {image.registry} has no manifest for {image.repo}:{image.reference}")
    print(found.digest)
    return 0


def _verdict(args: argparse.Namespace) -> int:
    from ..attest import verdict

    try:
        gate = json.loads(Path(args.gate).read_text())
    except (OSError, ValueError) as e:
        raise KilnError(f"--gate {args.gate}: cannot be read as JSON ({e})") from None
    print(json.dumps(verdict.predicate(gate, f"--gate {args.gate}"), indent=2, sort_keys=True))
    return 0


def _gate(args: argparse.Namespace) -> int:
    from . import gate

    target = load_target(args.target)
    if args.local:
        verdict = gate.gate_local(args.image, target, timeout_s=args.timeout, volume=args.volume,
                                  gpus="" if not target.is_gpu else "all")
    else:
        from ..runpod.api import RunPodAPI
        from ..runpod.template import build_template

        key = os.environ.get("RUNPOD_API_KEY", "")
        if not key:
            raise KilnError("--runpod needs RUNPOD_API_KEY")
        pins = pins_for(target, load_lock())
        tpl = build_template(target, pins, image=args.image, name=f"{target.runpod.template_name}-staging",
                             registry=args.registry_auth or None)
        verdict = gate.gate_runpod(RunPodAPI(key), tpl, target, timeout_s=args.timeout,
                                   pod_name=f"kiln-gate-{target.name}-{args.run_id}", proxy=args.proxy)
    print(json.dumps({"target": target.name, "image": args.image, "passed": verdict.passed,
                      "state": verdict.state, "reason": verdict.reason, "selftest": verdict.selftest,
                      "gate": "local" if args.local else "runpod", "gpus": list(verdict.gpus),
                      "driver": verdict.driver,
                      "finished": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}, indent=2))
    return 0 if verdict.passed else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m images.ci", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("matrix")
    m.add_argument("--run-id", required=True)
    m.add_argument("--image", help="repository (default: each target's `image`)")
    g = sub.add_parser("gate")
    g.add_argument("--target", required=True)
    g.add_argument("--image", required=True, help="the staging image reference")
    where = g.add_mutually_exclusive_group(required=True)
    where.add_argument("--local", action="store_true", help="docker run on this (GPU) machine")
    where.add_argument("--runpod", action="store_true", help="a RunPod Pod from a staging template")
    g.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for a verdict")
    g.add_argument("--volume", help="--local: a docker volume for the model cache (mounted at volume_mount)")
    g.add_argument("--run-id", default="manual")
    g.add_argument("--registry-auth", help="--runpod: RunPod container registry credential id when the staging "
                   "image is private")
    g.add_argument("--proxy", help="--runpod: proxy URL pattern with {pod_id} and {port} (default: "
                   "$RUNPOD_PROXY_URL or RunPod's https://{pod_id}-{port}.proxy.runpod.net)")
    pr = sub.add_parser("promote")
    pr.add_argument("--run-id", required=True)
    pr.add_argument("--targets", required=True, help="comma-separated targets that built and passed")
    pr.add_argument("--image", help="repository (default: each target's `image`)")
    pr.add_argument("--scheme", default="https", choices=("https", "http"))
    pr.add_argument("--key", type=Path, metavar="FILE", help="verify with this public key (`build.py sign`'s "
                    "signatures; default: $KILN_VERIFY_KEY)")
    pr.add_argument("--gh-repo", metavar="OWNER/REPO", help="verify the workflow's keyless attestations with "
                    "`gh attestation verify --repo OWNER/REPO`")
    pr.add_argument("--gh-signer-workflow", metavar="OWNER/REPO/PATH", help="with --gh-repo: only attestations "
                    "this workflow signed (e.g. you/kiln/.github/workflows/images.yml)")
    pr.add_argument("--ungated", action="store_true", help="no GPU gate ran: do not require its verdict")
    d = sub.add_parser("digest")
    d.add_argument("--image", required=True, help="an image reference (tag or digest)")
    v = sub.add_parser("verdict")
    v.add_argument("--gate", required=True, metavar="FILE", help="what `gate` printed")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "matrix":
            print(json.dumps(matrix(args.run_id, args.image)))
            return 0
        if args.cmd == "gate":
            return _gate(args)
        if args.cmd == "digest":
            return _digest(args)
        if args.cmd == "verdict":
            return _verdict(args)
        return _promote(args)
    except KilnError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:        # a tool missing (docker, gh), a disk full: one line, never a traceback
        print(f"error: {e.strerror or e}{': ' + str(e.filename) if e.filename else ''}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
