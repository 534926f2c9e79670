"""A small real filesystem for tests that need a disk to fill or to be too small: a tmpfs mounted
for the test and unmounted after it (these machines and CI run as root; where mounting is not
permitted the test is skipped with the reason)."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def small_tmpfs(mnt: Path, size: str, *, why_skip: str = "") -> Iterator[Path]:
    """`mnt` (created) with a tmpfs of `size` ("1m", "16m") on it; pytest-skips when it cannot be mounted."""
    import pytest

    mnt.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "kiln-small-disk", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}){'; ' + why_skip if why_skip else ''}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
