"""`python -m supervisor.router.launch [--key-file F] -- SMG_LAUNCH_ARGS...`: smg's router, with the
API key read from a 0600 file and handed to smg's own parser in-process.

smg takes its key only as `--api-key K` (no environment fallback in its router_args.py), and argv
is readable by every user in /proc: so the supervisor's argv names the file, never the key. Runs in
the router's Python (server.binary), which has smg; imports nothing of the supervisor but this file.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

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
    key_file = None
    if argv[:1] == ["--key-file"] and len(argv) > 1:
        key_file, argv = argv[1], argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    return key_file, argv


def main(argv: list[str] | None = None) -> int:
    key_file, args = split(list(sys.argv[1:] if argv is None else argv))
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
    if key_file:
        args += [KEY_FLAG, Path(key_file).read_text(encoding="utf-8").strip()]
    launch_router(parse_router_args(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
