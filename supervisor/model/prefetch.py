"""Read the model's weights into the page cache while the engine starts (issue 28, P9).

A cold worker's boot is, one after the other, Kiln's own start, the engine's exec and start-up
(vLLM: tens of seconds of Python imports) and then the model read. Kiln knows the model's files
before it execs the engine: reading them from that moment, several chunks in flight at once,
overlaps the read with everything before it; the engine then maps pages already in memory.
What it buys on the H200: docs/benchmarks.md "Time to ready from a cold worker" (P9).

Skipped, and said why on /status `prefetch`, when it cannot help or would hurt:
- llama.cpp's direct I/O (`--load-mode dio`, [startup] or a rung) bypasses the page cache: the
  file would be read twice;
- a vLLM loader of its own (`--load-format` other than auto/safetensors: a streamer, GPU direct
  storage) reads the files its own way;
- the files are larger than PREFETCH_SHARE of the memory still available (MemAvailable under the
  cgroup's headroom): the last chunks would push the first out before the engine reads them;
- `[startup] prefetch = false`.
It stops once the engine is healthy (the weights are loaded) or the boot fails. Nothing is
written; a file it cannot read is noted and left to the engine, which says why it cannot load it.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

if TYPE_CHECKING:
    from ..config import DeployConfig

CHUNK = 16 << 20            # one read: large enough that a network volume streams, small enough to stop soon
PREFETCH_SHARE = 0.8        # of the available memory the files may take
# a split GGUF's parts: llama.cpp loads every `<name>-NNNNN-of-MMMMM.gguf` beside the first
_SPLIT = re.compile(r"(?P<stem>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf")
_WEIGHTS = ("*.safetensors", "*.gguf", "*.bin", "*.pt")
_DIO_FLAGS = ("--load-mode", "-lm")
_OWN_LOADER_OK = (None, "auto", "safetensors")


def weight_files(model_path: Path) -> list[Path]:
    """The files the engine will read for this model path: a GGUF and its split parts, or the
    weights in a vLLM model's directory (the entry is its config.json, beside the weights)."""
    if model_path.suffix == ".gguf":
        m = _SPLIT.fullmatch(model_path.name)
        if m is None:
            return [model_path]
        parts = [model_path.with_name(f"{m['stem']}-{i:05d}-of-{m['n']}.gguf") for i in range(1, int(m["n"]) + 1)]
        return [p for p in parts if p.is_file()]
    root = model_path if model_path.is_dir() else model_path.parent
    for pattern in _WEIGHTS:                   # the first kind present: a repo with safetensors and .bin loads safetensors
        found = sorted(p for p in root.glob(pattern) if p.is_file())
        if found:
            return found
    return []


def _rung_flag(cfg: "DeployConfig", flags: tuple[str, ...], value: str) -> bool:
    for rung in cfg.ladder.rungs:
        args = list(rung.args)
        for i, a in enumerate(args):
            name, eq, given = a.partition("=")
            if name in flags and ((eq and given == value) or (not eq and i + 1 < len(args) and args[i + 1] == value)):
                return True
    return False


def skip_reason(cfg: "DeployConfig", engine: str) -> str | None:
    """Why this config's engine would not use a page-cache read, or None."""
    if not cfg.startup.prefetch:
        return "[startup] prefetch = false"
    if engine == "llamacpp" and (cfg.startup.load_mode == "dio" or _rung_flag(cfg, _DIO_FLAGS, "dio")):
        return "llama.cpp loads with direct I/O (--load-mode dio), which bypasses the page cache"
    if engine == "vllm" and cfg.startup.load_format not in _OWN_LOADER_OK:
        return f"vLLM's --load-format {cfg.startup.load_format} reads the files its own way"
    if engine not in ("llamacpp", "vllm"):
        return f"engine {engine} loads no model files"
    return None


class Prefetch:
    """Several reads in flight over the files, in file order (the front first: the engine reads
    from the front), each thread taking the next chunk; `to_dict()` is /status `prefetch`."""

    def __init__(self, files: Iterable[Path], *, streams: int, on_done: Callable[["Prefetch"], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.files = list(files)
        self.streams = max(1, streams)
        self.on_done = on_done
        self.clock = clock
        self.sizes = [p.stat().st_size for p in self.files]
        self.total = sum(self.sizes)
        self.read = 0
        self.state = "reading"
        self.note: str | None = None
        self.started = self.ended = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._next = (0, 0)                     # (file index, offset) of the next chunk
        self._fds: list[int | None] = []
        self._threads: list[threading.Thread] = []
        self._running = 0

    def start(self) -> "Prefetch":
        self.started = self.clock()
        for p in self.files:
            try:
                fd: int | None = os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError as e:
                fd = None
                self.note = f"{p.name}: {e.strerror or e}"
            self._fds.append(fd)
        self._running = self.streams
        for i in range(self.streams):
            t = threading.Thread(target=self._worker, name=f"kiln-prefetch-{i}", daemon=True)
            self._threads.append(t)
            t.start()
        return self

    def _take(self) -> tuple[int, int, int] | None:
        """(fd, offset, length) of the next chunk, or None when every file is taken."""
        with self._lock:
            i, off = self._next
            while i < len(self.files) and (off >= self.sizes[i] or self._fds[i] is None):
                i, off = i + 1, 0
            if i >= len(self.files):
                self._next = (i, 0)
                return None
            n = min(CHUNK, self.sizes[i] - off)
            self._next = (i, off + n)
            return self._fds[i], off, n   # type: ignore[return-value]

    def _worker(self) -> None:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        try:
            while not self._stop.is_set():
                job = self._take()
                if job is None:
                    break
                fd, off, n = job
                try:
                    got = os.preadv(fd, [view[:n]], off)     # the GIL is released while the disk works
                except OSError as e:
                    with self._lock:
                        self.note = f"read at {off}: {e.strerror or e}"
                    continue
                with self._lock:
                    self.read += got
        finally:
            self._finish()

    def _finish(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running:
                return
            self.ended = self.clock()
            self.state = "stopped" if self._stop.is_set() and self.read < self.total else "done"
            for fd in self._fds:
                if fd is not None:
                    os.close(fd)
            self._fds = [None] * len(self._fds)
        if self.on_done is not None:
            self.on_done(self)

    def stop(self) -> None:
        """Stop after the chunks in flight (at most one per stream)."""
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            end = self.ended if self.ended is not None else self.clock()
            seconds = (end - self.started) if self.started is not None else 0.0
            out: dict[str, Any] = {"state": self.state, "files": len(self.files), "bytes": self.total,
                                   "read_bytes": self.read, "streams": self.streams, "seconds": round(seconds, 3)}
            if seconds > 0 and self.read:
                out["gib_s"] = round(self.read / 2**30 / seconds, 3)
            if self.note:
                out["note"] = self.note
            return out


def plan(cfg: "DeployConfig", engine: str, model_path: Path | None, available: int) -> tuple[list[Path], str | None]:
    """(the files to read, None) or ([], why not)."""
    why = skip_reason(cfg, engine)
    if why:
        return [], why
    if model_path is None:
        return [], "the model is not local yet"
    files = weight_files(model_path)
    if not files:
        return [], f"no weight files found for {model_path}"
    total = sum(p.stat().st_size for p in files)
    if total > PREFETCH_SHARE * available:
        return [], (f"the weights ({total / 2**30:.1f} GiB) are larger than {PREFETCH_SHARE:.0%} of the "
                    f"memory available ({available / 2**30:.1f} GiB): read ahead, the last would push out the first")
    return files, None
