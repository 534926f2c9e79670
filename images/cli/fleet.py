"""`publish-config` and `fleet-status`: the publisher's side of a fleet of pods that watch a Hub repo.
Arguments and wiring only: what each does is images/fleet/publish.py (with rollout.py for --canary
and --wait) and images/fleet/status.py; the records the pods write are supervisor/fleet/record.py.
Each prints its own one-line errors, prefixed with its name, and returns its documented exit code."""

from __future__ import annotations

import argparse

from .command import Command


def _repo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repo", required=True, help="OWNER/NAME of the Hub repo the pods' [watch] names")


def _token_file(p: argparse.ArgumentParser) -> None:
    p.add_argument("--token-file", help="read the token from this file instead of $HF_TOKEN")


def _publish_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="the deploy config (TOML) to publish")
    _repo(p)
    p.add_argument("--branch", default="main")
    p.add_argument("--path", default="deploy.toml", help="path of the config in the repo (default deploy.toml)")
    p.add_argument("--flags", help="the engine's --help output to lint rungs against "
                   "(default: the config's server.flag_snapshot when it exists here)")
    p.add_argument("--message", help="commit message")
    _token_file(p)
    p.add_argument("--create", action="store_true", help="create the repo (private) when it does not exist")
    p.add_argument("--canary", type=int, metavar="N", help="give it to N reporting pods first (a canary branch), "
                   "promote it to --branch only when they applied it")
    p.add_argument("--wait", action="store_true", help="wait until every reporting pod applied it or rolled it "
                   "back, and print their verdicts")
    p.add_argument("--timeout", type=float, default=900.0, metavar="S",
                   help="how long --canary and --wait each wait for verdicts (default 900)")


def _publish(args: argparse.Namespace) -> int:
    from ..fleet import publish

    return publish.main(args)


def _status_arguments(p: argparse.ArgumentParser) -> None:
    _repo(p)
    p.add_argument("--branch", help="only pods watching this branch")
    p.add_argument("--path", help="only pods watching this path")
    p.add_argument("--json", action="store_true", help="print the records as JSON instead of the table")
    _token_file(p)


def _status(args: argparse.Namespace) -> int:
    from ..fleet import status

    return status.main(args)


COMMANDS = (
    Command("publish-config", "validate a deploy config and upload it to a Hub repo branch that pods watch",
            _publish, _publish_arguments,
            description="Validate a deploy config and upload it to the Hub repo branch that pods watch ([watch]); "
            "nothing is uploaded when the config, the name or the size is wrong, or a rung is one the engine's "
            "flag snapshot rejects.\n--canary N gives it to N reporting pods first (a kiln-canary/ branch) and "
            "promotes it only when they applied it; --wait waits for every reporting pod's verdict.\n"
            "The token comes from $HF_TOKEN or a secret file (--token-file) and is never printed.\n"
            "Exit: 0 published, 1 the Hub refused or could not be reached, 2 refused here (nothing uploaded), "
            "3 a canary or pod rolled back, rejected or failed it, 4 timed out waiting for verdicts.\n"
            "docs/fleet-and-reload.md: Hot reload and fleets."),
    Command("fleet-status", "the pods reporting to a Hub repo: state, revision, last verdict, age of their last "
            "report", _status, _status_arguments,
            description="The pods reporting to a Hub repo, as their records on its kiln-fleet branch say: pod, "
            "state, the live config's revision and hash, the last reload verdict, and how long ago each wrote. "
            "A pod silent for more than 3 of its heartbeats is shown STALE.\n"
            "Exit: 0 listed (an empty fleet too), 1 the Hub refused or could not be reached, 2 bad arguments."),
)
