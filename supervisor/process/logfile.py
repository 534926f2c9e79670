"""A child's output file in the volume, rotated by size so it cannot fill the volume.

    path      the current file, appended to (a restart continues it)
    path.1    the previous one ... path.KEEP the oldest; older ones are dropped

The engine's log grew forever before (issue 24: ~0.9 KB per request, over 20 GB a month at
10 requests/s). Rotation happens before the line that would cross the cap, so a file never holds
more than `max_bytes` unless one line alone is longer (a line is never split across files).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["RotatingFile"]


class RotatingFile:
    """Lines appended to `path`, rotated when it would pass `max_bytes` (None: never), `keep` old files.

    Opening raises OSError as open() does (a bad path is an error before anything starts); a write or
    rotation that fails raises OSError too: the caller stops writing then (a full disk).
    """

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int | None = None, keep: int = 3):
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError("max_bytes must be positive (or None for no cap)")
        if keep < 0:
            raise ValueError("keep must be 0 or more")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.keep = keep
        self.rotations = 0
        self._f = open(self.path, "ab", buffering=0)     # one write per line: nothing waits in a buffer
        self._size = os.fstat(self._f.fileno()).st_size

    @property
    def size(self) -> int:
        """Bytes in the current file."""
        return self._size

    def old_files(self) -> list[Path]:
        """The rotated files that exist, newest first."""
        return [p for i in range(1, self.keep + 1) if (p := self._old(i)).exists()]

    def write_line(self, line: str) -> None:
        self.write_lines([line])

    def write_lines(self, lines: list[str]) -> None:
        """The lines of one read in as few writes as the cap allows (one, unless the file rotates
        among them); a line never straddles two files, and no file passes the cap unless one line does."""
        whole = "".join(line + "\n" for line in lines).encode("utf-8", errors="replace")
        if self.max_bytes is None or self._size + len(whole) <= self.max_bytes:
            self._write(whole)                     # the usual case: it all fits
            return
        block = bytearray()
        for line in lines:
            data = (line + "\n").encode("utf-8", errors="replace")
            if self.max_bytes is not None and self._size + len(block) and \
                    self._size + len(block) + len(data) > self.max_bytes:
                self._write(block)
                block = bytearray()
                self._rotate()
            block += data
        self._write(block)

    def _write(self, block: bytes | bytearray) -> None:
        view = memoryview(block)
        while view:                                # an unbuffered write may take only part (a signal)
            n = self._f.write(view)
            if not n:
                raise OSError(f"{self.path}: a write took none of {len(view)} bytes")
            self._size += n
            view = view[n:]

    def close(self) -> None:
        self._f.close()

    def _old(self, i: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{i}")

    def _rotate(self) -> None:
        self._f.close()
        if self.keep:
            for i in range(self.keep - 1, 0, -1):       # .2 -> .3 first, so nothing is overwritten unread
                if self._old(i).exists():
                    os.replace(self._old(i), self._old(i + 1))
            os.replace(self.path, self._old(1))          # the oldest (.keep) was replaced: dropped
            self._f = open(self.path, "ab", buffering=0)
        else:
            self._f = open(self.path, "wb", buffering=0)
        self._size = 0
        self.rotations += 1
