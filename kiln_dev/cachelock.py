"""One writer at a time for a cache on this machine: two setups at once (two clones, a test run beside
a benchmark) must not delete or half-use each other's work (issue 48: a second `vllm_cpu ensure`
removed the first's half-made venv, and pip then "installed" into the machine's own Python).

    with held(cache_root() / "ensure.lock"):     # the second caller waits here, then finds it made
        ...

An advisory flock on a file beside the cache: the kernel drops it when its holder dies, so a killed
setup never leaves the next one waiting.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def held(lock_file: Path, *, what: str = "") -> Iterator[None]:
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another setup to finish {what or lock_file.parent} ({lock_file})", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)        # closing the descriptor releases the lock
