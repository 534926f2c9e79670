"""Where one segment's bytes go: their own place in the partial, and not one byte further.

Both sources (HTTP ranges through huggingface_hub's `http_get`, Xet through hf_xet's streams)
write into a Sink, which `http_get` takes for the file object it writes to. It writes at the
segment's offset (pwrite: many connections share one file descriptor), counts every byte (the
stall deadline and /status see them), keeps the CRC-32 the journal records, and refuses what a
server sends beyond the range it was asked for: a server that ignored the Range header would
otherwise write the start of the file over the middle of it.
"""

from __future__ import annotations

import os
import zlib

from ...errors import FetchError
from .hashing import Meter


class RangeIgnored(FetchError):
    """The server sent more than the range asked for, or tried to rewind it: it ignored Range."""


class Sink:
    def __init__(self, fd: int, start: int, end: int, received: Meter):
        self.fd, self.start, self.end, self.received = fd, start, end, received
        self.pos = 0          # bytes of this segment written so far
        self.crc = 0          # CRC-32 of those bytes

    @property
    def next(self) -> int:
        """The file offset of the next byte this segment needs."""
        return self.start + self.pos

    @property
    def full(self) -> bool:
        return self.next == self.end

    def write(self, data: bytes) -> int:
        n = len(data)
        if self.next + n > self.end:
            raise RangeIgnored(f"got {self.next + n - self.start} bytes for a {self.end - self.start}-byte range")
        view, off = memoryview(data), 0
        while off < n:
            off += os.pwrite(self.fd, view[off:], self.next + off)
        self.crc = zlib.crc32(data, self.crc)
        self.pos += n
        self.received.add(n)
        return n

    def tell(self) -> int:
        return self.pos

    def seek(self, *_: object) -> int:
        # http_get rewinds only when a resumed request came back 200 (the whole file), not 206.
        raise RangeIgnored("the server answered a range request with the whole file")

    truncate = seek
