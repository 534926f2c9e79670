"""PID 1's own files in the volume, written so that a full disk costs a warning, never the engine.

    write_atomic(path, data, mode)   temp file (created with `mode`), fsync, rename over the old one;
                                     when any step fails the temp file is removed, the old file stands,
                                     and the OSError is raised
    sweep_temps(path)                the temp files of `path` a killed writer left (write_atomic's
                                     name for them exactly, nothing else), removed; for an owner's start
    Writes.attempt(what, cost, fn)   one owner's write that may fail (ENOSPC, EDQUOT, EIO, a read-only
                                     remount): False instead of the error, and a warning for /status
                                     naming the file, the error and what it costs, said once and taken
                                     back when that file is written again

The reload book, the ladder memory, the children journal and the API key files all live under
state_dir, on the same disk the model cache and the engine's log fill. Before, their ENOSPC escaped:
PID 1 exited "unexpected OSError" beside a serving engine, or called a started engine missing
(issue 37). Each owner now decides what a failed write costs and keeps what it must in memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from pathlib import Path
from typing import Callable

__all__ = ["Report", "Writes", "sweep_temps", "write_atomic"]

# (what, warning): a file that cannot be written, its warning; (what, None): it was written again.
Report = Callable[[str, str | None], None]


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """`data` at `path`, whole or not at all; no temp file is left when it fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)   # a private file is never wider
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)             # the umask narrowed what O_CREAT was given
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def sweep_temps(path: Path) -> list[str]:
    """Remove the temp files write_atomic left beside `path` when its writer was killed mid-write
    (`.<name>.<pid>.<thread id>.tmp`, that exact form, plain files only); the names removed. Call it
    where nothing of this process writes `path` yet: an owner's start."""
    own = re.compile(rf"\.{re.escape(path.name)}\.[0-9]+\.[0-9]+\.tmp")
    removed = []
    try:
        with os.scandir(path.parent) as it:
            entries = list(it)
    except OSError:
        return removed
    for e in entries:
        if own.fullmatch(e.name) and e.is_file(follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.unlink(e.path)
                removed.append(e.name)
    return removed


def _log_only(what: str, warning: str | None) -> None:
    if warning is not None:
        logging.getLogger("kiln").warning("%s", warning)


class Writes:
    """The writes of one owner's state files that may fail; `report` hears each change of trouble."""

    def __init__(self, report: Report | None = None):
        self.report = report or _log_only
        self._lock = threading.Lock()
        self._failing: set[str] = set()

    def attempt(self, what: str, cost: str, write: Callable[[], None]) -> bool:
        """Run `write`; False when it raised OSError (reported: `what` cannot be written, `cost`)."""
        try:
            write()
        except OSError as e:
            with self._lock:
                self._failing.add(what)
            self.report(what, f"cannot write {what}: {e.strerror or e}; {cost}")
            return False
        with self._lock:
            was = what in self._failing
            self._failing.discard(what)
        if was:
            self.report(what, None)
        return True

    def failing(self) -> set[str]:
        with self._lock:
            return set(self._failing)
