"""The boot timeline: where every second of a boot went, phase by phase (/status `boot`).

A boot's phases are contiguous: each begins where the one before ends, so they add up to the
boot. Three sources mark them, each where it already is:

    run/record.py Record.transition  PREFLIGHT (the first timeline), FETCH, LAUNCHING, SELFTEST;
                                 SERVING closes it (ready), FAILED (failed), STOPPING (stopped);
                                 RESTARTING and RELOADING begin a new one, ROLLBACK marks a phase
    run/loop.py, run/launch.py   what is not a state: a rung's launch checks, the reclaim
                                 barrier, the engine's exec (engine_exec: launch_rung)
    the engine's own lines       engines/<name>.py PHASES: (phase, regex) in the order the engine
                                 prints them, matched as its lines arrive (its reader thread) by
                                 an EngineWatch, forward only (a phase the engine skips, a compile
                                 served from its cache, is simply not there), until the timeline
                                 closes: a serving engine's lines cost one flag test each

The same watch keeps the boot's lines that an engine's SIZING pattern names (vLLM's own sizing:
plan/engine_log.py), for the plan's self-check after the selftest (run/selftest.py): read from the
boot as it prints them, not from a tail the selftest's own requests may have pushed them out of.

Each phase: `phase`, `start_s` (seconds since the supervisor process started: its exec, read
from /proc, when `python -m supervisor run` is the process; else since the Record was made),
`start` (wall clock), `seconds` (so far, for the open one), `source` (supervisor | engine), and
`rung` / `line` where they say something. The current timeline and the one before it are kept:
a restart or a reload starts a new one. A leaf: it knows state names as text, not state.py.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

Markers = Sequence[tuple[str, "re.Pattern[str]"]]

_LINE_SHOWN = 160          # an engine phase shows the start of the line that began it
_PENDING_MAX = 256         # engine lines held until the launch is armed (the first few, at most)
_KEPT_MAX = 64             # sizing lines kept from one launch (a line per worker, a few kinds)

# state -> what entering it does to the timeline
_PHASE_OF_STATE = {"FETCH": "fetch", "LAUNCHING": "launch", "SELFTEST": "selftest", "ROLLBACK": "rollback"}
_CLOSES = {"SERVING": "ready", "FAILED": "failed", "STOPPING": "stopped"}
_BEGINS = {"RESTARTING": ("restart", "restart_backoff"), "RELOADING": ("reload", "reload")}


def process_start() -> float | None:
    """When this process was exec'd, on the monotonic clock (Linux: /proc/self/stat's start time
    against /proc/uptime, both since boot, 10 ms resolution), or None where /proc cannot say."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            stat = f.read()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])     # field 22, after the command's parentheses
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return time.monotonic() - age if 0.0 <= age < 3600.0 else None


@dataclass
class Phase:
    name: str
    start: float                  # monotonic
    source: str                   # "supervisor" | "engine"
    rung: str | None = None
    line: str | None = None       # the engine line that began it
    end: float | None = None


class Timeline:
    """One boot (or restart, or reload): phases until it closes with an outcome."""

    def __init__(self, n: int, cause: str) -> None:
        self.n = n
        self.cause = cause
        self.phases: list[Phase] = []
        self.outcome: str | None = None        # ready | failed | stopped, once closed
        self.rung: str | None = None           # the rung of the launch under way

    @property
    def open(self) -> bool:
        return self.outcome is None

    def mark(self, name: str, t: float, source: str = "supervisor", *, rung: str | None = None,
             line: str | None = None) -> None:
        if not self.open:
            return
        last = self.phases[-1] if self.phases else None
        if last is not None:
            if last.name == name and last.rung == rung and last.source == source:
                return                         # the same phase again (a state re-entered)
            t = max(t, last.start)             # marks from two threads: never a negative phase
            last.end = t
        self.phases.append(Phase(name, t, source, rung, line))

    def close(self, outcome: str, t: float) -> None:
        if not self.open:
            return
        if self.phases:
            self.phases[-1].end = max(t, self.phases[-1].start)
        self.outcome = outcome

    def to_dict(self, origin_mono: float, origin_wall: float, now: float) -> dict[str, Any]:
        phases = []
        for p in self.phases:
            d: dict[str, Any] = {"phase": p.name, "start_s": round(p.start - origin_mono, 3),
                                 "start": round(origin_wall + (p.start - origin_mono), 3),
                                 "seconds": round((p.end if p.end is not None else now) - p.start, 3),
                                 "source": p.source}
            if p.rung is not None:
                d["rung"] = p.rung
            if p.line is not None:
                d["line"] = p.line
            if p.end is None:
                d["open"] = True
            phases.append(d)
        first = self.phases[0].start if self.phases else now
        last = self.phases[-1] if self.phases else None
        end = last.end if last is not None and last.end is not None else now
        return {"n": self.n, "cause": self.cause, "outcome": self.outcome, "phases": phases,
                "start_s": round(first - origin_mono, 3), "seconds": round(end - first, 3)}


