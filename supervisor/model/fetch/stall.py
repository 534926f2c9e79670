"""How long a download has moved nothing, counted in time the watching process could run; and
whether another worker's download, holding the volume's lock, still moves.

    StallClock     seconds without progress. Looked at every few tenths of a second; a gap between two
                   looks far longer than that (STOPPED_GAP_S) is time this process did not run —
                   SIGSTOP, a frozen container, a suspended host — and counts as one look's worth.
                   time.monotonic() alone counts the stopped time: a holder thawed after a minute
                   failed its own healthy download at once (issue 37, item 15).
    HolderWatch    a waiter's view of the holder: the bytes under the repo's blobs/ (partials filled
                   in place, journals growing, partials renamed to blobs) and the progress the holder
                   notes in the lock file (hashing moves nothing on the disk). A holder that changes
                   neither for the stall window is taken over (parent.py).

Why not the process's CPU time: a download waiting on a slow network uses almost none, and a stalled
holder on another host has none this process could read.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

from .layout import storage

__all__ = ["STOPPED_GAP_S", "StallClock", "HolderWatch"]

STOPPED_GAP_S = 5.0      # a gap between two looks longer than this was time this process did not run


class StallClock:
    """Seconds without progress in time this process could run; `look()` once per loop turn."""

    def __init__(self, interval: float, now: Callable[[], float] = time.monotonic):
        self.interval = interval
        self.now = now
        self.idle = 0.0
        self.discounted = 0.0         # stopped time left out so far (shown, so a reader can tell)
        self._last = now()

    def look(self, progressed: bool = False) -> float:
        t = self.now()
        gap, self._last = t - self._last, t
        if gap > STOPPED_GAP_S:
            self.discounted += gap - self.interval
            gap = self.interval
        self.idle = 0.0 if progressed else self.idle + gap
        return self.idle


class HolderWatch:
    """Whether the worker holding the lock for `repo` moved anything on the volume for `stall_s`."""

    def __init__(self, cache: Path, repo: str, stall_s: float, interval: float,
                 held_by: Callable[[], dict[str, Any] | None], now: Callable[[], float] = time.monotonic):
        self.blobs = storage(cache, repo) / "blobs"
        self.stall_s = stall_s
        self.held_by = held_by
        self.clock = StallClock(interval, now)
        self._seen: tuple[Any, ...] | None = None

    def watch(self, held_by: Callable[[], dict[str, Any] | None]) -> None:
        """Judge another holder from now on (a waiter that took over first): its window starts afresh."""
        self.held_by = held_by
        self.clock = StallClock(self.clock.interval, self.clock.now)
        self._seen = None

    def signature(self) -> tuple[Any, ...]:
        """What changes while a download moves: the blobs' allocated and apparent bytes, their names
        (a partial renamed to its blob), and the holder's own note of its progress."""
        files = []
        try:
            with os.scandir(self.blobs) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    files.append((e.name, st.st_blocks, st.st_size))
        except OSError:
            pass
        held = self.held_by() or {}
        return tuple(sorted(files)), held.get("moved"), held.get("pid"), held.get("since")

    def stalled(self) -> bool:
        """Looked at once per wait turn: True once the holder moved nothing for the stall window."""
        sig = self.signature()
        idle = self.clock.look(progressed=sig != self._seen)
        self._seen = sig
        return idle >= self.stall_s
