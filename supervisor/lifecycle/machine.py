"""The lifecycle as a state machine: one event in, the decision, the effects out. No I/O here.

    PREFLIGHT -> FETCH -> LAUNCHING(rung) -> LOADING -> HEALTHY -> [SELFTEST] -> SERVING
    a rung fails: policy.next_rung -> the next rung (after the reclaim barrier), or FAILED
      (a balanced rung out of memory re-plans its split first: Calibrate -> Calibrated -> the same rung)
    SERVING, the engine dies: policy.after_crash -> RESTARTING (backoff) -> the same rung; crash loop -> FAILED
    SERVING or FAILED, a published config: reload.decide -> rejected (server untouched) | unchanged
      | its model fetched beside the serving engine -> RELOADING -> the ladder with it -> SERVING
      -> any step fails: ROLLBACK -> the ladder with the last good config -> SERVING (or FAILED)
    TERM/INT anywhere: STOPPING -> STOPPED, exit with the engine's status (or 128+N, or 3)
    FAILED with `release_after_s` (a Serverless worker): STOPPING once that grace is over, unless a
      published config brought it back first

`Machine.step(event, now)` is the only way in. Each handler names the state it acts in; an
event that does not belong (a stale token, a health answer after the engine was stopped) changes
nothing. The loop (supervisor/run/loop.py) runs the effects; tests/unit/test_machine.py drives
random event sequences through this class and checks every transition against state.ALLOWED.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass, replace
from typing import Any

from . import policy
from . import reload
from .events import (
    Barrier,
    BarrierDone,
    Calibrate,
    Calibrated,
    CancelTask,
    CandidateChecked,
    CheckLaunch,
    Effect,
    Effects,
    EngineDown,
    Enter,
    Event,
    Failed,
    Fetch,
    ForwardSignal,
    HealthDone,
    Launch,
    LaunchChecked,
    Launched,
    MarkGood,
    ModelReady,
    Prepare,
    Prepared,
    RecordFailure,
    RecordReload,
    RecordRestart,
    RunSelftest,
    SelftestDone,
    Serving,
    ShowConfig,
    Shutdown,
    Signal,
    StopEngine,
    Tick,
    WaitHealthy,
)
from ..failure import Failure
from .state import Live, State

S = State


class Purpose(str, enum.Enum):
    """Why the ladder is being walked."""
    BOOT = "boot"            # the first walk
    RESTART = "restart"      # the serving rung died: relaunch it
    RELOAD = "reload"        # a published config: walk its ladder
    ROLLBACK = "rollback"    # the published config failed: walk the last good one's


@dataclass(frozen=True)
class Pending:
    """A published config on its way in: validated, its model maybe still downloading."""
    candidate: Any
    live: Live
    fetch: int | None = None     # the fetch task's token while it runs
    ready: bool = False          # the model is in place: it can be applied


class Machine:
    def __init__(self, live: Live, *, exit_on_failure: bool = False, release_after_s: float | None = None,
                 group: bool = False):
        self.state = S.PREFLIGHT
        # A rank of a cluster (supervisor/cluster/): its engine dies when a peer's does, so a crash before
        # the group served restarts the group (policy.group_restarts) instead of ending the walk.
        self.group = group
        self.live = live                    # what is walked or served
        self.good: Live | None = None       # the last config that served (rollback target)
        self.exit_on_failure = exit_on_failure
        # A Serverless worker that can never serve leaves this long after it entered FAILED, so it
        # stops billing (supervisor/serverless/); None: FAILED stays up to explain (pods).
        self.release_after_s = release_after_s
        self.release_at: float | None = None
        self.start_at = 0                   # the walk's first rung (ladder.start, or the remembered winner)
        self.seq = 0
        self.waiting: tuple[str, int] | None = None     # what the machine waits for, and its token
        self.engine: int | None = None      # the launch token of the engine that runs, if one does
        self.rung: int | None = None
        self.purpose = Purpose.BOOT
        self.ran_before = False             # an engine ran earlier in this walk: barrier first
        self.restarts: tuple[float, ...] = ()
        self.backoff = live.cfg.restart.backoff_initial_s
        self.served_since: float | None = None
        self.restart_at: float | None = None
        self.candidate: Pending | None = None    # being prepared beside the serving engine
        self.applying: Pending | None = None     # being applied (RELOADING, ROLLBACK)
        self.last_failure: Failure | None = None
        self.last_rc: int | None = None
        self.reload_cause: Failure | None = None   # why the published config failed (told by a rollback)
        self.calibrating: EngineDown | None = None  # the balanced rung's OOM, while its split is re-planned
        self.done = False

    # -- plumbing ------------------------------------------------------------------------------
    def _token(self) -> int:
        self.seq += 1
        return self.seq

    def _wait(self, what: str) -> int:
        token = self._token()
        self.waiting = (what, token)
        return token

    def _is(self, what: str, token: int) -> bool:
        return self.waiting == (what, token)

    def _enter(self, fx: Effects, state: State, detail: str = "") -> None:
        self.state = state
        fx(Enter(state, detail))

    def accepts_candidates(self) -> bool:
        """Published configs are taken while serving or failed, never during a walk or a stop."""
        return self.state in (S.SERVING, S.FAILED) and self.applying is None and not self.done

    def next_deadline(self) -> float | None:
        if self.state == S.FAILED and self.release_at is not None:
            return self.release_at
        return self.restart_at if self.state == S.RESTARTING and self.waiting is None else None

    # -- entry ------------------------------------------------------------------------------------
    def start(self) -> list[Effect]:
        fx = Effects()
        fx(ShowConfig(self.live), Prepare(self._wait("prepare"), self.live, probe=True))
        return fx.items

    def step(self, ev: Event, now: float) -> list[Effect]:
        fx = Effects()
        if self.done:
            return []
        handler = getattr(self, "_on_" + type(ev).__name__)
        handler(ev, now, fx)
        self._arm_release(now)
        return fx.items

    def _arm_release(self, now: float) -> None:
        """The release deadline runs from the moment FAILED was entered; leaving FAILED clears it."""
        if self.state != S.FAILED or self.release_after_s is None or self.done:
            self.release_at = None
        elif self.release_at is None:
            self.release_at = now + self.release_after_s

    # -- signals ------------------------------------------------------------------------------
    def _on_Signal(self, ev: Signal, now: float, fx: Effects) -> None:
        if ev.signum == signal.SIGHUP:
            if self.engine is not None:
                fx(ForwardSignal(ev.signum))     # PID 1 forwards what it does not handle itself
            return
        if ev.signum in (signal.SIGTERM, signal.SIGINT):
            code = policy.failed_exit_code(self.last_rc) if self.state == S.FAILED else None
            self._shutdown(fx, code, "signal")

    def _shutdown(self, fx: Effects, code: int | None, why: str) -> None:
        if self.waiting is not None:
            fx(CancelTask(self.waiting[1]))
        if self.candidate is not None and self.candidate.fetch is not None:
            fx(CancelTask(self.candidate.fetch))
        self._enter(fx, S.STOPPING, why)
        fx(Shutdown(code))
        self.engine, self.waiting, self.candidate = None, None, None
        self._enter(fx, S.STOPPED)
        self.done = True

    # -- preparing and fetching ----------------------------------------------------------------------
    def _on_Prepared(self, ev: Prepared, now: float, fx: Effects) -> None:
        if not self._is("prepare", ev.token):
            return
        self.waiting = None
        if ev.failure is not None:
            fx(RecordFailure(ev.failure))
            self._walk_failed(fx, ev.failure)
            return
        self.start_at = ev.start
        if self.purpose == Purpose.BOOT:
            self._enter(fx, S.FETCH, self.live.cfg.model.source)
            fx(Fetch(self._wait("fetch"), self.live))
        else:
            self._begin_rung(fx, ev.start)

    def _on_ModelReady(self, ev: ModelReady, now: float, fx: Effects) -> None:
        if self._is("fetch", ev.token):           # the boot's model
            self.waiting = None
            if ev.failure is not None:
                fx(RecordFailure(ev.failure))
                self._walk_failed(fx, ev.failure)
                return
            self.live = self.live.with_model(ev.path)
            self._begin_rung(fx, self.start_at)
            return
        pend = self.candidate
        if pend is None or pend.fetch != ev.token:
            return
        if ev.failure is not None:                # the published config's model: refused, server untouched
            self.candidate = None
            fx(RecordReload(pend.candidate, "rejected", pend.live.cfg.hash, (f"model: {ev.failure.reason}",)))
            return
        self.candidate = replace(pend, live=pend.live.with_model(ev.path), fetch=None, ready=True)
        self._apply_ready_candidate(fx)

    # -- the ladder walk ------------------------------------------------------------------------------
    def _begin_walk(self, fx: Effects, live: Live, purpose: Purpose) -> None:
        """Walk `live`'s ladder from its start. The old engine (if any) was stopped by the caller."""
        self.live, self.purpose = live, purpose
        self.ran_before = True                    # whatever ran before must be reclaimed first
        fx(ShowConfig(live), Prepare(self._wait("prepare"), live))

    def _begin_rung(self, fx: Effects, index: int) -> None:
        self.rung = index
        fx(CheckLaunch(self._wait("check"), self.live, index))

    def _on_LaunchChecked(self, ev: LaunchChecked, now: float, fx: Effects) -> None:
        if not self._is("check", ev.token):
            return
        self.waiting = None
        if ev.failure is not None:
            self._rung_failed(fx, ev.failure, now, started=False)
        elif self.ran_before:
            fx(Barrier(self._wait("barrier")))
        else:
            self._launch(fx)

    def _on_BarrierDone(self, ev: BarrierDone, now: float, fx: Effects) -> None:
        if self._is("barrier", ev.token):
            self.waiting = None
            if ev.failure is not None:             # like a launch check that failed: nothing started
                self._rung_failed(fx, ev.failure, now, started=False)
                return
            self._launch(fx)

    def _launch(self, fx: Effects) -> None:
        assert self.rung is not None
        token = self._wait("launch")
        self._enter(fx, S.LAUNCHING, self.live.cfg.ladder.rungs[self.rung].name)
        fx(Launch(token, self.live, self.rung))

    def _on_Launched(self, ev: Launched, now: float, fx: Effects) -> None:
        if not self._is("launch", ev.token):
            return
        self.engine = ev.token
        self.ran_before = True
        self._enter(fx, S.LOADING, f"pid {ev.pid}")
        self.waiting = ("health", ev.token)
        fx(WaitHealthy(ev.token))

    def _on_HealthDone(self, ev: HealthDone, now: float, fx: Effects) -> None:
        if not self._is("health", ev.token) or self.engine != ev.token:
            return
        if not ev.ready:
            self.waiting = ("stop", ev.token)     # the stop answers with the classified EngineDown
            fx(StopEngine(ev.token, stall_reason=ev.stall_reason or "no progress within the stall deadline"))
            return
        assert self.rung is not None
        name = self.live.cfg.ladder.rungs[self.rung].name
        self._enter(fx, S.HEALTHY, f"{name} in {ev.elapsed_s:.3f} s")
        if self.live.cfg.selftest.enabled:
            self._enter(fx, S.SELFTEST, name)
            self.waiting = ("selftest", ev.token)
            fx(RunSelftest(ev.token, self.rung))
        else:
            self._serving(fx, now)

    def _on_SelftestDone(self, ev: SelftestDone, now: float, fx: Effects) -> None:
        if not self._is("selftest", ev.token) or self.engine != ev.token:
            return
        if ev.failure is None:
            self._serving(fx, now)
            return
        fx(StopEngine(ev.token))                   # not ready means not serving: free the port and the GPU
        self.engine = None
        self._rung_failed(fx, ev.failure, now, started=True)

    def _on_EngineDown(self, ev: EngineDown, now: float, fx: Effects) -> None:
        if ev.token != self.engine and not self._is("launch", ev.token):
            return                                 # an engine we already stopped, or never started
        self.engine = None
        assert self.rung is not None
        rung = self.live.cfg.ladder.rungs[self.rung]
        calibrate = policy.calibrates(rung, ev.failure)
        if self.state == S.SERVING:
            if calibrate:                          # the restart relaunches with the re-planned split
                fx(Calibrate(ev.token, rung.name, ev.failure))
            self._crashed(fx, ev.failure, now)
            return
        if self.waiting in (("health", ev.token), ("selftest", ev.token)):
            fx(CancelTask(ev.token))               # died under the health wait or the selftest: a crash like any other
        if calibrate:                              # whether the rung tries again depends on the new split
            self.waiting, self.calibrating = ("calibrate", ev.token), ev
            fx(Calibrate(ev.token, rung.name, ev.failure))
            return
        if self.group and self.purpose == Purpose.BOOT and policy.group_restarts(ev.failure):
            self.waiting = None
            self._crashed(fx, ev.failure, now)     # the same rung again, with the group, under the cap
            return
        self._rung_failed(fx, ev.failure, now, started=ev.started)

    def _on_Calibrated(self, ev: Calibrated, now: float, fx: Effects) -> None:
        if not self._is("calibrate", ev.token) or self.calibrating is None:
            return                                 # a serving crash's re-plan: the restart did not wait for it
        down, self.calibrating = self.calibrating, None
        self._rung_failed(fx, down.failure, now, started=down.started, recalibrated=ev.ok)

    def _rung_failed(self, fx: Effects, failure: Failure, now: float, *, started: bool,
                     recalibrated: bool = False) -> None:
        self.waiting = None
        self.last_failure = failure
        self.last_rc = failure.exit_code if started else None
        fx(RecordFailure(failure))
        if self.purpose == Purpose.RESTART:
            self._crashed(fx, failure, now, relaunch=True)
            return
        assert self.rung is not None
        nxt = policy.next_rung(self.live.cfg.ladder, self.rung, failure, recalibrated=recalibrated)
        if nxt is None:
            self._walk_failed(fx, failure)
        else:
            self._begin_rung(fx, nxt)

    def _serving(self, fx: Effects, now: float) -> None:
        assert self.rung is not None
        self.waiting = None
        fx(Serving(self.rung))                     # memory, timings, placement warning: before /ready says 200
        self._enter(fx, S.SERVING, self.live.cfg.ladder.rungs[self.rung].name)
        self.served_since = now
        self.restart_at = None
        purpose, self.purpose = self.purpose, Purpose.BOOT
        # a restart serves the same config: nothing new to mark, unless it is a group's first boot restarted
        if purpose != Purpose.RESTART or self.good is None:
            pend, self.applying = self.applying, None
            if pend is not None:
                self.restarts, self.backoff = (), self.live.cfg.restart.backoff_initial_s   # a new config starts afresh
            self.good = self.live
            # saved as good before the decision is shown: once /status says "applied", a restart boots it
            fx(MarkGood(self.live))
            if pend is not None and purpose == Purpose.RELOAD:
                fx(RecordReload(pend.candidate, "applied", pend.live.cfg.hash))
            elif pend is not None and purpose == Purpose.ROLLBACK:
                fx(RecordReload(pend.candidate, "rolled_back", pend.live.cfg.hash, (reload.cause(self.reload_cause),),
                                tail=reload.tail(self.reload_cause)))
        self._apply_ready_candidate(fx)

    def _walk_failed(self, fx: Effects, failure: Failure) -> None:
        """The walk is over without a server: roll back to the last good config, or FAILED."""
        self.waiting = None
        self.last_failure = failure
        pend = self.applying
        if self.purpose == Purpose.RELOAD and pend is not None and self.good is not None:
            self.reload_cause = failure
            self._enter(fx, S.ROLLBACK, reload.cause(failure)[:200])
            self._begin_walk(fx, self.good, Purpose.ROLLBACK)
            return
        if pend is not None:
            causes: tuple[str, ...] = (reload.cause(failure),)
            if self.purpose == Purpose.ROLLBACK:
                causes = (reload.cause(self.reload_cause), "the rollback failed too: " + failure.reason)
            fx(RecordReload(pend.candidate, "failed", pend.live.cfg.hash, causes,
                            tail=reload.tail(self.reload_cause if self.purpose == Purpose.ROLLBACK else failure)))
            self.applying = None
        self._fail(fx, failure)

    # -- serving, crashes and restarts --------------------------------------------------------------
    def _crashed(self, fx: Effects, failure: Failure, now: float, *, relaunch: bool = False) -> None:
        spec = self.live.cfg.restart
        if not relaunch:
            fx(RecordFailure(failure))
            self.last_failure, self.last_rc = failure, failure.exit_code
            uptime = now - (self.served_since or now)
            self.backoff = policy.backoff_after_uptime(spec, uptime, self.backoff)
        decision = policy.after_crash(spec, failure, now=now, restarts=self.restarts, backoff_s=self.backoff,
                                      relaunch=relaunch)
        if isinstance(decision, policy.GiveUp):
            self._fail(fx, decision.failure)
            return
        if isinstance(decision, policy.CrashLoop):
            if self.state != S.RESTARTING:
                self._enter(fx, S.RESTARTING, failure.failure_class.value)
            fx(RecordFailure(decision.failure))
            self._fail(fx, decision.failure)
            return
        self._enter(fx, S.RESTARTING, failure.failure_class.value)
        assert self.rung is not None
        fx(RecordRestart(self.live.cfg.ladder.rungs[self.rung].name, decision.delay_s))
        self.restarts, self.backoff = decision.restarts, decision.next_backoff_s
        self.purpose = Purpose.RESTART
        self.restart_at = now + decision.delay_s
        self.waiting = None
        if decision.delay_s <= 0:
            self._relaunch(fx)

    def _on_Tick(self, ev: Tick, now: float, fx: Effects) -> None:
        if self.state == S.FAILED and self.release_at is not None and now >= self.release_at:
            self._shutdown(fx, policy.failed_exit_code(self.last_rc), "released: it can never serve")
            return
        if self.state == S.RESTARTING and self.waiting is None and self.restart_at is not None \
                and now >= self.restart_at:
            self._relaunch(fx)

    def _relaunch(self, fx: Effects) -> None:
        self.restart_at = None
        self.ran_before = True
        assert self.rung is not None
        fx(Barrier(self._wait("barrier")))

    # -- FAILED ------------------------------------------------------------------------------------
    def _fail(self, fx: Effects, failure: Failure | None) -> None:
        self.waiting = None
        self.purpose = Purpose.BOOT
        if failure is not None:
            self.last_failure = failure
        if self.state != S.FAILED:
            self._enter(fx, S.FAILED, failure.failure_class.value if failure else "")
        fx(Failed(failure))
        if self.exit_on_failure:
            self._shutdown(fx, policy.failed_exit_code(self.last_rc), "exit on failure")
            return
        self._apply_ready_candidate(fx)

    # -- published configs ----------------------------------------------------------------------
    def _on_CandidateChecked(self, ev: CandidateChecked, now: float, fx: Effects) -> None:
        if not self.accepts_candidates():
            return
        failed = self.state == S.FAILED
        decision = reload.decide(ev, self.live, failed=failed)
        if isinstance(decision, reload.Reject):
            fx(RecordReload(ev.candidate, "rejected", decision.config_hash, decision.causes))
            return
        assert ev.live is not None
        if self.candidate is not None and self.candidate.fetch is not None:
            fx(CancelTask(self.candidate.fetch))   # a newer config supersedes the one still downloading
        self.candidate = None
        if isinstance(decision, reload.Unchanged):
            self.live = replace(self.live, text=ev.live.text, origin=ev.live.origin)
            self.good = self.live
            fx(ShowConfig(self.live), MarkGood(self.live), RecordReload(ev.candidate, "unchanged", ev.live.cfg.hash))
            return
        if isinstance(decision, reload.FetchFirst):
            token = self._token()
            self.candidate = Pending(ev.candidate, ev.live, fetch=token)
            fx(Fetch(token, ev.live, candidate=True))   # beside the serving engine, which the loop keeps watching
            return
        self.candidate = Pending(ev.candidate, decision.live, ready=True)
        self._apply_ready_candidate(fx)

    def _apply_ready_candidate(self, fx: Effects) -> None:
        pend = self.candidate
        if pend is None or not pend.ready or not self.accepts_candidates():
            return
        self.candidate, self.applying = None, pend
        self._enter(fx, S.RELOADING, f"{pend.candidate.describe()} (config {pend.live.cfg.hash[:12]})")
        if self.engine is not None:
            fx(StopEngine(self.engine))
            self.engine = None
        self._begin_walk(fx, pend.live, Purpose.RELOAD)
