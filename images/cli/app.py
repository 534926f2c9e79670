"""The workstation's one command line: `python build.py COMMAND`, installed as `kiln COMMAND` too.

The table COMMANDS below is the whole CLI. To add a subcommand (or a group, such as
`pods up|status|logs|down`), write a module in images/cli/ that exports `COMMANDS = (Command(...), ...)`
(see command.py), add its tuple to the table, and run `python build.py generate` to regenerate
docs/cli.md (`generate --check` and a test fail while it is stale).

Every user error is one clear message on stderr and exit 2, never a traceback; argparse's own
usage errors exit 2 as well. An error nothing foresaw (a bug) is one line too, exit 1; KILN_TRACEBACK=1
adds its traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import traceback

import supervisor
from supervisor.errors import KilnError
from supervisor.redact import redact

from . import (binaries, cluster, compare, endpoint, fleet, generate, image, pins, plan, pods, reference, router,
               runpod, sign, upgrade)
from .command import Command, Formatter, add_commands, walk

EXIT_USAGE = 2
EXIT_BUG = 1
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "RUNPOD_API_KEY", "KILN_API_KEY", "KILN_OPERATOR_KEY")

COMMANDS: tuple[Command, ...] = (
    *image.COMMANDS,        # build, render, list, tag
    *pins.COMMANDS,         # lock
    *upgrade.COMMANDS,      # upgrade
    *binaries.COMMANDS,     # compile, publish-binaries, rebuild-binaries
    *compare.COMMANDS,      # compare-images
    *sign.COMMANDS,         # keygen, sign, verify
    *runpod.COMMANDS,       # template
    *pods.COMMANDS,         # pods up|status|logs|down|volumes
    *endpoint.COMMANDS,     # endpoint plan|up|status|logs|down
    *cluster.COMMANDS,      # cluster plan|up|status|logs|down
    *plan.COMMANDS,         # plan
    *fleet.COMMANDS,        # publish-config, fleet-status
    *router.COMMANDS,       # router
    *generate.commands(lambda: reference.render(parser())),    # generate [--check]: docs/cli.md among them
)
PROG = "python build.py"    # the name docs/cli.md and every message use; `kiln` is the same parser


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, formatter_class=Formatter,
        description="Kiln: bake LLM-serving images from targets (images/targets/*.toml), deploy them on RunPod, "
                    "publish deploy configs to a fleet.\n"
                    f"`{prog} COMMAND --help` says what each command takes; `{prog} --target T` is short for "
                    f"`{prog} build --target T`.")
    p.add_argument("--version", action="version", version=f"Kiln {supervisor.__version__}",
                   help="print Kiln's version and exit")
    add_commands(p, COMMANDS)
    return p


def options_of(path: str) -> set[str]:
    """The option strings the subcommand at `path` ("render", "pods up") takes."""
    want = tuple(path.split())
    for p, at in walk(parser()):
        if at == want:
            return set(p._option_string_actions)
    raise KeyError(path)


def _terminated(signum: int, frame: object) -> None:
    # SIGTERM unwinds like Ctrl-C: `with` blocks and finally clauses run, so the docker CLI or
    # compile child is ended and temp dirs (one holds the HF token file of a build) are removed.
    # Python's default action would exit at once and leave both behind.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None, *, prog: str = PROG) -> int:
    """Run one command line (default: this process's arguments); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if threading.current_thread() is not threading.main_thread():     # signals reach the main thread only
        return _main(argv, prog)
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        return _main(argv, prog)
    finally:
        signal.signal(signal.SIGTERM, previous)


def kiln() -> int:
    """The `kiln` console script (pyproject.toml [project.scripts]): `python build.py` by another name."""
    return main(sys.argv[1:], prog="kiln")


def short_form(argv: list[str]) -> list[str]:
    """`--target T [build options]` is the main job's short form (the design card's own spelling,
    `python build.py --target a40-llamacpp`): it means `build --target T [build options]`, so its
    output and exit status are build's. Anything else is left as it is."""
    if argv and (argv[0] == "--target" or argv[0].startswith("--target=")):
        return ["build", *argv]
    return argv


def _main(argv: list[str], prog: str) -> int:
    try:
        args = parser(prog).parse_args(short_form(argv))
        code = args.run(args)
        sys.stdout.flush()      # a buffered stdout's last write fails here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        # The reader went away (`build.py list | head -1`): not an error of the user's. Point stdout
        # at /dev/null so the interpreter's final flush does not complain either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KilnError as e:
        return _error(str(e))
    except OSError as e:
        # What the checks before could not foresee (a disk filling up, a path removed meanwhile,
        # a network error requests raises as an IOError): still one line, never a traceback.
        where = f": {e.filename}" if e.filename else ""
        return _error(f"{e.strerror or e}{where}")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the last net: what nothing foresaw (a bug) is one line too
        if os.environ.get("KILN_TRACEBACK", "") in ("1", "true"):
            print(redact(traceback.format_exc(), [os.environ.get(k) for k in SECRET_ENV]), file=sys.stderr, end="")
        _error(f"unexpected {type(e).__name__}: {e} (a bug in Kiln: please report it; KILN_TRACEBACK=1 prints "
               "where it happened)")
        return EXIT_BUG


def _error(message: str) -> int:
    # Errors quote what a server or a file said; a secret of the environment never goes out with it.
    secrets = [os.environ.get(k) for k in SECRET_ENV]
    print(f"error: {redact(message, secrets)}", file=sys.stderr)
    return EXIT_USAGE
