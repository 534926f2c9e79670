"""`python build.py publish-config FILE --repo OWNER/NAME [--branch B] [--path deploy.toml]
    [--canary N] [--wait] [--timeout S]` (its arguments: images/cli/fleet.py)

Uploads a deploy config to a Hub repo and branch, where every pod whose `[watch]` names that repo
picks it up. It refuses before anything is uploaded: a name that could step out of the repo, a
file over the size cap, not UTF-8 or holding a NUL byte, a config that does not validate, or a
rung the engine's flag snapshot says it would reject (--flags, or the config's own
server.flag_snapshot when this machine has it). A pod validates again on arrival (its own engine,
hardware and model); this only stops the obvious before it travels.

`--canary N` first gives it to N of the pods that report to the repo (kiln-canary/B), waits for
their verdicts and promotes it to B only when they took it; `--wait` waits until every reporting
pod decided the commit on B (images/fleet/rollout.py; the verdicts: supervisor/fleet/record.py).

The token comes from $HF_TOKEN (or a secret file: --token-file, $KILN_HF_TOKEN_FILE,
/run/secrets/hf_token) and is never printed: every message is masked with it.
Exit: 0 published (promoted; with --wait, taken by every pod), 1 the Hub refused or could not be
reached, 2 refused here (nothing uploaded), 3 a canary or pod rolled back, rejected or failed it,
4 timed out waiting for verdicts.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

from supervisor.fleet import record as fleet
from supervisor import hubclient
from supervisor.reload.candidate import decode
from supervisor.config import HF_REPO, SAFE_PATH, parse_config
from supervisor.errors import ConfigError
from supervisor.redact import redact

EXIT_OK, EXIT_HUB, EXIT_REFUSED = 0, 1, 2


def problems_with(data: bytes, *, repo: str, branch: str, path: str, flags: str | None) -> list[str]:
    """Everything wrong with publishing data as repo@branch:path, before anything travels."""
    out: list[str] = []
    if not re.fullmatch(HF_REPO, repo):
        out.append(f"--repo: {repo!r} is not OWNER/NAME")
    if not re.fullmatch(r"[\w][\w./-]{0,199}", branch) or ".." in branch:
        out.append(f"--branch: {branch!r} is not a branch name")
    if not re.fullmatch(SAFE_PATH, path) or ".." in path.split("/"):
        out.append(f"--path: {path!r} must be a relative path inside the repo (no '..', no leading '/', "
                   "letters, digits, . _ - and /)")
    text, bad = decode(data)
    out += bad
    if text is None:
        return out
    try:
        cfg = parse_config(text, source=path, env={})
    except ConfigError as e:
        return out + [str(p) for p in e.problems]
    from supervisor.engines import registry as engines

    try:
        engine = engines.get(cfg.engine)
    except KeyError as e:
        return out + [f"engine: {e.args[0]}"]
    snap_path = Path(flags or cfg.server.flag_snapshot)
    snapshot = engine.load_snapshot(snap_path) if snap_path.is_file() else None
    if flags and snapshot is None:
        out.append(f"--flags: {flags} cannot be read")
    for i, rung in enumerate(cfg.ladder.rungs):
        out += [str(x) for x in engine.lint_rung(cfg, i, rung, snapshot)]
    return out


def main(args: argparse.Namespace) -> int:
    try:
        token = hubclient.token_or_file(args.token_file, os.environ)
    except OSError as e:
        print(f"publish-config: cannot read --token-file: {e.strerror}", file=sys.stderr)
        return EXIT_REFUSED
    if (why := hubclient.endpoint_problem()) is not None:
        print(f"publish-config: {why}", file=sys.stderr)
        return EXIT_REFUSED

    def mask(text: str) -> str:
        return redact(text, [token])

    try:
        data = Path(args.file).read_bytes()
    except OSError as e:
        print(f"publish-config: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return EXIT_REFUSED
    problems = problems_with(data, repo=args.repo, branch=args.branch, path=args.path, flags=args.flags)
    if args.canary is not None and args.canary < 1:
        problems.append(f"--canary: {args.canary} must be 1 or more (the number of pods that take it first)")
    if not 0 < args.timeout <= 86400:
        problems.append(f"--timeout: {args.timeout:g} must be more than 0 and at most 86400 seconds")
    if args.branch == fleet.FLEET_BRANCH or args.branch.startswith(fleet.CANARY_PREFIX):
        problems.append(f"--branch: {args.branch!r} is Kiln's own (fleet records, canary rollouts); publish to "
                        "the branch the pods watch")
    if problems:
        print(f"publish-config: {args.file}: {len(problems)} problem(s); nothing was uploaded", file=sys.stderr)
        for line in problems:
            print(f"  - {mask(line)}", file=sys.stderr)
        return EXIT_REFUSED
    if not token:
        print("publish-config: no Hub token: set HF_TOKEN, or pass --token-file (a secret file)", file=sys.stderr)
        return EXIT_REFUSED
    cfg_hash = parse_config(data.decode("utf-8"), env={}).hash
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    with tempfile.TemporaryDirectory(prefix="kiln-publish-") as cache:
        target = None
        if args.canary is not None or args.wait:
            from . import rollout
            from .status import FleetReader

            target = rollout.RolloutTarget(api, FleetReader(api, args.repo, Path(cache)), args.repo, args.branch,
                                           args.path, data, cfg_hash, args.timeout, mask, message=args.message)
        try:
            if args.create:
                api.create_repo(args.repo, private=True, exist_ok=True)
            if args.branch != "main":
                api.create_branch(args.repo, branch=args.branch, exist_ok=True)
            if target is not None and args.canary is not None:
                return rollout.canary(target, args.canary, then_wait=args.wait)
            before = rollout.pods_on(target, target.reader.read()) if target is not None else []
            info = api.upload_file(path_or_fileobj=data, path_in_repo=args.path, repo_id=args.repo,
                                   revision=args.branch, commit_message=args.message or
                                   f"kiln: publish {args.path} (config {cfg_hash[:12]})")
        except Exception as e:  # noqa: BLE001 - one masked line, never a traceback with headers in it
            kind = hubclient.error_kind(e)
            print(f"publish-config: the Hub refused or could not be reached ({kind}): "
                  f"{mask(hubclient.describe(e))}", file=sys.stderr)
            return EXIT_HUB
        commit = getattr(info, "oid", None) or "?"
        print(f"published {args.path} to hf://{args.repo}@{args.branch}: commit {commit} (config hash "
              f"{cfg_hash[:12]})", flush=True)
        if target is not None and commit != "?":
            return rollout.wait_fleet(target, commit, before)
    return EXIT_OK
