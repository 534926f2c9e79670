"""`python -m supervisor.router.launch [--key-file F] [--probe-timeout S] [--replica URL]... --
SMG_LAUNCH_ARGS...`: smg's router, with the API key read from a 0600 file and handed to smg's own
parser in-process.

smg takes its key only as `--api-key K` (no environment fallback in its router_args.py), and argv
is readable by every user in /proc: so the supervisor's argv names the file, never the key.

Before smg starts, the key is shown to the replicas (GET /v1/models with it, each at most
--probe-timeout): when none accepts it and at least one refuses it (401/403), the router could
route nothing, ever, so it does not start: one line the supervisor classifies as config_rejected
(engines/router.py), which is terminal: FAILED with that cause, never SERVING with nothing routed
(issue 37 item 10). Replicas that do not answer yet are no verdict (they may still be starting).

Runs in the router's Python (server.binary), which has smg; imports nothing of the supervisor but
this file and keycheck.py (stdlib only).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from . import keycheck

KEY_FLAG = "--api-key"     # what --key-file becomes on smg's command line (engines/router.py LAUNCHER_FLAGS)


def pinned() -> str | None:
    """The smg version Kiln pins: read from the hashed requirements the image installs (one pin: the router
    target's [source], written there by `generate`/`upgrade`), in a checkout supervisor/router-requirements.txt,
    in the image /opt/kiln/router-requirements.txt beside /opt/kiln/app/supervisor (images/templates/_supervisor.j2)."""
    here = Path(__file__).resolve()
    for path in (here.parents[1] / "router-requirements.txt", here.parents[3] / "router-requirements.txt"):
        try:
            found = re.search(r"^smg==(\S+)", path.read_text(encoding="utf-8"), re.MULTILINE)
        except OSError:
            continue
        if found:
            return found.group(1)
    return None


def split(argv: list[str]) -> tuple[str | None, list[str]]:
    """(key file, smg's arguments) from this launcher's arguments."""
    key_file, _, _, smg = parse(argv)
    return key_file, smg


def parse(argv: list[str]) -> tuple[str | None, list[str], float, list[str]]:
    """(key file, replica URLs to show the key to, their timeout, smg's arguments)."""
    key_file, replicas, timeout = None, [], 5.0
    while argv[:1] in (["--key-file"], ["--replica"], ["--probe-timeout"]) and len(argv) > 1:
        if argv[0] == "--key-file":
            key_file = argv[1]
        elif argv[0] == "--replica":
            replicas.append(argv[1])
        else:
            timeout = float(argv[1])
        argv = argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    return key_file, replicas, timeout, argv


def main(argv: list[str] | None = None) -> int:
    key_file, replicas, timeout, args = parse(list(sys.argv[1:] if argv is None else argv))
    try:
        from importlib.metadata import version

        from smg.launch_router import launch_router, parse_router_args
        installed = version("smg")
    except ImportError as e:
        pin = pinned()
        print(f"kiln router: the router's package is not importable by {sys.executable} ({e}): install it "
              f"with `{sys.executable} -m pip install {'smg==' + pin if pin else 'smg'}` (in a checkout: pip install "
              "-e '.[router]'), or point server.binary at a Python that has it", file=sys.stderr)
        return 127
    pin = pinned()
    if pin is not None and installed != pin:
        print(f"kiln router: smg {installed} is installed, Kiln pins {pin}: its worker API may differ",
              file=sys.stderr)
    key = Path(key_file).read_text(encoding="utf-8").strip() if key_file else None
    refused = keycheck.refusal(keycheck.show_key(replicas, key, timeout), has_key=bool(key))
    if refused:
        print(f"kiln router: no replica accepts the router's key: {refused}", file=sys.stderr)
        return 2
    if key:
        args += [KEY_FLAG, key]
    launch_router(parse_router_args(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
