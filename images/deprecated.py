"""Old spellings of workstation commands, kept for one release: one deprecation line, then the new one.

`forward` runs the new command as a child (this checkout's build.py), not in this process: a
module whose old spelling it keeps (images/generate/golden.py, images/build/engine_facts.py,
images/cli/reference.py) is itself imported by the command it now forwards to, and importing the
CLI from it would close an import cycle. It imports only the leaf images/paths.py.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

from .paths import REPO_ROOT


def notice(old: str, new_argv: list[str]) -> None:
    """The one deprecation line, on stderr: the old spelling and the command that replaces it."""
    print(f"{old}: deprecated spelling (it goes in the next release); use: "
          f"{shlex.join(['python', 'build.py', *new_argv])}", file=sys.stderr, flush=True)


def forward(old: str, new_argv: list[str]) -> int:
    """Print the deprecation line, run `python build.py NEW_ARGV`, return its exit status."""
    notice(old, new_argv)
    rc = subprocess.call([sys.executable, str(REPO_ROOT / "build.py"), *new_argv])
    return rc if rc >= 0 else 128 - rc          # killed by signal N: the shell's 128+N
