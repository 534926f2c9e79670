"""docs/cli.md: build.py's reference, generated from the parsers' own --help (TGI's update_doc.py
practice), so it cannot say what the CLI does not do. tests/unit/test_cli.py fails on drift.

    python -m images.cli.reference          # rewrite docs/cli.md
    python -m images.cli.reference --check  # exit 1 when it drifted
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..target import IMAGES_DIR
from . import parser
from .command import walk

DOC_PATH = IMAGES_DIR.parent / "docs" / "cli.md"

HEADER = """# `python build.py` reference

Generated from the parsers by `python -m images.cli.reference`; do not edit (a test fails when this
drifts from `--help`). To add a command, see `images/cli/__init__.py`.
"""


def render() -> str:
    parts = [HEADER]
    for p, path in walk(parser()):
        title = " ".join(("python build.py", *path))
        parts.append(f"## `{title}`\n\n```text\n{p.format_help().rstrip()}\n```\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m images.cli.reference", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/cli.md drifted; write nothing")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not DOC_PATH.is_file() or DOC_PATH.read_text(encoding="utf-8") != text:
            print(f"{DOC_PATH} drifted from build.py --help: run `python -m images.cli.reference`", file=sys.stderr)
            return 1
        return 0
    DOC_PATH.write_text(text, encoding="utf-8")
    print(DOC_PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main())
