"""The data model of a Xet CAS (content-addressed storage), for the Hub stand-in (hubserver.py).

It stands for Hugging Face's Xet storage service (cas-server.xethub.hf.co) as the real ``hf_xet``
client (1.8.0) downloads from it: the wire formats below were read from xet-core's source
(github.com/huggingface/xet-core: ``xet_client/src/cas_types/mod.rs`` for the reconstruction JSON,
``xet_core_structures/src/xorb_object/xorb_chunk_format.rs`` for the chunk framing,
``xet_client/src/cas_client/remote_client.rs`` for the V2-then-V1 reconstruction query and the
ranged xorb fetch) and are exercised with the installed client by tests/integration/test_hubserver.py.

How the real service stores a file: content-defined chunks (~64 KiB) packed into xorbs (up to
64 MiB, 1024 chunks); a file is a list of *terms* (xorb hash, chunk range). A download asks
``GET {cas}/v2/reconstructions/{file_hash}`` (``Range: bytes=a-b`` for part of the file) and gets
the terms plus a presigned URL and byte range per xorb; it then GETs those ranges, each a run of
chunks framed by an 8-byte header (version 0, 3-byte LE compressed length, compression scheme,
3-byte LE uncompressed length), and stitches the file together.

What this stand-in simplifies, none of which the download protocol can see:

* Chunks are fixed-size (64 KiB) slices of the file, not content-defined; xorbs hold 1024 of them;
  nothing is deduplicated across files; chunks are stored uncompressed (scheme 0, which the client
  must accept: ``serialize_chunk`` falls back to it whenever compression does not pay).
* Hashes are names, not Merkle hashes: the file's Xet hash and each xorb's hash are derived from
  the file's sha256. ``hf_xet`` does not verify chunk or file hashes on download (only lengths),
  so it cannot tell; Kiln verifies the sha256 the Hub lists for the file, as it does for every file.
* Xorb bytes are generated on the fly from the file itself, so a file costs no second copy.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

CHUNK = 64 * 1024            # xet-core TARGET_CHUNK_SIZE
CHUNKS_PER_XORB = 1024       # 64 MiB of chunks per xorb: xet-core MAX_XORB_BYTES
HEADER = 8                   # XorbChunkHeader: u8 version, [u8; 3] compressed, u8 scheme, [u8; 3] uncompressed
SCHEME_NONE = 0


def file_hash(sha256: str) -> str:
    """The file's Xet hash as the Hub lists it (tree ``xetHash``, ``X-Xet-Hash``): 64 hex."""
    return hashlib.sha256(b"kiln-standin-xet-file:" + sha256.encode()).hexdigest()


def xorb_hash(sha256: str, k: int) -> str:
    return hashlib.sha256(b"kiln-standin-xorb:%s:%d" % (sha256.encode(), k)).hexdigest()


def _header(length: int) -> bytes:
    n = length.to_bytes(3, "little")
    return bytes([0]) + n + bytes([SCHEME_NONE]) + n


def reconstruction(sha256: str, size: int, first: int, last: int, url_for: Callable[[int], str]) -> dict[str, Any]:
    """QueryReconstructionResponseV2 for bytes first..last (inclusive) of the file."""
    first_chunk, last_chunk = first // CHUNK, last // CHUNK
    terms: list[dict[str, Any]] = []
    xorbs: dict[str, list[dict[str, Any]]] = {}
    for k in range(first_chunk // CHUNKS_PER_XORB, last_chunk // CHUNKS_PER_XORB + 1):
        base = k * CHUNKS_PER_XORB
        c0, c1 = max(first_chunk, base) - base, min(last_chunk + 1, base + CHUNKS_PER_XORB) - base
        unpacked = min((base + c1) * CHUNK, size) - (base + c0) * CHUNK
        start = c0 * (HEADER + CHUNK)
        name = xorb_hash(sha256, k)
        terms.append({"hash": name, "unpacked_length": unpacked, "range": {"start": c0, "end": c1}})
        xorbs[name] = [{"url": url_for(k), "ranges": [{"chunks": {"start": c0, "end": c1},
                                                      "bytes": {"start": start,
                                                                "end": start + (c1 - c0) * HEADER + unpacked - 1}}]}]
    return {"offset_into_first_range": first - first_chunk * CHUNK, "terms": terms, "xorbs": xorbs}


def xorb_length(size: int, k: int) -> int:
    """Serialized length of xorb k of a file of `size` bytes."""
    base = k * CHUNKS_PER_XORB
    n = min(CHUNKS_PER_XORB, -(-size // CHUNK) - base)
    return n * HEADER + min((base + n) * CHUNK, size) - base * CHUNK


def xorb_bytes(path: Path, size: int, k: int, start: int, end: int) -> Iterator[bytes]:
    """Bytes start..end (inclusive) of xorb k, framed chunk by chunk, read from the file at `path`."""
    step = HEADER + CHUNK
    fd = os.open(path, os.O_RDONLY)
    try:
        for j in range(start // step, end // step + 1):
            g = k * CHUNKS_PER_XORB + j
            data = os.pread(fd, min(CHUNK, size - g * CHUNK), g * CHUNK)
            framed = _header(len(data)) + data
            lo, hi = max(start - j * step, 0), min(end - j * step + 1, len(framed))
            if lo < hi:
                yield framed[lo:hi]
    finally:
        os.close(fd)
