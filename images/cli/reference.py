"""docs/cli.md: build.py's reference, generated from the parsers' own --help (TGI's update_doc.py
practice), so it cannot say what the CLI does not do. `python build.py generate` writes it,
`generate --check` (and tests/unit/test_cli.py) fail when it drifted.
"""

from __future__ import annotations

import argparse

from .command import walk

HEADER = """# `python build.py` reference

Generated from the parsers by `python build.py generate`; do not edit (`generate --check` and a test
fail when this drifts from `--help`). To add a command, see `images/cli/app.py`. `kiln COMMAND` (the
console script `pip install -e .` installs) is the same CLI.
"""


def render(parser: argparse.ArgumentParser) -> str:
    """The reference of `parser` (images/cli/app.py's), every command's --help under its heading."""
    parts = [HEADER]
    for p, path in walk(parser):
        title = " ".join(("python build.py", *path))
        parts.append(f"## `{title}`\n\n```text\n{p.format_help().rstrip()}\n```\n")
    return "\n".join(parts)
