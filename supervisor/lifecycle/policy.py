"""The supervisor's decisions, as pure functions: no I/O, no clock of their own, no state.

    where the ladder falls through     next_rung()
    whether a rung re-plans first      calibrates()   (a balanced split after an OOM)
    whether a cluster boot crash restarts   group_restarts()   (the group, not the ladder)
    whether a failure is ever retried  TERMINAL, is_terminal()
    where a restart is decided         after_crash(), backoff_after_uptime()
    what the supervisor exits with     failed_exit_code(), exit_code_for()

The machine (supervisor/lifecycle/machine.py) calls these; tests/unit/test_policy.py pins them down.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import LadderSpec, RestartSpec, Rung
from ..failure import Failure, FailureClass
from ..process.pid1 import exit_code_for

__all__ = ["TERMINAL", "is_terminal", "next_rung", "group_restarts", "calibrates", "Restart", "CrashLoop", "GiveUp", "after_crash",
           "backoff_after_uptime", "failed_exit_code", "exit_code_for", "EXIT_NOTHING_SERVED"]

EXIT_NOTHING_SERVED = 3   # FAILED before any server ran (config, hardware, driver, model, fetch)

# Never retried by a restart: the same launch would fail the same way (a selftest runs at
# temperature 0, a driver does not grow newer, a model file does not change under a restart; a
# cluster's rank that did not arrive within its deadline was waited for that long already).
TERMINAL = frozenset({
    FailureClass.CONFIG_REJECTED, FailureClass.LOAD_ERROR, FailureClass.PORT_IN_USE,
    FailureClass.SELFTEST_FAILED, FailureClass.DRIVER_INCOMPATIBLE, FailureClass.MODEL_INCOMPATIBLE,
    FailureClass.ENGINE_MISSING, FailureClass.NODE_MISSING,
})


def is_terminal(failure: Failure | None) -> bool:
    return failure is not None and failure.failure_class in TERMINAL


def group_restarts(failure: Failure) -> bool:
    """Whether a cluster rank's failure before its group served restarts the group rather than ending
    the walk: a crash (its own engine's death with no known signature, or the group's loss of a peer,
    run/cluster.py) says nothing against the config when a peer's death takes every rank's engine down.
    What the config decides (rejected, OOM, incompatible, missing) still walks or fails."""
    return failure.failure_class == FailureClass.CRASHED


def calibrates(rung: Rung, failure: Failure) -> bool:
    """Whether the rung that just failed is re-planned before anything else is decided: a balanced
    rung out of memory (its engine printed how much each card lacked), or a vLLM whose forked
    EngineCore met CUDA (relaunched with spawn, once: the loop answers not ok the second time)."""
    if failure.failure_class == FailureClass.FORK_UNSAFE:
        return True
    return rung.placement == "balanced" and failure.failure_class == FailureClass.OOM


def next_rung(ladder: LadderSpec, index: int, failure: Failure, *, recalibrated: bool = False) -> int | None:
    """The rung to try after rung `index` failed, or None when the walk is over.

    A balanced rung that re-planned its split from an OOM's shortfall lines (`recalibrated`) tries
    again; any other failure falls through to the next rung when its class is in `ladder.fall_through`."""
    if recalibrated:
        return index
    if failure.failure_class in ladder.fall_through and index + 1 < len(ladder.rungs):
        return index + 1
    return None


@dataclass(frozen=True)
class Restart:
    delay_s: float                   # wait this long, then relaunch the same rung
    restarts: tuple[float, ...]      # monotonic times of the restarts inside the window, this one last
    next_backoff_s: float


@dataclass(frozen=True)
class CrashLoop:
    failure: Failure                 # the last failure, retold as a crash loop


@dataclass(frozen=True)
class GiveUp:
    failure: Failure                 # terminal: a restart would fail the same way


def after_crash(spec: RestartSpec, failure: Failure, *, now: float, restarts: tuple[float, ...],
                backoff_s: float, relaunch: bool) -> Restart | CrashLoop | GiveUp:
    """What to do when the serving engine died (`relaunch` False) or a relaunch after such a death
    failed (`relaunch` True)."""
    if relaunch and is_terminal(failure):
        return GiveUp(failure)
    recent = tuple(t for t in restarts if now - t <= spec.window_s) + (now,)
    if len(recent) > spec.max_restarts:
        reason = (f"crash loop: {len(recent)} failures within {spec.window_s:.0f} s "
                  f"(restart.max_restarts = {spec.max_restarts}); last: {failure.reason}")
        return CrashLoop(Failure(failure.failure_class, reason, exit_code=failure.exit_code, tail=failure.tail,
                                 rung=failure.rung))
    return Restart(delay_s=backoff_s, restarts=recent,
                   next_backoff_s=min(max(backoff_s * 2, 0.001), spec.backoff_max_s))


def backoff_after_uptime(spec: RestartSpec, uptime_s: float, backoff_s: float) -> float:
    """An engine that ran for `stable_s` earned a fresh start: the backoff goes back to its first step."""
    return spec.backoff_initial_s if uptime_s >= spec.stable_s else backoff_s


def failed_exit_code(last_returncode: int | None) -> int:
    """Leaving FAILED: the engine's own status when one ran and failed with it, else 3."""
    return exit_code_for(last_returncode) if last_returncode else EXIT_NOTHING_SERVED