class Timelines:
    """The current timeline and the one before it. Thread-safe: the loop thread marks states and
    launches, engine reader threads mark the engine's phases."""

    def __init__(self, *, process_start: float | None = None, supervised: bool = True) -> None:
        """`supervised` False: an engine timed alone (bench/coldstart.py's bare boots), from
        `process_start` (its exec), without the supervisor's own phases."""
        self.lock = threading.Lock()
        now_mono, now_wall = time.monotonic(), time.time()
        age = now_mono - process_start if process_start is not None and process_start <= now_mono else None
        self.origin_mono = now_mono - (age or 0.0)
        self.origin_wall = now_wall - (age or 0.0)
        self.current = Timeline(1, "boot")
        self.previous: Timeline | None = None
        self.watch: EngineWatch | None = None   # the launch whose lines are matched now
        if not supervised:
            self.current = Timeline(1, "bare")
        elif age is not None:                   # the interpreter, the imports, the config parsed
            self.current.mark("supervisor_start", self.origin_mono)
        if supervised:
            self.current.mark("preflight", now_mono)

    def _begin(self, cause: str) -> None:
        self.previous = self.current
        self.current = Timeline(self.previous.n + 1, cause)
        self.watch = None

    def on_state(self, state: str, detail: str = "", t: float | None = None) -> None:
        """A state entered (Record.transition; LAUNCHING's and SELFTEST's detail is the rung): a
        phase, a new timeline, or the end of one."""
        t = time.monotonic() if t is None else t
        with self.lock:
            cur = self.current
            if state in _BEGINS:
                cause, phase = _BEGINS[state]
                if not (cur.open and cur.cause == cause):     # a restart that failed again goes on
                    cur.close("superseded", t)                # (closed already, unless cut short)
                    self._begin(cause)
                self.current.mark(phase, t)
            elif state in _CLOSES:
                cur.close(_CLOSES[state], t)
            elif state in _PHASE_OF_STATE:
                rung = (detail or cur.rung) if state in ("LAUNCHING", "SELFTEST") else None
                if state == "LAUNCHING":
                    cur.rung = rung
                cur.mark(_PHASE_OF_STATE[state], t, rung=rung)

    def mark(self, name: str, *, rung: str | None = None, t: float | None = None) -> None:
        """A supervisor phase that is not a state (the loop's launch checks, the barrier)."""
        t = time.monotonic() if t is None else t
        with self.lock:
            if rung is not None:
                self.current.rung = rung
            self.current.mark(name, t, rung=rung)

    def engine(self, markers: Markers, rung: str, keep: "re.Pattern[str] | None" = None) -> "EngineWatch":
        """The watch for a launch about to start: give its `line` as the process's line callback,
        then `arm(started_at)` once the process runs (lines before that are held, not lost). Lines
        `keep` finds, until the boot is done, are kept (`kept`)."""
        return EngineWatch(self, tuple(markers), rung, keep)

    def kept(self) -> list[str]:
        """The kept lines of the launch watched now (none between a restart and its launch)."""
        with self.lock:
            return list(self.watch.kept) if self.watch is not None else []

    def to_dict(self) -> dict[str, Any]:
        with self.lock:
            now = time.monotonic()
            out = self.current.to_dict(self.origin_mono, self.origin_wall, now)
            out["previous"] = (self.previous.to_dict(self.origin_mono, self.origin_wall, now)
                               if self.previous is not None else None)
            return out


class EngineWatch:
    """One launch's engine lines against its engine's markers; inert once the timeline it belongs
    to has closed or moved on (another launch, a restart), so serving costs a flag test a line."""

    def __init__(self, timelines: Timelines, markers: tuple[tuple[str, "re.Pattern[str]"], ...], rung: str,
                 keep: "re.Pattern[str] | None" = None):
        self.timelines = timelines
        self.markers = markers
        self.rung = rung
        self.keep = keep
        self.kept: list[str] = []
        self.next = 0                 # the first marker not yet seen
        self.armed = False
        self.done = not markers and keep is None
        self.timeline: Timeline | None = None
        self.pending: list[tuple[float, str]] = []

    def arm(self, started_at: float) -> None:
        """The engine process runs since `started_at` (monotonic): engine_exec begins there."""
        with self.timelines.lock:
            self.timeline = self.timelines.current
            self.timelines.watch = self
            self.timeline.rung = self.rung
            self.timeline.mark("engine_exec", started_at, rung=self.rung)
            self.armed = True
            for t, line in self.pending:
                self._match(t, line)
            self.pending = []

    def line(self, line: str) -> None:
        if self.done:
            return
        t = time.monotonic()
        with self.timelines.lock:
            if not self.armed:
                if len(self.pending) < _PENDING_MAX:
                    self.pending.append((t, line))
                return
            self._match(t, line)

    def _match(self, t: float, line: str) -> None:
        tl = self.timeline
        if tl is None or not tl.open or self.timelines.current is not tl or self.timelines.watch is not self:
            self.done = True
            return
        if self.keep is not None and len(self.kept) < _KEPT_MAX and self.keep.search(line):
            self.kept.append(line.strip())
        for i in range(self.next, len(self.markers)):
            name, pattern = self.markers[i]
            if pattern.search(line):
                tl.mark(name, t, "engine", rung=self.rung, line=line.strip()[:_LINE_SHOWN])
                self.next = i + 1
                break
        if self.markers and self.next >= len(self.markers):
            self.done = True
