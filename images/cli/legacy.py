"""The old spellings of build.py (one command with mode flags), honoured for one release.

Before subcommands, `python build.py` was one command whose mode flags (--list, --render,
--print-tag, --runpod-template, --runpod-upsert) silently ignored each other and every option
they did not use (`--render --push` rendered and exited 0). Now an old command line is
rewritten, token for token, into the subcommand it meant; stderr gets one deprecation line
naming that spelling; and what the old command silently ignored is refused (exit 2): two
modes at once, or an option the chosen subcommand does not take.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Callable

from supervisor.errors import KilnError

# Every flag of the old command, in its --help order: (old flag, kind, new spelling).
# kind "mode": the flag picked the command; new is that command's argv head.
# kind "flag" / "value" / "append": an option; new is the subcommand's option of the same meaning.
OLD_FLAGS: tuple[tuple[str, str, tuple[str, ...] | str], ...] = (
    ("--list", "mode", ("list",)),
    ("--target", "value", "--target"),
    ("--render", "mode", ("render",)),
    ("--out", "value", "--out"),
    ("--push", "flag", "--push"),
    ("--tag", "append", "--tag"),
    ("--staging", "value", "--staging"),
    ("--image", "value", "--image"),
    ("--base-image", "value", "--base-image"),
    ("--ca-bundle", "value", "--ca-bundle"),
    ("--allow-floating", "flag", "--allow-floating"),
    ("--binaries", "value", "--binaries"),
    ("--binaries-store", "value", "--binaries-store"),
    ("--fallback-compile", "flag", "--fallback-compile"),
    ("--patch-file", "append", "--patch-file"),
    ("--cache-from", "append", "--cache-from"),
    ("--cache-to", "append", "--cache-to"),
    ("--build-network", "value", "--build-network"),
    ("--print-tag", "mode", ("tag",)),
    ("--runpod-template", "mode", ("template",)),
    ("--runpod-upsert", "mode", ("template", "--upsert")),
    ("--runpod-image", "value", "--image-ref"),
    ("--runpod-template-name", "value", "--name"),
    ("--runpod-registry-auth", "value", "--registry-auth"),
    ("--runpod-api", "value", "--api"),
)
DEFAULT_COMMAND = "build"      # the old command with no mode flag built the image

EPILOG = ("The old single-command spellings (`python build.py --target T`, --list, --render --out D, --print-tag, "
          "--runpod-template, --runpod-upsert, ...) still work until the next release: each is run as the "
          "subcommand above it means, with a deprecation line on stderr naming that spelling.")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise KilnError(f"{message} (old flag spelling; `python build.py --help` lists the commands)")


def _old_parser() -> _Parser:
    p = _Parser(prog="python build.py", add_help=False)
    for flag, kind, _ in OLD_FLAGS:
        dest = flag[2:].replace("-", "_")
        if kind in ("mode", "flag"):
            p.add_argument(flag, dest=dest, action="store_true", default=argparse.SUPPRESS)
        elif kind == "append":
            p.add_argument(flag, dest=dest, action="append", default=argparse.SUPPRESS)
        else:
            p.add_argument(flag, dest=dest, default=argparse.SUPPRESS)
    return p


def is_legacy(argv: list[str]) -> bool:
    """An old spelling: no subcommand first (nothing at all, or an option that is not --help/--version)."""
    return not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"))


def _value_tokens(option: str, value: str) -> list[str]:
    return [f"{option}={value}"] if value.startswith("-") else [option, value]


def translate(argv: list[str], options_of: Callable[[str], set[str]]) -> list[str]:
    """The new argv an old command line means; prints the deprecation line. Raises KilnError (exit 2)
    for what the old command silently ignored."""
    wants_help = any(a in ("-h", "--help") for a in argv)
    given = vars(_old_parser().parse_args([a for a in argv if a not in ("-h", "--help")]))
    modes = [(flag, new) for flag, kind, new in OLD_FLAGS if kind == "mode" and flag[2:].replace("-", "_") in given]
    commands = {new[0] for _, new in modes}
    if len(commands) > 1:
        flags = [flag for flag, _ in modes]
        cmds = " and ".join(f"`python build.py {c}`" for c in sorted(commands))
        raise KilnError(f"{' and '.join(flags)} cannot be combined: they are separate commands now, {cmds}")
    cmd = commands.pop() if commands else DEFAULT_COMMAND
    head = [cmd, *dict.fromkeys(x for _, new in modes for x in new[1:])]     # --runpod-upsert: --upsert
    if wants_help:
        return [cmd, "--help"]
    accepted = options_of(cmd)
    rest: list[str] = []
    refused: list[str] = []
    for flag, kind, new in OLD_FLAGS:
        dest = flag[2:].replace("-", "_")
        if kind == "mode" or dest not in given:
            continue
        assert isinstance(new, str)
        if new not in accepted:
            refused.append(flag)
        elif kind == "flag":
            rest.append(new)
        elif kind == "append":
            for v in given[dest]:
                rest += _value_tokens(new, v)
        else:
            rest += _value_tokens(new, given[dest])
    if refused:
        context = f"with {' '.join(f for f, _ in modes)}" if modes else "in a build (no mode flag)"
        it = "it" if len(refused) == 1 else "them"
        raise KilnError(f"{', '.join(refused)} cannot be used {context}: `python build.py {cmd}` does not take {it} "
                        f"(see `python build.py {cmd} --help`)")
    new_argv = [*head, *rest]
    print(f"build.py: deprecated spelling (it goes in the next release); use: "
          f"{shlex.join(['python', 'build.py', *new_argv])}", file=sys.stderr)
    return new_argv
