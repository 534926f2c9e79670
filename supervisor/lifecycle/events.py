"""What goes into the lifecycle machine (events) and what comes out of it (effects).

The loop (supervisor/run/loop.py) turns the world into events — a signal, a child's exit, a
finished health wait, selftest, download or reclaim, a published config, a timer — and feeds
them to the machine (supervisor/lifecycle/machine.py), which decides and answers with effects. The loop
runs the effects; slow ones (downloads, health waits, selftests, the reclaim barrier) run in
tasks beside the loop and come back as events, so the loop never stops watching the engine.

Every task and every engine launch carries a token; an event whose token is no longer the one
the machine waits for is stale (a health answer from an engine already stopped) and is dropped.
Events and effects are plain immutable data (NamedTuples: a frozen dataclass costs ~1.7 ms to
define, ten times more, and PID 1 imports these before it launches the engine); the machine's
property test builds them by the thousand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple
from pathlib import Path
from typing import Any

from ..failure import Failure
from .state import Live, State


# -- events: the world, as the machine sees it --------------------------------------------------

class Signal(NamedTuple):
    signum: int


class Prepared(NamedTuple):
    """The engine module, key, hardware guard, binary and driver checks for a config ran;
    `start` is the rung its walk begins at (ladder.start, or the winner remembered on this hardware)."""
    token: int
    failure: Failure | None = None
    start: int = 0


class ModelReady(NamedTuple):
    """A model fetch (or local lookup) finished: the file to load, or why there is none."""
    token: int
    path: Path | None = None
    failure: Failure | None = None


class LaunchChecked(NamedTuple):
    """The rung's pre-launch checks (flag lint, model file) ran; a failure means it never starts."""
    token: int
    failure: Failure | None = None


class BarrierDone(NamedTuple):
    token: int
    failure: Failure | None = None   # the launch must not happen (a cluster's rank that never came back)


class Launched(NamedTuple):
    token: int
    pid: int


class HealthDone(NamedTuple):
    """The health wait ended: ready, or stalled (an exit arrives as EngineDown instead)."""
    token: int
    ready: bool
    elapsed_s: float = 0.0
    stall_reason: str | None = None


class SelftestDone(NamedTuple):
    token: int
    failure: Failure | None = None


class EngineDown(NamedTuple):
    """The engine of launch `token` is gone or unusable: it exited on its own, stalled (and was
    stopped), or never started."""
    token: int
    failure: Failure
    started: bool = True


class Calibrated(NamedTuple):
    """A balanced rung's split was re-planned from its OOM's shortfall lines (`ok`), or could not
    be (no shortfall line, no rounds left): the answer to Calibrate."""
    token: int
    ok: bool


class CandidateChecked(NamedTuple):
    """A published config, validated while the server keeps serving."""
    candidate: Any                   # supervisor.reload.candidate.Candidate
    live: Live | None                # what it would run; None when it was rejected
    problems: tuple[str, ...] = ()


class Tick(NamedTuple):
    """Time passed (the loop's timer): a restart's backoff may be over."""


Event = (Signal | Prepared | ModelReady | LaunchChecked | BarrierDone | Launched | HealthDone | SelftestDone
         | EngineDown | Calibrated | CandidateChecked | Tick)


# -- effects: what the machine asks the loop to do ------------------------------------------------

class Enter(NamedTuple):
    """Transition the state record (checked against state.ALLOWED)."""
    state: State
    detail: str = ""


class Prepare(NamedTuple):
    token: int
    live: Live
    probe: bool = False              # boot: probe the hardware first


class Fetch(NamedTuple):
    token: int
    live: Live
    candidate: bool = False          # a published config's model, fetched beside the serving engine


class CheckLaunch(NamedTuple):
    token: int
    live: Live
    index: int


class Barrier(NamedTuple):
    token: int


class Launch(NamedTuple):
    token: int
    live: Live
    index: int


class WaitHealthy(NamedTuple):
    token: int


class RunSelftest(NamedTuple):
    token: int
    index: int


class StopEngine(NamedTuple):
    """Stop the engine of launch `token` (bounded by the stop grace). With `stall_reason` the
    loop classifies what it printed as a stall and answers with EngineDown; else it is quiet."""
    token: int
    stall_reason: str | None = None


class Calibrate(NamedTuple):
    """Re-plan balanced rung `rung`'s split from `failure`'s shortfall lines (ladder/balanced.py);
    the loop answers with Calibrated(token, ok)."""
    token: int
    rung: str
    failure: Failure


class CancelTask(NamedTuple):
    token: int


class ForwardSignal(NamedTuple):
    signum: int


class RecordFailure(NamedTuple):
    failure: Failure


class RecordRestart(NamedTuple):
    rung: str
    delay_s: float


class RecordReload(NamedTuple):
    """One decision on a published config: applied, unchanged, rejected, rolled_back or failed;
    `tail` is the stderr tail of the engine that made it fail (the fleet record carries it)."""
    candidate: Any
    outcome: str
    config_hash: str | None
    causes: tuple[str, ...] = ()
    tail: tuple[str, ...] = ()


class ShowConfig(NamedTuple):
    live: Live


class MarkGood(NamedTuple):
    live: Live


class Serving(NamedTuple):
    """The live config serves on this rung: remember the rung, note the timings, check placement."""
    index: int


class Failed(NamedTuple):
    """FAILED: nothing retries it but a published config."""
    failure: Failure | None


class Shutdown(NamedTuple):
    """Stop everything (engine, tasks, every tracked process) and leave with `code`, or with the
    engine's own status when `code` is None."""
    code: int | None = None
    grace: bool = True


Effect = (Enter | Prepare | Fetch | CheckLaunch | Barrier | Launch | WaitHealthy | RunSelftest | StopEngine
          | Calibrate | CancelTask | ForwardSignal | RecordFailure | RecordRestart | RecordReload | ShowConfig
          | MarkGood | Serving | Failed | Shutdown)


@dataclass
class Effects:
    """An ordered list of effects, built by the machine's handlers."""
    items: list[Effect] = field(default_factory=list)

    def __call__(self, *effects: Effect) -> None:
        self.items.extend(effects)
