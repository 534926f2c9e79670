"""What .github/workflows/images.yml runs, as commands a person can run too.

    python -m images.ci matrix --run-id ID [--image REPO]
        the build matrix: every target that can be released (floating ones are listed in
        `skipped`, never built for release), with its immutable release tag and staging tag
    python -m images.ci gate --target T --image REF (--local | --runpod) [--timeout S]
        start a staging image on a GPU and wait for the supervisor's selftest verdict (images/ci/gate.py)
    python -m images.ci promote --run-id ID --targets a,b [--image REPO]
        copy every staging tag of the run to its release tags, all or nothing (images/ci/promote.py)

Exit 0 on success, 1 when a gate fails, 2 on a usage or configuration error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

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


def _promote(args: argparse.Namespace) -> int:
    from .promote import Promotion, client_from_env, promote

    wanted = [t for t in args.targets.split(",") if t]
    rows = {row["target"]: row for row in matrix(args.run_id, args.image)["include"]}
    unknown = [t for t in wanted if t not in rows]
    if unknown or not wanted:
        raise KilnError(f"--targets: {', '.join(unknown) or '(none)'} not releasable in this run "
                        f"(releasable: {', '.join(rows) or 'none'})")
    promotions = [Promotion(rows[t]["staging"], (rows[t]["release"],), (rows[t]["moving"],)) for t in wanted]
    for line in promote(promotions, client_from_env(scheme=args.scheme)):
        print(line)
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
                      "state": verdict.state, "reason": verdict.reason, "selftest": verdict.selftest}, indent=2))
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
    args = ap.parse_args(argv)
    try:
        if args.cmd == "matrix":
            print(json.dumps(matrix(args.run_id, args.image)))
            return 0
        if args.cmd == "gate":
            return _gate(args)
        return _promote(args)
    except KilnError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
