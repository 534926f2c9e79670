"""`pods up|status|logs|down|volumes`: RunPod pods from a target's template. Thin wiring only:
what each does is images/runpod/pods.py and images/runpod/pods_cli.py (also `python -m images.pods`)."""

from __future__ import annotations

import argparse
from typing import Callable

from .command import Command


def _runner(name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from ..runpod import pods_cli as pods

        args.command = name
        return pods.run(args)
    return run


def _commands() -> tuple[Command, ...]:
    from ..runpod import pods_cli as pods

    return tuple(Command(name, summary, _runner(name), arguments)
                 for name, (summary, arguments) in pods.SUBCOMMANDS.items())


COMMANDS = (
    Command("pods", "RunPod pods from a target's template: up, status, logs, down (terminate, never stop), volumes",
            children=_commands(),
            description="RunPod pods from a target's template (REST API v2, $RUNPOD_API_KEY).\n"
            "README: From zero to a serving pod."),
)
