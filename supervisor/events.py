"""What goes into the lifecycle machine (events) and what comes out of it (effects).

The loop (supervisor/lifecycle.py) turns the world into events — a signal, a child's exit, a
finished health wait, selftest, download or reclaim, a published config, a timer — and feeds
them to the machine (supervisor/machine.py), which decides and answers with effects. The loop
runs the effects; slow ones (downloads, health waits, selftests, the reclaim barrier) run in
tasks beside the loop and come back as events, so the loop never stops watching the engine.

Every task and every engine launch carries a token; an event whose token is no longer the one
the machine waits for is stale (a health answer from an engine already stopped) and is dropped.
Events and effects are plain frozen data: the machine's property test builds them by the
thousand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .failure import Failure
from .state import Live, State


# -- events: the world, as the machine sees it --------------------------------------------------

@dataclass(frozen=True)
class Signal:
    signum: int


@dataclass(frozen=True)
class Prepared:
    """The engine module, key, hardware guard, binary and driver checks for a config ran;
    `start` is the rung its walk begins at (ladder.start, or the winner remembered on this hardware)."""
    token: int
    failure: Failure | None = None
    start: int = 0


@dataclass(frozen=True)
class ModelReady:
    """A model fetch (or local lookup) finished: the file to load, or why there is none."""
    token: int
    path: Path | None = None
    failure: Failure | None = None


@dataclass(frozen=True)
class LaunchChecked:
    """The rung's pre-launch checks (flag lint, model file) ran; a failure means it never starts."""
    token: int
    failure: Failure | None = None


@dataclass(frozen=True)
class BarrierDone:
    token: int


@dataclass(frozen=True)
class Launched:
    token: int
    pid: int


@dataclass(frozen=True)
class HealthDone:
    """The health wait ended: ready, or stalled (an exit arrives as EngineDown instead)."""
    token: int
    ready: bool
    elapsed_s: float = 0.0
    stall_reason: str | None = None


@dataclass(frozen=True)
class SelftestDone:
    token: int
    failure: Failure | None = None


@dataclass(frozen=True)
class EngineDown:
    """The engine of launch `token` is gone or unusable: it exited on its own, stalled (and was
    stopped), or never started. `recalibrated`: a balanced rung re-planned its split from the
    OOM's shortfall lines and may try again."""
    token: int
    failure: Failure
    started: bool = True
    recalibrated: bool = False


@dataclass(frozen=True)
class CandidateChecked:
    """A published config, validated while the server keeps serving."""
    candidate: Any                   # supervisor.candidate.Candidate
    live: Live | None                # what it would run; None when it was rejected
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Tick:
    """Time passed (the loop's timer): a restart's backoff may be over."""


Event = (Signal | Prepared | ModelReady | LaunchChecked | BarrierDone | Launched | HealthDone | SelftestDone
         | EngineDown | CandidateChecked | Tick)


# -- effects: what the machine asks the loop to do ------------------------------------------------

@dataclass(frozen=True)
class Enter:
    """Transition the state record (checked against state.ALLOWED)."""
    state: State
    detail: str = ""


@dataclass(frozen=True)
class Prepare:
    token: int
    live: Live
    probe: bool = False              # boot: probe the hardware first


@dataclass(frozen=True)
class Fetch:
    token: int
    live: Live
    candidate: bool = False          # a published config's model, fetched beside the serving engine


@dataclass(frozen=True)
class CheckLaunch:
    token: int
    live: Live
    index: int


@dataclass(frozen=True)
class Barrier:
    token: int


@dataclass(frozen=True)
class Launch:
    token: int
    live: Live
    index: int


@dataclass(frozen=True)
class WaitHealthy:
    token: int


@dataclass(frozen=True)
class RunSelftest:
    token: int
    index: int


@dataclass(frozen=True)
class StopEngine:
    """Stop the engine of launch `token` (bounded by the stop grace). With `stall_reason` the
    loop classifies what it printed as a stall and answers with EngineDown; else it is quiet."""
    token: int
    stall_reason: str | None = None


@dataclass(frozen=True)
class CancelTask:
    token: int


@dataclass(frozen=True)
class ForwardSignal:
    signum: int


@dataclass(frozen=True)
class RecordFailure:
    failure: Failure


@dataclass(frozen=True)
class RecordRestart:
    rung: str
    delay_s: float


@dataclass(frozen=True)
class RecordReload:
    """One decision on a published config: applied, unchanged, rejected, rolled_back or failed."""
    candidate: Any
    outcome: str
    config_hash: str | None
    causes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShowConfig:
    live: Live


@dataclass(frozen=True)
class MarkGood:
    live: Live


@dataclass(frozen=True)
class Serving:
    """The live config serves on this rung: remember the rung, note the timings, check placement."""
    index: int


@dataclass(frozen=True)
class Failed:
    """FAILED: nothing retries it but a published config."""
    failure: Failure | None


@dataclass(frozen=True)
class Shutdown:
    """Stop everything (engine, tasks, every tracked process) and leave with `code`, or with the
    engine's own status when `code` is None."""
    code: int | None = None
    grace: bool = True


Effect = (Enter | Prepare | Fetch | CheckLaunch | Barrier | Launch | WaitHealthy | RunSelftest | StopEngine
          | CancelTask | ForwardSignal | RecordFailure | RecordRestart | RecordReload | ShowConfig | MarkGood | Serving | Failed
          | Shutdown)


@dataclass
class Effects:
    """An ordered list of effects, built by the machine's handlers."""
    items: list[Effect] = field(default_factory=list)

    def __call__(self, *effects: Effect) -> None:
        self.items.extend(effects)
