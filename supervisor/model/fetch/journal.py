"""The sidecar of a partial: which of its segments are finished, and the CRC-32 of each as it arrived.

    blobs/<blob>.incomplete.journal, append-only text:
        kiln-journal 1 <blob> <size> <segment bytes>
        <index> <crc32 hex>        a segment finished: its bytes are on disk (fdatasync'd first)
        -<index>                   a segment dropped: its bytes on disk were not what arrived

A segment is recorded only after its bytes were flushed to the partial, so after a SIGKILL, a cut
connection, a restarted container or a crashed host the journal never claims bytes the disk does
not hold; what it loses is at most the segments that were in flight. A torn last line (killed
mid-write) is ignored. A journal whose header names another blob, size or layout, or whose partial
is gone, is not trusted: the file starts over.

The CRC is no content check (the Hub's sha256 is, hashing.py): it tells, when the partial is read
back to be hashed, whether the disk still holds what arrived, so a segment that rotted or was
overwritten is fetched again alone.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

MAGIC = "kiln-journal 1"


class SegmentJournal:
    def __init__(self, path: Path, blob: str, size: int, seg: int, done: dict[int, int]):
        self.path, self.blob, self.size, self.seg = path, blob, size, seg
        self.done = done                     # segment index -> CRC-32 of its bytes as they arrived
        self._lock = threading.Lock()
        self._fd: int | None = None

    @classmethod
    def open(cls, path: Path, blob: str, size: int, seg: int, partial: Path) -> "SegmentJournal":
        """The journal of this partial if it can be trusted, else a new one (and the caller starts over)."""
        found = cls.load(path, blob, size, partial)
        if found is not None:
            return found
        journal = cls(path, blob, size, seg, {})
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(f"{MAGIC} {blob} {size} {seg}\n", encoding="ascii")
        os.replace(tmp, path)
        return journal

    @classmethod
    def load(cls, path: Path, blob: str, size: int, partial: Path) -> "SegmentJournal | None":
        """The journal at `path` if it describes this partial, else None."""
        try:
            lines = path.read_text(encoding="ascii", errors="replace").split("\n")
            if partial.stat().st_size != size:
                return None
        except OSError:
            return None
        head = lines[0].split(" ")
        if len(head) != 5 or " ".join(head[:2]) != MAGIC or head[2] != blob or head[3] != str(size):
            return None
        try:
            seg = int(head[4])
        except ValueError:
            return None
        if seg <= 0:
            return None
        count = -(-size // seg)
        done: dict[int, int] = {}
        for line in lines[1:-1]:         # the last element is "" or a torn line: ignored either way
            parts = line.split(" ")
            try:
                if len(parts) == 1 and parts[0].startswith("-"):
                    done.pop(int(parts[0][1:]), None)
                elif len(parts) == 2 and 0 <= int(parts[0]) < count:
                    done[int(parts[0])] = int(parts[1], 16)
            except ValueError:
                continue
        return cls(path, blob, size, seg, done)

    def finished(self, index: int, crc: int) -> None:
        self._append(f"{index} {crc:08x}\n", lambda: self.done.__setitem__(index, crc))

    def dropped(self, index: int) -> None:
        self._append(f"-{index}\n", lambda: self.done.pop(index, None))

    def _append(self, line: str, apply) -> None:
        with self._lock:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            os.write(self._fd, line.encode("ascii"))   # one write per line: O_APPEND keeps lines whole
            apply()

    def done_bytes(self) -> int:
        with self._lock:
            return sum(min(self.seg, self.size - i * self.seg) for i in self.done)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
