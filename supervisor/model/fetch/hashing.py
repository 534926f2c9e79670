"""The content check, run while a file downloads: its segments are hashed in order as they land.

One Verifier thread per file being fetched. Segments finish out of order (many connections); the
verifier feeds the file's hash with segment 0, 1, 2, ... as each becomes available, reading it
back from the partial (it was just written, so it comes from the page cache), so the file is
verified a moment after its last byte instead of minutes later (181 GiB is minutes on one core).

On the way it checks each segment against the CRC-32 the journal recorded as it arrived: a
segment whose bytes on disk are not what arrived (a disk that rotted, a partial overwritten while
we were stopped) is dropped and fetched again, alone; the hash state is rewound to before it.

What a final mismatch means: every segment read back as it arrived, so the bytes that arrived
were wrong. The Hub publishes one sha256 per file, nothing finer, so nothing can say which
segment was wrong: the whole file is discarded (download.py fetches it once more, then gives up
naming the file). That is the finest "only what it must" the Hub's checksums allow.

The hash is the one the Hub names the blob by: sha256 for LFS (and Xet) files, git's blob sha1
("blob <size>\\0" + content) for regular ones. A restarted fetch re-reads the segments already on
disk to rebuild the hash (hashlib cannot save its state); that reading is counted as progress.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import zlib
from typing import Any, Callable

from .journal import SegmentJournal

READ = 8 << 20


class Meter:
    """A byte counter several threads add to; `last` is when it last moved (monotonic)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0
        self.last = 0.0

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n
            self.last = time.monotonic()


def content_hash(blob: str, size: int) -> Any | None:
    """A hashlib object for the digest the blob is named by, or None (an ETag that is no known hash)."""
    if len(blob) == 64:
        return hashlib.sha256()
    if len(blob) == 40:
        return hashlib.sha1(b"blob %d\0" % size)
    return None


class Verifier:
    def __init__(self, fd: int, journal: SegmentJournal, hashed: Meter, on_corrupt: Callable[[int], None],
                 on_done: Callable[[bool, str], None], on_error: Callable[[BaseException], None]):
        self.fd, self.journal, self.hashed = fd, journal, hashed
        self.on_corrupt, self.on_done, self.on_error = on_corrupt, on_done, on_error
        self.count = -(-journal.size // journal.seg) if journal.size else 0
        self._ready: set[int] = set(journal.done)      # finished segments not hashed yet
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"verify-{journal.blob[:8]}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def landed(self, index: int) -> None:
        with self._cond:
            self._ready.add(index)
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        try:
            self._verify()
        except BaseException as e:  # noqa: BLE001 - a disk that cannot be read back: the fetch must end, not hang
            self.on_error(e)

    def _verify(self) -> None:
        h = content_hash(self.journal.blob, self.journal.size)
        i = 0
        while i < self.count:
            with self._cond:
                while i not in self._ready and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                self._ready.discard(i)
            saved = h.copy() if h is not None else None
            if self._read_back(i, h):
                i += 1
            else:
                h = saved
                self.journal.dropped(i)
                self.on_corrupt(i)
        if h is None:
            self.on_done(True, "")
            return
        actual = h.hexdigest()
        self.on_done(actual == self.journal.blob, actual)

    def _read_back(self, i: int, h: Any | None) -> bool:
        """Hash segment i from disk; False if the disk does not hold what arrived (its CRC differs)."""
        seg, size = self.journal.seg, self.journal.size
        pos, end, crc = i * seg, min((i + 1) * seg, size), 0
        while pos < end:
            block = os.pread(self.fd, min(READ, end - pos), pos)
            if not block:
                return False
            crc = zlib.crc32(block, crc)
            if h is not None:
                h.update(block)
            pos += len(block)
            self.hashed.add(len(block))
        return crc == self.journal.done.get(i)
