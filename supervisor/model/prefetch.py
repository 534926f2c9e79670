"""Read the model's weights into the page cache while the engine starts (issue 28, P9).

A cold worker's boot is, one after the other, Kiln's own start, the engine's exec and start-up
(vLLM: tens of seconds of Python imports) and then the model read. Kiln knows the model's files
before it execs the engine: reading them from that moment (preflight, for a local model; the launch
check, for a fetched one) overlaps the read with everything before the engine's; the engine then maps
pages already in memory. By default (`[startup] prefetch_at = "start"`) it begins as soon as PID 1
has read the config (`begin`), before the loop's imports: they then queue behind its reads from a
cold disk (0.37 -> 0.73 s on the H200), but the disk is busy from the first moment, and with
llama.cpp's `--load-mode none` following its front the boot was shorter (docs/benchmarks.md P9,
2026-12-02). `prefetch_at = "preflight"` starts it in the loop, after the GPU probe.
What it buys on the H200: docs/research/benchmarks-history.md "Time to ready from a cold worker" (P9).

Skipped, and said why on /status `prefetch`, when it cannot help or would hurt:
- llama.cpp's direct I/O (`--load-mode dio`, [startup] or a rung) bypasses the page cache: the
  file would be read twice;
- a vLLM loader of its own (`--load-format` other than auto/safetensors: a streamer, GPU direct
  storage) reads the files its own way;
- the files are larger than PREFETCH_SHARE of the memory still available (MemAvailable under the
  cgroup's headroom): the last chunks would push the first out before the engine reads them;
- `[startup] prefetch = false`.
A chunk already in the page cache is counted and not copied again (`_resident`). It stops once the
engine is healthy (the weights are loaded) or the boot fails. Nothing is
written; a file it cannot read is noted and left to the engine, which says why it cannot load it.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

if TYPE_CHECKING:
    from ..config import DeployConfig

CHUNK = 16 << 20            # one read: large enough that a network volume streams, small enough to stop soon
# a read that returns only what is in the page cache (EAGAIN otherwise): a chunk found there is not
# copied again. On a warm page cache the copy of every chunk only competed with the engine's own
# read (issue 38, 2026-12-05: Kiln's warm boot 0.2 s longer in the weights phase than the engine's)
_NOWAIT = getattr(os, "RWF_NOWAIT", None)
PREFETCH_SHARE = 0.8        # of the available memory the files may take
# a split GGUF's parts: llama.cpp loads every `<name>-NNNNN-of-MMMMM.gguf` beside the first
_SPLIT = re.compile(r"(?P<stem>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf")
_WEIGHTS = ("*.safetensors", "*.gguf", "*.bin", "*.pt")
_DIO_FLAGS = ("--load-mode", "-lm")
# vLLM loaders that read the files with ordinary reads or maps (a streamer, GPU direct storage or a
# tensorizer do their own I/O)
_PAGE_CACHE_LOADERS = (None, "auto", "safetensors", "pt", "npcache", "gguf", "bitsandbytes", "mistral")


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


def _last_value(args: list[str], names: tuple[str, ...]) -> str | None:
    """The value the engine will use for this flag: the last one given (`--flag v` or `--flag=v`)."""
    out = None
    for i, a in enumerate(args):
        name, eq, given = a.partition("=")
        if name in names:
            out = given if eq else (args[i + 1] if i + 1 < len(args) else None)
    return out


def _in_force(cfg: "DeployConfig", rung: Any, names: tuple[str, ...], lever: Any, env_var: str | None,
              env: Mapping[str, str]) -> str | None:
    """What a rung's engine gets for one setting: its own flag (extra_args, then the rung's args: the
    last wins), else the [startup] lever (added as that flag), else the engine's env variable (the
    rung's over the pod's) -- the order the engines read them in."""
    given = _last_value([*cfg.server.extra_args, *rung.args], names)
    if given is not None:
        return given
    if lever is not None:
        return str(lever)
    return {**env, **rung.env}.get(env_var) if env_var else None


def skip_reason(cfg: "DeployConfig", engine: str, env: Mapping[str, str] | None = None) -> str | None:
    """Why this config's engine would not read the weights through the page cache on some rung, or
    None. Any rung: the prefetch starts before the walk knows which rung will serve."""
    env = env or {}
    if not cfg.startup.prefetch:
        return "[startup] prefetch = false"
    if engine not in ("llamacpp", "vllm"):
        return f"engine {engine} loads no model files"
    for rung in cfg.ladder.rungs:
        if engine == "llamacpp":
            mode = _in_force(cfg, rung, _DIO_FLAGS, cfg.startup.load_mode, "LLAMA_ARG_LOAD_MODE", env)
            if mode == "dio":
                return (f"llama.cpp loads with direct I/O (--load-mode dio) on rung {rung.name}, "
                        "which bypasses the page cache")
        else:
            fmt = _in_force(cfg, rung, ("--load-format",), cfg.startup.load_format, None, env)
            if fmt not in _PAGE_CACHE_LOADERS:
                return f"vLLM's --load-format {fmt} (rung {rung.name}) reads the files its own way"
    return None


class Prefetch:
    """Several reads in flight over the files, in file order (the front first: the engine reads
    from the front), each thread taking the next chunk; `to_dict()` is /status `prefetch`.
    `sizes` are the files' sizes as planned (a file that is shorter by the time it is read is noted)."""

    def __init__(self, files: Iterable[Path], *, streams: int, sizes: Iterable[int] | None = None,
                 on_done: Callable[["Prefetch"], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.files = list(files)
        self.streams = max(1, streams)
        self.on_done = on_done
        self.clock = clock
        self.sizes = list(sizes) if sizes is not None else [p.stat().st_size for p in self.files]
        self.total = sum(self.sizes)
        self.read = 0
        self.resident = 0                       # of `read`: found in the page cache, not copied
        self.state = "reading"
        self.note: str | None = None
        self.started = self.ended = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._next = (0, 0)                     # (file index, offset) of the next chunk
        self._fds: list[int | None] = []
        self._threads: list[threading.Thread] = []
        self._running = 0
        self._finished = False                  # _finish ran: an on_done handed over later is called at once
        self.widened_s: float | None = None     # when widen() added streams, seconds after start()

    @property
    def active(self) -> bool:
        """Reading, and not told to stop."""
        return self.state == "reading" and not self._stop.is_set()

    @property
    def useful(self) -> bool:
        """Reading, or read whole: not stopped short (a launch can count on it, a re-plan keep it)."""
        return self.active or self.state == "done"

    def start(self) -> "Prefetch":
        self.started = self.clock()
        for p in self.files:
            try:
                fd: int | None = os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError as e:
                fd = None
                self.note = f"{p.name}: {e.strerror or e}"
            self._fds.append(fd)
        self._running = self.streams            # before any starts: a fast stream must not end it alone
        self._spawn(0, self.streams)
        return self

    def widen(self, streams: int) -> bool:
        """More reads in flight from now on (`[startup] prefetch_widen_to`: once the engine's own start
        no longer needs the disk). False when it is not reading any more or has that many already."""
        with self._lock:
            if self.started is None or self._finished or self._stop.is_set() or streams <= self.streams:
                return False            # not started (start() counts its own streams), ended, or as wide
            first, self.streams = self.streams, streams
            self._running += streams - first    # under the lock: a stream ending now cannot end it all
            self.widened_s = round(self.clock() - self.started, 3)
        self._spawn(first, streams)
        return True

    def _spawn(self, first: int, last: int) -> None:
        """Streams first..last-1, each counted in _running already."""
        for i in range(first, last):
            t = threading.Thread(target=self._worker, name=f"kiln-prefetch-{i}", daemon=True)
            try:
                t.start()
            except RuntimeError as e:           # no thread to be had (a pids limit): read with fewer
                self.note = f"{i} of {last} streams started: {e}"
                if i == 0:
                    self._stop.set()
                for _ in range(last - i):
                    self._finish()              # each stream that never ran ends here, the last one ends it all
                break
            self._threads.append(t)

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
        try:
            view, probe = memoryview(bytearray(CHUNK)), bytearray(1)
            while not self._stop.is_set():
                job = self._take()
                if job is None:
                    break
                fd, off, n = job
                if _resident(fd, off, n, probe):
                    with self._lock:
                        self.read += n
                        self.resident += n
                    continue
                try:
                    got = os.preadv(fd, [view[:n]], off)     # the GIL is released while the disk works
                except OSError as e:
                    with self._lock:
                        self.note = f"read at {off}: {e.strerror or e}"
                    continue
                with self._lock:
                    self.read += got
                    if got < n:
                        self.note = f"a file ended {n - got} bytes early at {off + got}: it changed since it was planned"
        except Exception as e:                  # MemoryError for the buffer, say: this stream ends, the rest go on
            with self._lock:
                self.note = f"a stream stopped: {type(e).__name__}: {e}"
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
            self._finished = True
            on_done = self.on_done
        self._call(on_done)

    def _call(self, on_done: Callable[["Prefetch"], None] | None) -> None:
        if on_done is not None:
            try:
                on_done(self)
            except Exception:                   # the caller's record of it: never the reader's concern
                pass

    def adopt(self, on_done: Callable[["Prefetch"], None]) -> None:
        """Hand a running prefetch (begin()'s, started before the loop existed) its on_done: called
        once, when it ends, or now if it has ended already."""
        with self._lock:
            self.on_done = on_done
            ended = self._finished
        if ended:
            self._call(on_done)

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
                                   "read_bytes": self.read, "resident_bytes": self.resident,
                                   "streams": self.streams, "seconds": round(seconds, 3)}
            if seconds > 0 and self.read > self.resident:     # the rate of what came off the disk or was copied
                out["gib_s"] = round((self.read - self.resident) / 2**30 / seconds, 3)
            if self.widened_s is not None:
                out["widened_s"] = self.widened_s
            if self.note:
                out["note"] = self.note
            return out


def _resident(fd: int, off: int, n: int, probe: bytearray) -> bool:
    """Whether a chunk is in the page cache already, by a one-byte read that does not wait for the
    disk at its start, middle and end (a sample: a page missing between them the engine reads
    itself). The first probe of a cold chunk fails at once; the kernel's readahead it starts is for
    the bytes the read that follows asks for anyway. False where the filesystem cannot say."""
    if _NOWAIT is None:
        return False
    for at in (off, off + n // 2, off + n - 1):
        try:
            if os.preadv(fd, [probe], at, _NOWAIT) < 1:
                return False
        except OSError:                         # EAGAIN: not in memory; EOPNOTSUPP: cannot tell
            return False
    return True


def begin(cfg: "DeployConfig", env: Mapping[str, str]) -> "Prefetch | None":
    """`[startup] prefetch_at = "start"` (the default): the prefetch started as soon as PID 1 has read
    the config, before the loop is imported and built (~0.3 s of a cold boot on the H200 went by
    before preflight started it). A local model only, by the same plan; the loop adopts it if its
    own plan at preflight names the same files. None when not asked for, nothing to read or anything
    goes wrong: the loop then plans at preflight and says why on /status. Never raises: PID 1's
    first step."""
    if cfg.startup.prefetch_at != "start":
        return None
    try:
        from ..host import hardware
        from . import resolve

        path = resolve.resolve(cfg)             # None for hf://: the fetch finds it later
        if path is None:
            return None
        planned, why = plan(cfg, cfg.engine, path, hardware.ram_available_bytes(), env)
        if why or not planned:
            return None
        return Prefetch([f for f, _ in planned], sizes=[n for _, n in planned],
                        streams=cfg.startup.prefetch_streams).start()
    except Exception:                           # a missing model, a vanished file, no thread to be had
        return None


def plan(cfg: "DeployConfig", engine: str, model_path: Path | None, available: int,
         env: Mapping[str, str] | None = None) -> tuple[list[tuple[Path, int]], str | None]:
    """([(file, size)], None) to read, or ([], why not). Raises OSError when a file cannot be listed."""
    why = skip_reason(cfg, engine, env)
    if why:
        return [], why
    if model_path is None:
        return [], "the model is not local yet"
    files = [(p, p.stat().st_size) for p in weight_files(model_path)]
    if not files:
        return [], f"no weight files found for {model_path}"
    total = sum(n for _, n in files)
    # each stream's read buffer is memory too, the widened ones' as well
    buffers = max(cfg.startup.prefetch_streams, cfg.startup.prefetch_widen_to) * CHUNK
    if total + buffers > PREFETCH_SHARE * available:
        return [], (f"the weights ({total / 2**30:.1f} GiB) are larger than {PREFETCH_SHARE:.0%} of the "
                    f"memory available ({available / 2**30:.1f} GiB): read ahead, the last would push out the first")
    return files, None
