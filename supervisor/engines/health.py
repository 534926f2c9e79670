"""Wait for a launched server to become healthy, racing everything that can end the wait.

Three things race (llama-swap's `doStart` shape): the server answering
`/health` 200 — from a socket our engine's process tree owns, so a foreign listener on the port
is never taken for our engine —, the server exiting (its stderr tail is how an OOM is
recognised), and a shutdown request. The deadline is progress-based: it moves
while the server shows life — new output, bytes read, resident memory grown
(weights read through mmap show only there; allocations too), CPU time — and fires on a
stall, not after a fixed total. A 181 GiB model takes minutes to load and a
deadlocked NCCL init takes forever; only progress tells them apart.
(llama-server prints nothing while loading at its default verbosity, so the
counters carry most of the signal.)

CPU time alone is not enough for long: a hung NCCL start-up busy-spins a core
without printing, reading or touching memory, and counted as loading forever
(issue 24). CPU counts as progress only within `stall_s` of the last output,
read or memory growth; after that it is a spin, and the stall fires one
`stall_s` later, saying so. A real load reads the weights (read(), or mmap:
resident memory grows) or prints; a CPU-only phase of its own (a repack, the
copy of already-mapped weights to the GPU) is shorter than the bound.
"""

from __future__ import annotations

import http.client
import logging
import re
import time
from dataclasses import dataclass
from typing import Callable

import psutil

from ..process.managed import ManagedProcess

log = logging.getLogger("kiln")

# Poll fast at first (small models are ready in tens of ms), then settle; between polls the wait
# wakes on the engine's output (llama-server says it listens as /health turns 200: waking on that
# line, not the next 0.1 s poll, took ~0.05 s off a cold boot on the H200, P9), and polls fast for
# a moment after it, in case the line comes a hair before the server answers.
FAST_POLL_S = 0.01
FAST_PHASE_S = 2.0
AFTER_OUTPUT_S = 0.5
WAKE_SLICE_S = 0.05        # a long poll_s still notices a stop request this often
CATCH_UP_S = 0.2           # once healthy, the wait for the reader to hand on the lines already written
CPU_PROGRESS_S = 0.05      # CPU seconds that count as "doing something"...
# ... and only at this share of one core or more since the last look. A spin or a CPU-only phase runs
# a core flat out; a sleeping process can be charged a little CPU for each wake-up (on the CPU
# machine's VM, 2026-12-02, ~0.5 % of a core per timed waiter), which summed across looks had a hung,
# idle engine reported as a busy spin ("the engine kept a CPU busy").
CPU_BUSY_SHARE = 0.2
CPU_WINDOW_S = 1.0         # the share is taken over this long at most (looks come every poll_s)
IO_PROGRESS_BYTES = 1 << 20
RSS_PROGRESS_BYTES = 1 << 20   # resident memory grown: weights mapped in (an mmap read) or allocated


@dataclass(frozen=True)
class HealthOutcome:
    ready: bool
    exited: bool = False
    stalled: bool = False
    stopped: bool = False
    elapsed_s: float = 0.0
    returncode: int | None = None
    reason: str | None = None         # why the wait was ended as a stall, naming the setting that ended it


def probe_health(host: str, port: int, timeout: float = 1.0) -> int | None:
    """HTTP status of GET /health, or None when nothing answers."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def owns_port(proc: ManagedProcess, port: int) -> bool:
    """A process of the engine's tree listens on `port` (psutil): the answer came from our engine."""
    for pid in proc.tree_pids():
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except (psutil.Error, OSError):
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns):
            return True
    return False


