"""docs/cli.md: build.py's reference, generated from the parsers' own --help (TGI's update_doc.py
practice), so it cannot say what the CLI does not do. tests/unit/test_cli.py fails on drift.

    python -m images.cli.reference          # rewrite docs/cli.md
    python -m images.cli.reference --check  # exit 1 when it drifted
"""

from __future__ import annotations

import argparse
import sys

from ..paths import DOCS_CLI
from .app import parser
from .command import walk

HEADER = """# `python build.py` reference

Generated from the parsers by `python -m images.cli.reference`; do not edit (a test fails when this
drifts from `--help`). To add a command, see `images/cli/app.py`.
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
        if not DOCS_CLI.is_file() or DOCS_CLI.read_text(encoding="utf-8") != text:
            print(f"{DOCS_CLI} drifted from build.py --help: run `python -m images.cli.reference`", file=sys.stderr)
            return 1
        return 0
    DOCS_CLI.write_text(text, encoding="utf-8")
    print(DOCS_CLI)
    return 0


if __name__ == "__main__":
    sys.exit(main())
