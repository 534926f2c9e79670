"""`generate [--check] [--only NAME]`: every committed generated file from its source, or the check
that none drifted (CI runs --check). Wiring only: the families and the run are images/generate/families.py."""

from __future__ import annotations

import argparse
from typing import Callable

from ..generate import families as generate
from .command import Command


def commands(cli_reference: Callable[[], str]) -> tuple[Command, ...]:
    """The command, given how docs/cli.md is rendered (the table that holds this command renders it)."""
    names = [f.name for f in generate.families(cli_reference)]

    def arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each file that drifted "
                       "from its source (or could not be checked here) and the command that fixes it")
        p.add_argument("--only", action="append", choices=names, metavar="NAME",
                       help=f"only this family (repeatable): {', '.join(names)}")

    def run(args: argparse.Namespace) -> int:
        chosen = tuple(f for f in generate.families(cli_reference) if not args.only or f.name in args.only)
        report = generate.run(chosen, check=args.check)
        return generate.say(report, check=args.check, only=bool(args.only))

    return (
        Command("generate", "regenerate every committed generated file, or --check that none drifted",
                run, arguments,
                description="Regenerate every committed generated file from its source: the rendered Dockerfiles "
                "and RunPod templates (images/rendered/), docs/cli.md, the engine facts (images/engine-facts/, "
                "from each pinned llama.cpp sdist), supervisor/requirements.txt and the router's "
                "supervisor/router-requirements.txt (wheels hashed by pip from its package index); the vendored "
                "RunPod schema (images/schemas/) is checked, not written.\n"
                "--check writes nothing and exits 1 naming each drifted file and the command that fixes it; "
                "what could not be checked here (no network, no package index) is named too, and fails the check."),
    )
