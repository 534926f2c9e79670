"""`upgrade`: move a target's engine to another version once every deploy config still lints."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from supervisor.errors import KilnError

from . import command as opt
from .command import Command

DESCRIPTION = (
    "Move a target's engine (a PyPI wheel or sdist) to another version, showing first what the move "
    "changes.\n"
    "Engines: vLLM (a wheel), llama.cpp (an sdist) and the router's smg (a wheel; its parser is "
    "`smg launch --help` of that version installed into the cache).\n"
    "1. The version: --to VERSION, else the newest final release on the index with a file the target can "
    "pin.\n"
    "2. Its pins: the file's sha256; for vLLM the CUDA floor (the wheel's torch pin and torch's CUDA "
    "requirements, PEP 658 metadata) and the hash-locked closure (every package walked on the index and "
    "checked against every requirement met; metadata only). Cached under ~/.cache/kiln/upgrade/. A closure "
    "that does not resolve (a requirement the index lacks) does not stop the report: the flags and the lint "
    "below are still shown (they need only the new version's parser), the gap is named, and so is the "
    "newest release newer than the pinned one whose closure resolves, with the command that takes it; exit 2, "
    "nothing written.\n"
    "3. The flag snapshots of the pinned and the new version, from each engine's own parser as an image "
    "build makes them: vLLM's `serve --help=all` with its CPU platform pinned, in a light scratch venv "
    "(the closure without its GPU packages, a CPU torch); llama.cpp's compiled `llama-server --help` (the"
    " compile cache; minutes). Cached by version; --snapshot VERSION=FILE uses a file instead.\n"
    "4. The difference on stdout, as Markdown: flags removed (with the replacement where the help or the "
    "changelog names it), renamed (still accepted, no longer shown), added, defaults changed, choices "
    "changed, deprecated.\n"
    "5. Every deploy config of every target on that engine, and each --published FILE, linted against "
    "both snapshots: a rung the new version refuses where the pinned one did not refuses the upgrade, one"
    " line each naming the file, the rung, the flag and the fix (exit 2); nothing is written. So do the "
    "flags Kiln itself adds to every rung's command line (the supervisor's argv builders: llama.cpp "
    "--api-key-file, vLLM --served-model-name, ...) and, for a config that runs as a cluster, to every "
    "node's (supervisor/cluster/engine.py: --nnodes --node-rank --master-addr --master-port, --headless): "
    "one line per flag the new version lacks, naming the builder to change.\n"
    "6. Clean and not --dry-run: writes images/closures/<package>-<version>-cp312.txt (vLLM), the "
    "target's pins in images/lock.toml and its [source]; the router also supervisor/router-requirements.txt "
    "(resolved and hashed by pip first) and pyproject.toml's smg pins. Then run `python build.py generate` for the "
    "rendered Dockerfiles.\n"
    "--dry-run writes nothing (the cache aside)."
)


def _arguments(p: argparse.ArgumentParser) -> None:
    opt.target(p)
    p.add_argument("--to", metavar="VERSION", help="the version to move to (default: the newest on the index)")
    p.add_argument("--dry-run", action="store_true", help="show the move and lint, write nothing")
    p.add_argument("--published", action="append", type=Path, metavar="FILE", default=[],
                   help="a deploy config published to pods (a copy of the watched file), linted too (repeatable)")
    p.add_argument("--snapshot", action="append", metavar="VERSION=FILE", default=[],
                   help="use FILE (an engine's --help text) as VERSION's flag snapshot instead of making one "
                   "(repeatable; e.g. the committed help fixtures)")
    p.add_argument("--index", default="https://pypi.org/simple", metavar="URL",
                   help="the package index (PEP 691 JSON; default: %(default)s)")
    p.add_argument("--python", metavar="PY", help="vLLM: the interpreter of the scratch venv (default: this one)")
    p.add_argument("--cpu-torch", metavar="SPEC", help="vLLM: what pip installs as the scratch venv's CPU torch "
                   "(default: a torch-*+cpu wheel in pip's find-links, else download.pytorch.org's CPU index)")


def _given(items: list[str]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for item in items:
        version, sep, path = item.partition("=")
        if not sep or not version or not path:
            raise KilnError(f"--snapshot {item!r}: expected VERSION=FILE, e.g. 0.33.0=vllm-0.33.0-serve-help-all.txt")
        out[version] = opt.readable_file(f"--snapshot {version}=", Path(path)) or Path(path)
    return out


def _run(args: argparse.Namespace) -> int:
    from ..upgrade import engine as upgrade, report as upgrade_report

    for f in args.published:
        opt.readable_file("--published", f)
    command = "python build.py upgrade " + shlex.join(_spelled(args))
    p = upgrade.plan(args.target, args.to, index=args.index, given=_given(args.snapshot),
                     published=args.published, python=args.python, cpu_torch=args.cpu_torch)
    sys.stdout.write(upgrade_report.markdown(p, command))
    sys.stdout.flush()
    if p.unresolved:
        print(f"error: {p.moved.source.package} {p.new_version} cannot be installed: {'; '.join(p.unresolved)}",
              file=sys.stderr)
        print(f"  {upgrade_report.resolvable_line(p)}", file=sys.stderr)
    if p.refusals:
        print(f"error: refusing to write the lock: {len(p.refusals)} deploy config rung(s) use what "
              f"{p.moved.source.package} {p.new_version} removed:", file=sys.stderr)
        for r in p.refusals:
            print(f"  {r}", file=sys.stderr)
    if not p.clean:
        return 2
    if p.old_version == p.new_version and not p.diff.changed:
        print(f"upgrade: {p.target.name} already pins {p.new_version}", file=sys.stderr)
    if args.dry_run:
        print(f"upgrade: --dry-run: nothing written ({p.target.name} would move to {p.new_version})", file=sys.stderr)
        return 0
    for line in upgrade.apply(p):
        print(f"upgrade: {line}", file=sys.stderr)
    for line in upgrade.stale_mentions(p):
        print(f"upgrade: still names {p.old_version}, re-read it: {line}", file=sys.stderr)
    print("upgrade: next: `python build.py generate` (the rendered Dockerfiles)", file=sys.stderr)
    return 0


def _spelled(args: argparse.Namespace) -> list[str]:
    """The command line, for the report's header (what was asked, however it was spelt)."""
    out = ["--target", args.target] + (["--to", args.to] if args.to else [])
    out += [a for s in args.snapshot for a in ("--snapshot", s)]
    out += [a for f in args.published for a in ("--published", str(f))]
    return out + (["--dry-run"] if args.dry_run else [])


COMMANDS = (
    Command("upgrade", "move a target's engine to a newer version: flag diff, lint every deploy config, then lock",
            _run, _arguments, description=DESCRIPTION),
)