class ProgressMeter:
    """Notices whether a process tree did anything since the last look. Output, reads and memory growth
    are evidence of work; CPU time counts only within `cpu_alone_s` of the last evidence (None: always)."""

    def __init__(self, proc: ManagedProcess, cpu_alone_s: float | None = None):
        self.proc = proc
        self.cpu_alone_s = cpu_alone_s
        self.spinning = False          # the last look saw CPU time and nothing else, past the bound
        self.evidence_at = time.monotonic()     # when output, a read or memory growth was last seen
        self._cpu, self._io, self._rss = self._counters()
        self._cpu_at = self.evidence_at
        self._out = proc.last_output_at()

    def _counters(self) -> tuple[float, int, int]:
        cpu, io, rss = 0.0, 0, 0
        for pid in self.proc.tree_pids():
            try:
                p = psutil.Process(pid)
                t = p.cpu_times()
                c = p.io_counters()
                m = p.memory_info()
            except (psutil.Error, AttributeError):
                continue
            cpu += t.user + t.system
            io += c.read_chars + c.read_bytes
            rss += m.rss
        return cpu, io, rss

    def moved(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        cpu, io, rss = self._counters()
        # A process of the tree that ended lowers a sum: count on from there. Resident memory counts
        # only past its high-water mark, so memory freed and taken again (churn) is no progress.
        self._cpu, self._io = min(self._cpu, cpu), min(self._io, io)
        out = self.proc.last_output_at()
        evidence = False
        if out != self._out:
            self._out, evidence = out, True
        if io - self._io >= IO_PROGRESS_BYTES:
            self._io, evidence = io, True
        if rss - self._rss >= RSS_PROGRESS_BYTES:
            self._rss, evidence = rss, True
        used, span = cpu - self._cpu, max(now - self._cpu_at, 1e-6)
        busy = used >= CPU_PROGRESS_S and used >= CPU_BUSY_SHARE * span
        if busy or span >= CPU_WINDOW_S:         # a rate over at most a window, never a sum of crumbs
            self._cpu, self._cpu_at = cpu, now
        if evidence:
            self.evidence_at = now
        cpu_counts = busy and (self.cpu_alone_s is None or now - self.evidence_at <= self.cpu_alone_s)
        self.spinning = busy and not evidence and not cpu_counts
        return evidence or cpu_counts


def _rest(proc: ManagedProcess, mark: int, seconds: float, sleep: Callable[[float], object]) -> None:
    """Wait up to `seconds`, less when the engine prints after `mark` (but FAST_POLL_S at least: a
    chatty engine does not get a probe per read) or `sleep(0)` says stop."""
    start = time.monotonic()
    end = start + seconds
    while (left := end - time.monotonic()) > 0:
        if proc.wait_output(mark, min(left, WAKE_SLICE_S)):
            floor = start + min(FAST_POLL_S, seconds) - time.monotonic()
            if floor > 0:
                sleep(floor)
            return
        if sleep(0):
            return


def wait_healthy(proc: ManagedProcess, host: str, port: int, *, stall_s: float, max_s: float,
                 poll_s: float, should_stop: Callable[[], bool],
                 sleep: Callable[[float], object],
                 stall_lines: tuple[re.Pattern[str], int] | None = None,
                 fast_s: float = FAST_PHASE_S) -> HealthOutcome:
    """Block until healthy, exited, stalled or asked to stop. `sleep` may return early on a stop
    request and then returns true (an Event's wait); between polls the wait also wakes on new output.

    `stall_lines` is (pattern, n): output the engine repeats while stuck (vLLM's "No available
    shared memory broadcast block"); n such lines end the wait as a stall even though they are output.
    """
    start = time.monotonic()
    last_progress = start
    meter = ProgressMeter(proc, cpu_alone_s=stall_s)
    next_meter = start
    # A wildcard bind address is reached on loopback.
    target = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    while True:
        now = time.monotonic()
        elapsed = now - start
        if should_stop():
            return HealthOutcome(False, stopped=True, elapsed_s=elapsed)
        rc = proc.poll()
        if rc is not None:
            return HealthOutcome(False, exited=True, elapsed_s=elapsed, returncode=rc)
        mark = proc.output_mark()                 # output from here on, during the probe too, ends the rest
        if probe_health(target, port, timeout=max(poll_s, 0.5)) == 200 and owns_port(proc, port):
            elapsed = time.monotonic() - start
            if not proc.caught_up(CATCH_UP_S):    # the load's last lines, in the boot timeline before it closes
                log.info("pid %d: healthy with its output reader still behind after %.1f s: the boot timeline may "
                         "lack the engine's last phases", proc.pid, CATCH_UP_S)
            return HealthOutcome(True, elapsed_s=elapsed)
        if now >= next_meter:
            if meter.moved():
                last_progress = now
            next_meter = now + 0.5
            repeats = [line for line in proc.tail() if stall_lines and stall_lines[0].search(line)]
            if stall_lines and len(repeats) >= stall_lines[1]:
                return HealthOutcome(False, stalled=True, elapsed_s=elapsed,
                                     reason=f"the engine repeated {len(repeats)}x without getting ready: "
                                            f"{repeats[-1].strip()[:200]}")
        if now - last_progress > stall_s and meter.spinning:
            return HealthOutcome(False, stalled=True, elapsed_s=elapsed,
                                 reason=f"no loading progress but CPU time for {now - meter.evidence_at:.0f} s: the "
                                        "engine kept a CPU busy and printed nothing, read nothing, mapped no new "
                                        f"memory (CPU alone counts for health.stall_s = {stall_s:g} s): a busy hang, "
                                        "such as an NCCL initialisation spinning while a peer never answers")
        if now - last_progress > stall_s:
            return HealthOutcome(False, stalled=True, elapsed_s=elapsed,
                                 reason=f"no loading progress (output, disk reads or new memory) within "
                                        f"health.stall_s ({stall_s:g} s)")
        if max_s and elapsed > max_s:
            return HealthOutcome(False, stalled=True, elapsed_s=elapsed,
                                 reason=f"health.max_s ({max_s:g} s) reached while still loading (it was making "
                                        "progress): raise health.max_s, or 0 to let progress decide")
        quiet = now - proc.last_output_at()
        _rest(proc, mark, FAST_POLL_S if elapsed < fast_s or quiet < AFTER_OUTPUT_S else poll_s, sleep)
