"""How a build.py subcommand is declared, and the options several of them share.

A subcommand is a `Command`: its name, a one-line summary (the top-level --help lists it), the
options it takes (`arguments`, which is exactly what its own --help shows) and the function that
runs it. A group of subcommands (`pods up`, `pods down`) is a Command with `children` and no
`run`. Every command module under images/cli/ exports a tuple COMMANDS (generate.py a function
making it); images/cli/app.py lists those tuples in one table, and that table is the whole CLI:
the parsers, the dispatch and the checked-in reference (docs/cli.md) are all derived from it.
"""

from __future__ import annotations

import argparse
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from supervisor.errors import KilnError

from ..target import DEFAULT_TARGET

HELP_WIDTH = 100     # fixed, so --help (and docs/cli.md, generated from it) is the same on every terminal


def _no_arguments(p: argparse.ArgumentParser) -> None:
    del p


@dataclass(frozen=True)
class Command:
    name: str
    summary: str                                             # one line in `build.py --help`
    run: Callable[[argparse.Namespace], int] | None = None   # returns the exit status
    arguments: Callable[[argparse.ArgumentParser], None] = _no_arguments
    description: str = ""                                    # atop `build.py NAME --help` (default: summary)
    children: tuple["Command", ...] = ()                     # a group: `build.py NAME CHILD ...`


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions keep their paragraphs (one per line of the source text), each wrapped."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=HELP_WIDTH, max_help_position=32)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(textwrap.fill(para, width, initial_indent=indent, subsequent_indent=indent,
                                       break_on_hyphens=False)
                         if para else "" for para in text.splitlines())


def add_commands(parent: argparse.ArgumentParser, commands: tuple[Command, ...]) -> None:
    """Mount `commands` (recursively, for groups) as subparsers of `parent`."""
    sub = parent.add_subparsers(title="commands", metavar="COMMAND", required=True,
                                dest=f"command_{parent.prog.count(' ')}")
    for c in commands:
        p = sub.add_parser(c.name, help=c.summary, description=c.description or c.summary,
                           formatter_class=Formatter)
        c.arguments(p)
        if c.children:
            add_commands(p, c.children)
        elif c.run is None:
            raise TypeError(f"command {c.name} has neither run nor children")
        else:
            p.set_defaults(run=c.run)


def walk(parser: argparse.ArgumentParser):
    """(parser, path) for `parser` and every subcommand parser below it, in declaration order."""
    yield parser, ()
    for action in parser._actions:                   # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                for p, path in walk(sub):
                    yield p, (name, *path)


# -- options several commands take (one spelling, one help text) ------------------------------
def target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=DEFAULT_TARGET, metavar="T",
                   help=f"target name, images/targets/T.toml (default: {DEFAULT_TARGET}; `list` shows them)")


def patch_files(p: argparse.ArgumentParser) -> None:
    p.add_argument("--patch-file", action="append", metavar="NAME=PATH",
                   help="your copy of a patch the target names (repeatable)")


def allow_floating(p: argparse.ArgumentParser, what: str = "build") -> None:
    p.add_argument("--allow-floating", action="store_true",
                   help=f"{what} even with unresolved pins (the image is labelled io.kiln.floating=true)")


def image(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image", metavar="REPO", help="repository for the image's tags (default: the target's "
                   "`image`, e.g. ghcr.io/you/kiln)")


def base_image(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-image", metavar="REF", help="use this image for both build and runtime bases "
                   "(air-gapped or registry-less builds, e.g. kiln-local/debian:bookworm)")


def build_network(p: argparse.ArgumentParser, extra: str = "") -> None:
    p.add_argument("--build-network", metavar="NET", help="network for the build's RUN steps: host (the default; "
                   "needed by the private dockerd with --bridge=none) or default (a buildx docker-container "
                   f"builder){extra}")


def template_reference_options(p: argparse.ArgumentParser, *, name_flag: str = "--template-name") -> None:
    """What names the template's image and the template itself: one spelling for `template` and `pods up`."""
    p.add_argument("--image-ref", metavar="REF", help="the template's whole image reference (default: the target's "
                   "immutable tag in --image or the target's repository)")
    p.add_argument(name_flag, dest="template_name", metavar="NAME", help="template name (default: [runpod] "
                   "template_name, kiln-<target>)")
    p.add_argument("--registry-auth", metavar="ID", help="RunPod container registry credential id (the "
                   "template's `registry`) for a private image")


def verify_options(p: argparse.ArgumentParser) -> None:
    """`up --verify`: the image is verified before anything is rented (pods, endpoint, cluster)."""
    p.add_argument("--verify", action="store_true", help="verify the image before anything is rented: signed over "
                   "its exact manifest digest, its SBOM, provenance and a passed GPU gate attested about that digest "
                   "(`build.py sign`); refused, naming what failed, otherwise")
    p.add_argument("--key", type=Path, metavar="FILE", help="with --verify: the signer's public key (PEM; default: "
                   "$KILN_VERIFY_KEY)")


# -- helpers for the commands' run functions ------------------------------------------------------
def parse_patch_files(items: list[str] | None) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for item in items or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise KilnError(f"--patch-file {item!r}: expected NAME=PATH, e.g. llama-k3-moe-cache=./x.patch")
        p = Path(path)
        if not p.is_file():
            raise KilnError(f"--patch-file {name}={path}: no such file")
        if not os.access(p, os.R_OK):
            raise KilnError(f"--patch-file {name}={path}: not readable by this user")
        out[name] = p
    return out


def readable_file(option: str, path: Path | None) -> Path | None:
    """A file option's value, refused in one line when it is not a readable file."""
    if path is None:
        return None
    if not path.exists():
        raise KilnError(f"{option} {path}: no such file")
    if not path.is_file():
        raise KilnError(f"{option} {path}: is not a file")
    if not os.access(path, os.R_OK):
        raise KilnError(f"{option} {path}: not readable by this user")
    return path


def verify_key(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The public key `up --verify` checks the image with; None without --verify."""
    from ..attest.keys import verify_key as load

    if not getattr(args, "verify", False):
        if getattr(args, "key", None) is not None:
            raise KilnError(f"--key {args.key}: the key is what --verify checks the image with: add --verify")
        return None
    return load(args.key)


def target_and_pins(name: str):
    from ..pins.lock import load_lock, pins_for
    from ..target import load_target

    t = load_target(name)
    return t, pins_for(t, load_lock())


def open_binaries_store(spec: str | None, target):
    """--binaries-store / --store / --publish, then $KILN_BINARIES_STORE, the target's repo, the local cache."""
    from ..binaries import obtain as binaries
    from ..binaries.stores import open_store

    choice = spec or os.environ.get("KILN_BINARIES_STORE") or target.binaries_repo
    return open_store(choice or str(binaries.local_store_dir()), token=os.environ.get("HF_TOKEN") or None,
                      endpoint=os.environ.get("HF_ENDPOINT") or None)
