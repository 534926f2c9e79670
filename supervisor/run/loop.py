"""The lifecycle loop: wait for an event, let the machine decide, run the effects.

    signal / child exit / task answer / published config / timer
        -> Machine.step (machine.py: pure; the decisions live in policy.py and lifecycle/reload.py)
        -> effects: state transitions, checks, launches, stops, tasks started beside the loop

One thread (the main one) owns the engine process and the state; downloads, health waits,
selftests and the reclaim barrier run as tasks (tasks.py) and answer with events, so the loop
keeps watching the engine while they run. Each effect has its handler here (`_do_<Effect>`), which
calls the part that does the work, given what it needs and never the loop:

    preflight.py              what must hold before a config runs; where the walk starts
    run/fetch.py         the model into the volume (Fetch)
    run/launch.py         a rung's checks, its start, why it went down (one classify call)
    ladder/reclaim.py         the barrier between rungs (Barrier)
    ladder/balanced.py        a balanced rung's split re-planned after an OOM (Calibrate)
    engines/health.py         the health wait (WaitHealthy)
    run/selftest.py         the SELFTEST stage (RunSelftest)
    run/reload.py         the reload book: boot from last good, record a decision, mark good
    ladder/residency.py         how much of a serving model stayed in host RAM (Serving)
    fleet/self_terminate.py   a pod that can never serve terminates itself (Failed)
    run/serverless.py      a Serverless worker: who it is; a deterministic failure recorded on the
                              shared volume (Failed) and recalled before anything is fetched (Prepare)
    peripherals.py            status page, TCP relay, config watcher, fleet reporter: started at
                              the loop's first idle moment (P1), wired with callbacks
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from .. import __version__
from ..lifecycle import events as E
from . import preflight
from ..host import hardware
from . import launch
from ..engines import registry
from ..process import leftovers
from ..config import DeployConfig
from ..errors import KilnError
from ..failure import Failure, FailureClass
from ..ladder.memory import LadderMemory
from ..ladder.reclaim import reclaim
from ..ladder import residency
from .fetch import fetch_model
from ..reload.book import ReloadBook
from .reload import ReloadTracker
from ..lifecycle.machine import Machine
from ..process.pid1 import SignalRelay, become_subreaper, exit_code_for, reap_orphans
from ..lifecycle.policy import EXIT_NOTHING_SERVED
from ..process.managed import REGISTRY, ManagedProcess
from ..redact import Secrets
from .runtime import Runtime
from ..lifecycle.state import Live, Origin, State
from .record import Record
from .tasks import Task, Tasks
from .logs import engine_lines

log = logging.getLogger("kiln")
EXIT_USAGE = 2            # the supervisor could not even start (a busy status port, say)
_IDLE_WAKE_S = 1.0        # the loop looks around at least this often (reap orphans, candidates)


@dataclass
class Options:
    exit_on_failure: bool = False
    hardware_probe: Callable[[], hardware.Hardware] = hardware.probe
    gpu_used: Callable[[], list[int] | None] = hardware.gpu_memory_used_mib
    env: Mapping[str, str] | None = None
    status: bool = True
    process_start: float | None = None     # when this process was exec'd (monotonic): timeline.py
    prefetch: Any = None                   # model/prefetch.py begin()'s, started before the loop was built


@dataclass(frozen=True)
class _Exited:
    """Internal: the engine process of a launch exited (the loop classifies it)."""
    token: int


@dataclass(frozen=True)
class _Wake:
    """Internal: a signal arrived, or the watcher has a candidate."""


@dataclass
class _Engine:
    proc: ManagedProcess
    live: Live
    index: int
    stopping: bool = False         # we stopped it: its exit is not news


class Supervisor:
    def __init__(self, cfg: DeployConfig, opts: Options | None = None):
        self.opts = opts or Options()
        env = dict(os.environ if self.opts.env is None else self.opts.env)
        self.boot_cfg = cfg
        # A Serverless worker keeps its own state in a directory of its own on the shared volume
        # (runpod_env.py); what all workers share stays at state_dir.
        self.state_dir = Path(cfg.state_dir)
        if cfg.serverless.active:
            from ..runpod_env import worker_dir

            self.state_dir = worker_dir(cfg.state_dir, env)
        self.rec = Record(__version__, process_start=self.opts.process_start)
        self.rt = Runtime(env=env, state_dir=self.state_dir, rec=self.rec, secrets=Secrets(),
                          hardware_probe=self.opts.hardware_probe, gpu_used=self.opts.gpu_used,
                          shared_dir=Path(cfg.state_dir))
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.relay = SignalRelay(notify=lambda: self.inbox.put(_Wake()))
        self.tasks = Tasks(self.inbox.put)
        self.memory = LadderMemory(self.state_dir / "ladder-memory.json")
        self.engines: dict[int, _Engine] = {}
        self.last_engine: _Engine | None = None
        self.last_exit_at: float | None = None      # when the last failed engine exited (rung switch time)
        self.machine: Machine | None = None
        self.exit_code: int | None = None
        self.reloads = ReloadTracker(ReloadBook(self.state_dir / "reload"), self.rec, self.rt.secrets)
        self.peripherals: Any = None                # run/peripherals.py, started once the engine is on its way
        self.terminator: Any = None                 # fleet/self_terminate.py Termination, while FAILED with it on
        self.model_records: dict[str, dict[str, Any]] = {}   # model path -> its /status record, shown once it serves
        self.worker: Any = None                     # run/serverless.py ServerlessWorker, on a Serverless worker
        # the model prefetch of this walk is rt.prefetch (the launch asks whether one reads: boot_args)
        self._shown_prefetch: Any = None            # the one /status shows: its end is the news, even after the walk
        early = self.opts.prefetch
        if early is not None:                       # begun before this was built: kept if preflight plans the same files
            self.rt.prefetch = self._shown_prefetch = early
            self.rec.update(prefetch=self._prefetch_shown(early))
            early.adopt(self._prefetch_done)
        if cfg.serverless.active:
            from .serverless import ServerlessWorker

            self.worker = ServerlessWorker(cfg.serverless, shared=Path(cfg.state_dir), own=self.state_dir,
                                           status_port=cfg.status.port, env=env, rec=self.rec,
                                           secrets=self.rt.secrets, warn=self.rt.warn, hardware=lambda: self.rt.hw)

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> int:
        self.relay.install()
        become_subreaper()
        self.rt.run_dir.mkdir(parents=True, exist_ok=True)
        leftovers.end_leftovers(self.rt.run_dir, log)
        REGISTRY.journal_to(self.rt.run_dir)
        from .. import hubclient
        self.rt.hub_token = hubclient.token(self.rt.env)
        self.rt.secrets.add(self.rt.hub_token, self.rt.env.get("HF_TOKEN"), self.rt.env.get("RUNPOD_API_KEY"))
        if self.worker is not None:
            self.worker.show()
        if self.opts.status:        # a busy status port is one clear line before anything starts
            from ..status.listen import STATUS_PORT_FIX, check_free
            check_free("status.port", self.boot_cfg.status.host, self.boot_cfg.status.port, STATUS_PORT_FIX)
        live = self.reloads.boot_live(self.boot_cfg, self.rt.env)
        sls = self.boot_cfg.serverless
        self.machine = Machine(live, exit_on_failure=self.opts.exit_on_failure,
                               release_after_s=sls.exit_grace_s if sls.active else None)
        try:
            self._apply(self.machine.start())
            while self.exit_code is None:
                self._drain_signals()
                self._offer_candidate()
                if self.exit_code is not None:
                    break
                try:
                    ev = self.inbox.get(timeout=self._timeout())
                except queue.Empty:
                    if self.peripherals is None:    # idle: a wake-up may have taken the moment after a step
                        self._start_peripherals()
                        continue
                    ev = E.Tick()
                if isinstance(ev, _Wake):
                    continue
                if isinstance(ev, E.SelftestDone) and ev.token in self.engines \
                        and not self.engines[ev.token].proc.alive():
                    # The engine died under the selftest: its death decides, not the report the
                    # selftest finished with (its last request failed with the connection).
                    self.engines[ev.token].proc.exited().wait(5.0)
                    ev = _Exited(ev.token)
                if isinstance(ev, _Exited):
                    ev = self._exited(ev.token)
                    if ev is None:
                        continue
                self._step(ev)
                if self.peripherals is None and self.inbox.empty():
                    self._start_peripherals()       # the engine is on its way: now the status page and the rest
        except KilnError as e:
            log.error("%s", e)
            self.exit_code = EXIT_USAGE
        finally:
            if self.rt.prefetch is not None:
                self.rt.prefetch.stop()
            self.tasks.cancel_all()
            for eng in list(self.engines.values()):
                eng.proc.stop(self.boot_cfg.health.stop_grace_s)
            REGISTRY.stop_all(1.0)
            self._stop_terminator()
            if self.peripherals is not None:
                self.peripherals.stop()
        return self.exit_code

    def _start_peripherals(self) -> None:
        from .peripherals import Peripherals, Wiring

        boot = self.boot_cfg

        def engine_port() -> int:
            return self.machine.live.cfg.server.port if self.machine else boot.server.port

        self.peripherals = Peripherals(boot, Wiring(
            snapshot=self.rec.snapshot, wake=lambda: self.inbox.put(E.Tick()), engine_port=engine_port,
            secrets=lambda: list(self.rt.secrets), seen=self.reloads.book.seen, warn=self.rt.warn,
            env=self.rt.env, hub_token=self.rt.hub_token, status=self.opts.status, probe=self.rec.probe,
            live=lambda: self.machine.live.cfg if self.machine else boot, api_key=lambda: self.rt.api_key))
        self.peripherals.start()

    def _stop_terminator(self) -> None:
        """Leaving FAILED for good on exit_on_failure: let the pod go first. Any other exit: keep it."""
        if self.terminator is None:
            return
        failed_for_good = self.opts.exit_on_failure and self.machine is not None \
            and self.machine.last_failure is not None and self.rec.state == State.STOPPED
        if failed_for_good:
            self.terminator.wait(self.terminator.grace_s + 60.0)
        else:
            self.terminator.cancel()

    def _timeout(self) -> float:
        deadline = self.machine.next_deadline() if self.machine else None
        if deadline is None:
            return _IDLE_WAKE_S if self.peripherals is not None else 0.05
        return max(0.0, min(deadline - time.monotonic(), _IDLE_WAKE_S))

    def _step(self, ev: Any) -> None:
        assert self.machine is not None
        self._apply(self.machine.step(ev, time.monotonic()))

    def _drain_signals(self) -> None:
        for sig in self.relay.pending():
            if sig in (signal.SIGTERM, signal.SIGINT):
                log.info("received %s: stopping", signal.Signals(sig).name)
            elif sig == signal.SIGHUP:
                log.info("received SIGHUP: forwarding to the engine's process group")
            self._step(E.Signal(sig))
            if self.exit_code is not None:
                return
        reap_orphans(REGISTRY.pids())

    def _offer_candidate(self) -> None:
        """A published config the watcher found, validated while the server keeps serving."""
        if self.machine is None or not self.machine.accepts_candidates() or self.peripherals is None:
            return
        cand = self.peripherals.take_candidate()
        if cand is not None:
            self._step(self.reloads.check(cand, self.machine.live, env=self.rt.env,
                                          hw=self.rt.hw or self.rt.hardware_probe()))

    def _exited(self, token: int) -> E.EngineDown | None:
        eng = self.engines.get(token)
        if eng is None or eng.stopping:
            return None
        rc = eng.proc.stop(0.0)                   # reaps and drains the rest of the output
        self.last_exit_at = eng.proc.exited_at
        rung = eng.live.cfg.ladder.rungs[eng.index]
        elapsed = (eng.proc.exited_at or time.monotonic()) - eng.proc.started_at
        failure = launch.down(self.rt, eng.proc, rung, returncode=rc, elapsed_s=elapsed)
        if self.rec.state == State.SELFTEST:
            from .selftest import crashed_record
            crashed_record(self.rt, rung, rc)
        del self.engines[token]
        return E.EngineDown(token, failure)

    # -- effects -----------------------------------------------------------------------------------
    def _apply(self, effects: list[E.Effect]) -> None:
        for fx in effects:
            getattr(self, "_do_" + type(fx).__name__)(fx)

    def _do_Enter(self, fx: E.Enter) -> None:
        self.rec.transition(fx.state, fx.detail)
        if fx.state in (State.HEALTHY, State.FAILED, State.STOPPING) and self.rt.prefetch is not None:
            self.rt.prefetch.stop()             # the weights are loaded, or nothing will load them:
            self.rt.prefetch = None             # spent; a restart or reload reads anew (or goes without)
        log.info("state %s%s", fx.state.value, f": {fx.detail}" if fx.detail else "")
        if self.peripherals is not None:
            self.peripherals.state_changed(fx.state)

    def _do_ShowConfig(self, fx: E.ShowConfig) -> None:
        live, o = fx.live, fx.live.origin
        self.rec.update(config={"hash": live.cfg.hash, "source": live.cfg.source, "from": o.channel,
                                "origin": o.where, "revision": o.revision, "since": round(time.time(), 3)})
        log.info("config live: hash %s from %s%s", live.cfg.hash[:12], o.where,
                 f" at revision {o.revision}" if o.revision else "")

    def _do_Prepare(self, fx: E.Prepare) -> None:
        self.rec.phase("preflight")
        if fx.probe:
            preflight.probe(self.rt)
            recorded = self.worker.recall(fx.live.cfg) if self.worker is not None else None
            if recorded is not None:            # nothing fetched, nothing loaded: FAILED, then released
                self.inbox.put(E.Prepared(fx.token, recorded, 0))
                return
        self._prefetch(fx.live)                 # a local model: read from now on, beside preflight
        failure, first = preflight.prepare(self.rt, fx.live.cfg, self.memory)
        self.inbox.put(E.Prepared(fx.token, failure, first))

    def _prefetch(self, live: Live) -> None:
        """Start reading the model's weights into the page cache (model/prefetch.py), unless the same
        files are being read already; what it did, or why not, is /status `prefetch`. Never raises:
        it only makes a boot faster, and PID 1 must not end over it."""
        try:
            self._start_prefetch(live)
        except Exception as e:                 # a file gone between listing and opening, no thread left
            self._drop_prefetch()
            self.rec.update(prefetch={"state": "skipped", "note": f"could not start: {type(e).__name__}: {e}"})

    def _start_prefetch(self, live: Live) -> None:
        from ..model import prefetch, resolve

        path = live.model_path
        if path is None:
            try:
                path = resolve.resolve(live.cfg)       # None for hf://: the fetch finds it, CheckLaunch starts it
            except KilnError:                          # the fetch step names what is wrong with the source
                path = None
        if path is None:
            self._drop_prefetch()                      # an early read of another model must not compete with the fetch
            return
        try:
            planned, why = prefetch.plan(live.cfg, live.cfg.engine, path, hardware.ram_available_bytes(), self.rt.env)
        except OSError as e:                           # a file vanished between the listing and its size
            planned, why = [], f"could not list the weights: {e.strerror or e}"
        files = [p for p, _ in planned]
        running = self.rt.prefetch
        if running is not None and running.files == files and running.useful:
            return                                     # the same files, being read or read whole in this walk
        self._drop_prefetch()
        if why:
            self.rec.update(prefetch={"state": "skipped", "note": why})
            return

        p = prefetch.Prefetch(files, sizes=[n for _, n in planned], streams=live.cfg.startup.prefetch_streams,
                              on_done=self._prefetch_done)
        self.rt.prefetch = self._shown_prefetch = p
        self.rec.update(prefetch=self._prefetch_shown(p))     # before start(): its end's update comes after
        p.start()

    def _drop_prefetch(self) -> None:
        """Stop the read of files this boot does not plan (the early one of a config replaced since)."""
        if self.rt.prefetch is not None:
            self.rt.prefetch.stop()
            self.rt.prefetch = self._shown_prefetch = None
            self.rec.update(prefetch=None)

    def _prefetch_shown(self, p: Any) -> dict[str, Any]:
        """/status `prefetch`: what it read, and `start_s`, when it began after the process's exec
        (the boot timeline's zero): the earlier, the more of the read is done when the engine needs it."""
        d = p.to_dict()
        zero = self.opts.process_start if self.opts.process_start is not None else self.rec.boot_monotonic
        d["start_s"] = round((p.started if p.started is not None else time.monotonic()) - zero, 3)
        return d

    def _prefetch_done(self, p: Any) -> None:
        if self._shown_prefetch is not p:              # replaced: its late end is not the news
            return
        d = self._prefetch_shown(p)
        self.rec.update(prefetch=d)
        self.rec.event("prefetch", f"{p.state}: {p.read / 2**30:.2f} of {p.total / 2**30:.2f} GiB "
                                   f"in {d['seconds']} s ({p.streams} streams)")

    def _do_Fetch(self, fx: E.Fetch) -> None:
        def on_record(key: str, path: Path, record: dict[str, Any]) -> None:
            self.model_records[str(path)] = record
            self.rec.update(**{key: record})

        fetch_model(fx.token, fx.live.cfg, candidate=fx.candidate, tasks=self.tasks, env=self.rt.env,
                    hub_token=self.rt.hub_token, secrets=self.rt.secrets, post=self.inbox.put,
                    show=lambda key, record: self.rec.update(**{key: record}), on_record=on_record,
                    warn=self.rt.warn)

    def _do_CheckLaunch(self, fx: E.CheckLaunch) -> None:
        self.rec.phase("launch", rung=fx.live.cfg.ladder.rungs[fx.index].name)
        self._prefetch(fx.live)
        self.inbox.put(E.LaunchChecked(fx.token, launch.check(self.rt, fx.live, fx.index)))

    def _do_Barrier(self, fx: E.Barrier) -> None:
        spec = self.machine.live.cfg.ladder if self.machine else self.boot_cfg.ladder
        self.rec.phase("reclaim")

        def work(task: Task) -> E.BarrierDone:
            rep = reclaim(REGISTRY, baseline_mib=self.rt.baseline_mib, gpu_used=self.rt.gpu_used_visible,
                          timeout_s=spec.reclaim_timeout_s, slack_mib=spec.reclaim_slack_mib,
                          sleep=task.cancelled.wait)
            self.rec.event("reclaim", rep.describe())
            if rep.vram_back is False:
                self.rt.warn(f"GPU memory did not return to its baseline between rungs: {rep.describe()}")
            return E.BarrierDone(fx.token)

        self.tasks.start(fx.token, "reclaim", work, on_error=lambda e: E.BarrierDone(fx.token))

    def _do_Launch(self, fx: E.Launch) -> None:
        watch = self.rec.boot.engine(getattr(self.rt.engine, "PHASES", ()), fx.live.cfg.ladder.rungs[fx.index].name)

        started = launch.start(self.rt, fx.live.cfg, fx.index, fx.live.model_path, on_line=watch.line,
                               on_lines=engine_lines)
        if isinstance(started, Failure):
            self.inbox.put(E.EngineDown(fx.token, started, started=False))
            return
        proc = started
        watch.arm(proc.started_at)             # the boot timeline's engine_exec, then the engine's own phases
        if self.last_exit_at is not None:      # from the failed rung's exit to this one's start (P6)
            switch = proc.started_at - self.last_exit_at
            self.rt.timing(last_rung_switch_s=switch)
            log.info("rung switch took %.3f s", switch)
            self.last_exit_at = None
        eng = _Engine(proc, fx.live, fx.index)
        self.engines[fx.token] = eng
        self.last_engine = eng

        def wake_on_exit() -> None:
            proc.exited().wait()
            self.inbox.put(_Exited(fx.token))

        threading.Thread(target=wake_on_exit, name=f"kiln-exit-{proc.pid}", daemon=True).start()
        self.inbox.put(E.Launched(fx.token, proc.pid))

    def _do_WaitHealthy(self, fx: E.WaitHealthy) -> None:
        from ..engines.health import wait_healthy

        eng = self.engines[fx.token]
        cfg = eng.live.cfg

        def work(task: Task) -> E.HealthDone | None:
            out = wait_healthy(eng.proc, cfg.server.host, cfg.server.port, stall_s=cfg.health.stall_s,
                               max_s=cfg.health.max_s, poll_s=cfg.health.poll_s,
                               should_stop=task.cancelled.is_set, sleep=task.cancelled.wait,
                               stall_lines=self.rt.engine.STALL_LINES if self.rt.engine else None)
            if out.ready:
                self.rt.timing(last_load_s=out.elapsed_s)
                return E.HealthDone(fx.token, True, out.elapsed_s)
            if out.stalled:
                return E.HealthDone(fx.token, False, out.elapsed_s, out.reason or "stalled")   # health.py says why
            return None                            # exited (the exit event tells) or cancelled

        self.tasks.start(fx.token, "health", work,
                         on_error=lambda e: E.HealthDone(fx.token, False, 0.0, f"health wait failed: {e}"))

    def _do_RunSelftest(self, fx: E.RunSelftest) -> None:
        from .selftest import run_stage

        eng = self.engines[fx.token]
        rung = eng.live.cfg.ladder.rungs[fx.index]
        self.tasks.start(fx.token, "selftest",
                         lambda task: E.SelftestDone(fx.token, run_stage(self.rt, eng.live.cfg, rung, eng.proc,
                                                                         list(eng.proc.argv), task)),
                         on_error=lambda e: E.SelftestDone(fx.token, Failure(
                             FailureClass.SELFTEST_FAILED, f"selftest: {type(e).__name__}: {e}", rung=rung.name)))

    def _do_StopEngine(self, fx: E.StopEngine) -> None:
        eng = self.engines.pop(fx.token, None)
        if eng is None:
            return
        eng.stopping = True
        rc = eng.proc.stop(eng.live.cfg.health.stop_grace_s)   # reaps and drains the rest of the output
        if fx.stall_reason is not None:
            self.last_exit_at = eng.proc.exited_at
            rung = eng.live.cfg.ladder.rungs[eng.index]
            failure = launch.down(self.rt, eng.proc, rung, returncode=None, elapsed_s=eng.proc.exited_at
                                  and eng.proc.exited_at - eng.proc.started_at, stall_reason=fx.stall_reason)
            self.inbox.put(E.EngineDown(fx.token, failure))
        del rc

    def _do_Calibrate(self, fx: E.Calibrate) -> None:
        """The balanced rung's split re-planned from the OOM's shortfall lines (ladder/balanced.py),
        or the environment a failure asks for set on the rung's relaunches (the engine's RELAUNCH_ENV,
        merged with what earlier failures asked for): not when the launch that failed already had it,
        so the same failure is never relaunched into again."""
        forced = registry.relaunch_env(self.rt.engine).get(fx.failure.failure_class)
        if forced is not None:
            launched = self.rt.launched_env.get(fx.rung, {})
            ok = any(launched.get(k) != v for k, v in forced.items())
            if ok:
                self.rt.relaunch_env[fx.rung] = {**self.rt.relaunch_env.get(fx.rung, {}), **forced}
                self.rec.event("relaunch", f"{fx.rung}: {fx.failure.reason}; relaunched with "
                                           f"{', '.join(f'{k}={v}' for k, v in forced.items())}")
            self.inbox.put(E.Calibrated(fx.token, ok))
            return
        bal = self.rt.balancers.get(fx.rung)
        ok = bal is not None and bal.calibrate(fx.failure.tail) is not None
        if ok:
            self.rec.update(placement={"rung": fx.rung, "rounds": bal.history})
            self.rec.event("calibrate", f"{fx.rung}: new budgets {bal.budgets} MiB after "
                                        f"{bal.history[-1]['shortfall_mib']}")
        self.inbox.put(E.Calibrated(fx.token, ok))

    def _do_CancelTask(self, fx: E.CancelTask) -> None:
        self.tasks.cancel(fx.token)

    def _do_ForwardSignal(self, fx: E.ForwardSignal) -> None:
        for eng in self.engines.values():
            eng.proc.signal_group(fx.signum)

    def _do_RecordFailure(self, fx: E.RecordFailure) -> None:
        self.rt.record_failure(fx.failure)

    def _do_RecordRestart(self, fx: E.RecordRestart) -> None:
        self.rec.bump("restarts")
        log.info("restarting rung %s in %.2f s", fx.rung, fx.delay_s)

    def _do_RecordReload(self, fx: E.RecordReload) -> None:
        self.reloads.record(fx, live_hash=self.machine.live.cfg.hash if self.machine else "")
        if self.peripherals is not None:          # the verdict goes to the fleet record
            self.peripherals.report()

    def _do_MarkGood(self, fx: E.MarkGood) -> None:
        self.reloads.mark_good(fx.live)

    def _do_Serving(self, fx: E.Serving) -> None:
        """Before /ready says 200: the winning rung remembered, the timings, the placement estimate."""
        assert self.machine is not None
        live = self.machine.live
        preflight.remember(self.rt, live.cfg, self.memory, live.cfg.ladder.rungs[fx.index].name)
        eng = self.engines.get(self.machine.engine) if self.machine.engine is not None else None
        if eng is not None:                        # its boot phases are read: gather its output (P2b)
            eng.proc.batch_output(ENGINE_OUTPUT_BATCH_S)
        if "boot_to_ready_s" not in self.rec.snapshot()["timings"]:
            self.rt.timing(boot_to_ready_s=time.monotonic() - self.rec.boot_monotonic)
        if self.terminator is not None:            # a published config brought it back: keep the pod
            self.terminator.cancel()
            self.rec.update(runpod_terminate=self.terminator.to_dict())
            self.terminator = None
        record = self.model_records.get(str(live.model_path))
        if record is not None:
            self.rec.update(model=record, model_candidate=None)
        estimate, warning = residency.estimate(live.cfg, live.model_path, self.rt.hw,
                                               gpu_used=self.rt.gpu_used_visible, baseline_mib=self.rt.baseline_mib)
        if estimate is not None:
            self.rec.update(placement_estimate=estimate)
        if warning:
            self.rt.warn(warning)

    def _do_Failed(self, fx: E.Failed) -> None:
        """FAILED: nothing retries it but a published config. On RunPod, with [runpod]
        terminate_on_terminal_failure, the pod is terminated after a grace (fleet/self_terminate.py)."""
        failure = fx.failure
        why = f"{failure.failure_class.value}: {self.rt.secrets.redact(failure.reason)}" if failure else "unknown"
        log.error("FAILED: %s", why)
        if self.worker is not None and self.machine is not None:    # say why, record it; released after the grace
            self.worker.failed(why, self.machine.last_failure, self.machine.live.cfg)
        spec = self.machine.live.cfg.runpod if self.machine else self.boot_cfg.runpod
        if self.terminator is None and spec.terminate_on_terminal_failure:
            from ..fleet import self_terminate

            self.terminator = self_terminate.arm(spec, self.rt.env, failure=why, on_event=self.rec.event)
            if self.terminator is not None:
                self.rec.update(runpod_terminate=self.terminator.to_dict())

    def _do_Shutdown(self, fx: E.Shutdown) -> None:
        self.tasks.cancel_all()
        rc = 0
        for token, eng in list(self.engines.items()):
            eng.stopping = True
            rc = eng.proc.stop(eng.live.cfg.health.stop_grace_s)
            del self.engines[token]
        if not self.engines and self.last_engine is not None and fx.code is None:
            rc = self.last_engine.proc.stop(0.0)   # already stopped: its status
        REGISTRY.stop_all(self.boot_cfg.health.stop_grace_s)
        self.exit_code = fx.code if fx.code is not None else exit_code_for(rc)


# A serving engine's output is read at most this often: llama-server writes each of a request's ~10
# lines on its own, and a read per line cost the supervisor more CPU than all else while serving
# (P2b, bench/engine_output.py). A tenth of a second late in `docker logs` and the log file is unseen.
ENGINE_OUTPUT_BATCH_S = 0.1


def run(cfg: DeployConfig, opts: Options | None = None) -> int:
    from ..status.listen import CannotListen

    try:
        return Supervisor(cfg, opts).run()
    except CannotListen as e:            # the status port: a usage error, said in one line
        log.error("%s", e)
        return EXIT_USAGE
    except KilnError as e:
        log.error("%s", e)
        return EXIT_NOTHING_SERVED


__all__ = ["Options", "Supervisor", "run", "Origin"]
