#!/usr/bin/env python3
"""How fast Kiln's model prefetch (supervisor/model/prefetch.py) reads a cold file, against one
sequential read of the same file in the same run (bench/gpu.py read_once, P9's denominator).

    python3 bench/prefetch_read.py [--file PATH | --gib 2 --dir DIR] [--streams 1,2,4,8,16] [--repeat 3]

Before every read the file alone is evicted from the page cache (posix_fadvise DONTNEED after a
sync: no system-wide drop, so it can run on a shared machine), and its resident share is measured
with mincore(2) and printed: a read that did not start cold says so. Per stream count:

  prefetch_over_read[streams=N]=   the prefetch's median seconds / the sequential read's median
                                   (< 1: the prefetch reads this disk faster than one stream)
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import mmap
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from gpu import read_once  # noqa: E402
from supervisor.model.prefetch import Prefetch  # noqa: E402

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def resident_share(path: Path) -> float:
    """The share of the file's pages in the page cache (mincore(2) over a read-only mapping)."""
    size = path.stat().st_size
    if size == 0:
        return 1.0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = ctypes.create_string_buffer(pages)
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            return sum(b & 1 for b in vec.raw) / pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def evict(path: Path) -> float:
    """Drop this file's pages from the page cache; the share still resident after."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return resident_share(path)


def make(path: Path, gib: float) -> None:
    """A file of random bytes (not zeros: a filesystem may store those sparsely)."""
    block = os.urandom(16 << 20)
    left = int(gib * 2**30)
    with open(path, "wb") as f:
        while left > 0:
            f.write(block[:left])
            left -= len(block)


def timed_prefetch(path: Path, streams: int) -> float:
    t0 = time.monotonic()
    p = Prefetch([path], streams=streams).start()
    p.wait()
    if p.read != p.total:
        raise SystemExit(f"the prefetch read {p.read} of {p.total} bytes: {p.note}")
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", type=Path, help="an existing file (a model) to read; left as it is")
    ap.add_argument("--gib", type=float, default=2.0, help="size of the file made when --file is not given")
    ap.add_argument("--dir", type=Path, default=Path("/tmp"), help="where the made file goes (removed after)")
    ap.add_argument("--streams", default="1,2,4,8,16", help="stream counts to measure, comma-separated")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    try:
        streams = [int(s) for s in a.streams.split(",")]
    except ValueError:
        raise SystemExit(f"--streams {a.streams!r}: comma-separated integers, e.g. 1,4,8") from None
    if not streams or min(streams) < 1 or a.repeat < 1:
        raise SystemExit("--streams: each at least 1; --repeat: at least 1")
    made = a.file is None
    path = a.file or a.dir / f"kiln-prefetch-bench-{os.getpid()}.bin"
    if made:
        print(f"making {a.gib} GiB at {path}", flush=True)
        make(path, a.gib)
    try:
        size = path.stat().st_size
        runs: dict[str, list[float]] = {}
        for _ in range(a.repeat):      # interleaved: a disk that slows down over the run slows every kind
            for kind in ["read", *(f"streams={n}" for n in streams)]:
                left = evict(path)
                secs = read_once(path) if kind == "read" else timed_prefetch(path, int(kind.split("=")[1]))
                runs.setdefault(kind, []).append(secs)
                print(f"  {kind:12} {secs:7.3f} s  {size / 2**30 / secs:6.2f} GiB/s  (resident before: {left:.1%})",
                      flush=True)
        base = statistics.median(runs["read"])
        print(f"file {path} {size / 2**30:.2f} GiB; sequential read median {base:.3f} s over {a.repeat}")
        for kind, secs in runs.items():
            if kind != "read":
                print(f"prefetch_over_read[{kind}]={statistics.median(secs) / base:.3f}   "
                      f"(median {statistics.median(secs):.3f} s, spread {min(secs):.3f}-{max(secs):.3f})")
    finally:
        if made:
            path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
