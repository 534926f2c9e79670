"""The loop: wait for an event (a signal, a child's exit, a task's answer, a published config, the timer),
let the machine decide (lifecycle/machine.py: pure), run the effects: each a `_do_<Effect>` of a line or
a few here, calling the file that does its work (run/__init__.py maps them). One thread owns the engine
process and the state; downloads, health waits, selftests and the reclaim barrier run as tasks (tasks.py)
and answer with events. No effect body is handed the loop: each gets values and callbacks."""

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
from ..config import DeployConfig
from ..errors import KilnError
from ..failure import Failure
from ..host import hardware
from ..ladder.memory import LadderMemory
from ..lifecycle import events as E
from ..lifecycle.machine import Machine
from ..lifecycle.policy import EXIT_NOTHING_SERVED
from ..lifecycle.state import Live, State
from ..process.managed import REGISTRY, ManagedProcess
from ..process.pid1 import SignalRelay, exit_code_for, reap_orphans
from ..redact import Secrets
from ..reload.book import ReloadBook
from . import launch, preflight, serving
from .cluster import ClusterNode, GroupLost
from .fetch import fetch_model
from .prefetch import WalkPrefetch
from .record import Record
from .reload import ReloadTracker
from .promptcache import PromptCache
from .runtime import Runtime, own_state_dir
from .tasks import Tasks
from .terminate import Terminator

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
    served: bool = False           # it reached SERVING: its prompt cache is worth saving before a stop


class Supervisor:
    def __init__(self, cfg: DeployConfig, opts: Options | None = None):
        self.opts = opts or Options()
        env = dict(os.environ if self.opts.env is None else self.opts.env)
        self.boot_cfg = cfg
        # A Serverless worker's or a cluster node's own state: a directory of its own beside the shared
        self.state_dir = own_state_dir(cfg, env)
        self.rec = Record(__version__, process_start=self.opts.process_start)
        self.rt = Runtime(env=env, state_dir=self.state_dir, rec=self.rec, secrets=Secrets(),
                          hardware_probe=self.opts.hardware_probe, gpu_used=self.opts.gpu_used,
                          shared_dir=Path(cfg.state_dir))
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.relay = SignalRelay(notify=lambda: self.inbox.put(_Wake()))
        self.tasks = Tasks(self.inbox.put)
        self.memory = LadderMemory(self.state_dir / "ladder-memory.json", writes=self.rt.writes)
        self.engines: dict[int, _Engine] = {}
        self.last_engine: _Engine | None = None
        self.last_exit_at: float | None = None      # when the last failed engine exited (rung switch time)
        self.machine: Machine | None = None
        self.exit_code: int | None = None
        self.reloads = ReloadTracker(ReloadBook(self.state_dir / "reload", self.rt.writes), self.rec, self.rt.secrets)
        self.peripherals: Any = None                # run/peripherals.py, started once the engine is on its way
        self.terminator = Terminator(self.rt.env, self.rec)    # run/terminate.py: a pod that can never serve
        self.prompt_cache = PromptCache(self.rt)                # run/promptcache.py: kept across the stops we make
        self.model_records: dict[str, dict[str, Any]] = {}   # model path -> its /status record, shown once it serves
        self.worker: Any = None                     # run/serverless.py ServerlessWorker, on a Serverless worker
        # the model prefetch of this walk (run/prefetch.py); the read in force is rt.prefetch
        self.prefetch = WalkPrefetch(self.rt, self.rec, process_start=self.opts.process_start, early=self.opts.prefetch)
        self.cluster = ClusterNode.of(env, cfg, self.rt, running=lambda: bool(self.engines), post=self.inbox.put)
        if cfg.serverless.active:
            from .serverless import ServerlessWorker

            self.worker = ServerlessWorker.of(cfg, self.rt)

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> int:
        self.relay.install()
        preflight.begin(self.rt, self.boot_cfg, status=self.opts.status)
        if self.worker is not None:
            self.worker.show()
        live = self.reloads.boot_live(self.boot_cfg, self.rt.env)
        sls = self.boot_cfg.serverless
        self.machine = Machine(live, exit_on_failure=self.opts.exit_on_failure,
                               release_after_s=sls.exit_grace_s if sls.active else None, group=bool(self.cluster.group))
        self.cluster.start()                        # its watcher beats and looks from now on
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
                elif isinstance(ev, GroupLost):   # a rank of the group is gone: this rank's engine goes too
                    ev = self.cluster.lost(ev, self.machine.engine, self.engines, self.boot_cfg.health.stop_grace_s)
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
            self.cluster.stop()
            for eng in list(self.engines.values()):
                eng.proc.stop(self.boot_cfg.health.stop_grace_s)
            REGISTRY.stop_all(1.0)
            self.terminator.leave(failed_for_good=self.opts.exit_on_failure and self.machine is not None
                                  and self.machine.last_failure is not None and self.rec.state == State.STOPPED)
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
            live=lambda: self.machine.live.cfg if self.machine else boot, api_key=lambda: self.rt.api_key,
            group=self.cluster.group))
        self.peripherals.start()

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
        failure = launch.down(self.rt, eng.proc, rung, returncode=rc)
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
        if fx.state in (State.HEALTHY, State.FAILED, State.STOPPING):
            self.prefetch.spent()               # loaded, or nothing will load it: a restart reads anew
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
        self.prefetch.ensure(fx.live)                 # a local model: read from now on, beside preflight
        failure, first = preflight.prepare(self.rt, fx.live.cfg, self.memory)
        failure = failure or (self.cluster.refused(fx.live.cfg) if fx.probe else None)
        self.inbox.put(E.Prepared(fx.token, failure, first))

    def _do_Fetch(self, fx: E.Fetch) -> None:
        fetch_model(fx.token, fx.live.cfg, candidate=fx.candidate, tasks=self.tasks, env=self.rt.env,
                    hub_token=self.rt.hub_token, secrets=self.rt.secrets, post=self.inbox.put,
                    show=lambda key, record: self.rec.update(**{key: record}), warn=self.rt.warn,
                    records=self.model_records)

    def _do_CheckLaunch(self, fx: E.CheckLaunch) -> None:
        self.rec.phase("launch", rung=fx.live.cfg.ladder.rungs[fx.index].name)
        self.prefetch.ensure(fx.live)
        failure = launch.check(self.rt, fx.live, fx.index)
        if failure is not None or self.cluster.group is None:   # else the group's launch order, in a task
            return self.inbox.put(E.LaunchChecked(fx.token, failure))
        self.tasks.start(fx.token, "group", *self.cluster.gate(lambda f: E.LaunchChecked(fx.token, f)))

    def _do_Barrier(self, fx: E.Barrier) -> None:
        self.rec.phase("reclaim")
        spec = (self.machine.live.cfg if self.machine else self.boot_cfg).ladder
        work = self.cluster.after(launch.barrier_work(self.rt, spec, lambda: E.BarrierDone(fx.token)),
                                  lambda f: E.BarrierDone(fx.token, f))   # then the group's launch order
        self.tasks.start(fx.token, "reclaim", work, on_error=lambda e: E.BarrierDone(fx.token))

    def _do_Launch(self, fx: E.Launch) -> None:
        proc = launch.launch_rung(self.rt, fx.live, fx.index, last_exit_at=self.last_exit_at)
        if isinstance(proc, Failure):
            self.inbox.put(E.EngineDown(fx.token, proc, started=False))
            return
        self.last_exit_at = None
        self.engines[fx.token] = self.last_engine = _Engine(proc, fx.live, fx.index)
        self.cluster.launched()                     # the group's epoch moves on with it
        threading.Thread(target=lambda: (proc.exited().wait(), self.inbox.put(_Exited(fx.token))),
                         name=f"kiln-exit-{proc.pid}", daemon=True).start()   # its exit is an event
        self.inbox.put(E.Launched(fx.token, proc.pid))

    def _do_WaitHealthy(self, fx: E.WaitHealthy) -> None:
        eng = self.engines[fx.token]
        work, on_error = launch.health_work(self.rt, eng.proc, eng.live.cfg, fx.token)
        if self.cluster.headless:        # no HTTP of its own: the primary's engine, within health.max_s
            work = self.cluster.health_work(eng.proc, eng.live.cfg.health.max_s, fx.token)
        self.tasks.start(fx.token, "health", work, on_error=on_error)

    def _do_RunSelftest(self, fx: E.RunSelftest) -> None:
        from .selftest import stage_work

        eng = self.engines[fx.token]
        if self.cluster.headless:                                 # the primary's selftest speaks for the group
            return self.inbox.put(self.cluster.no_selftest(fx.token))
        work, on_error = stage_work(self.rt, eng.live.cfg, eng.live.cfg.ladder.rungs[fx.index], eng.proc, fx.token)
        self.tasks.start(fx.token, "selftest", work, on_error=on_error)

    def _do_StopEngine(self, fx: E.StopEngine) -> None:
        eng = self.engines.pop(fx.token, None)
        if eng is None:
            return
        eng.stopping = True
        self.prompt_cache.before_stop(eng, planned=fx.stall_reason is None)
        eng.proc.stop(eng.live.cfg.health.stop_grace_s)   # reaps and drains the rest of the output
        if fx.stall_reason is not None:
            self.last_exit_at = eng.proc.exited_at
            failure = launch.down(self.rt, eng.proc, eng.live.cfg.ladder.rungs[eng.index], returncode=None,
                                  stall_reason=fx.stall_reason)
            self.inbox.put(E.EngineDown(fx.token, failure))

    def _do_Calibrate(self, fx: E.Calibrate) -> None:
        self.inbox.put(E.Calibrated(fx.token, launch.calibrate(self.rt, fx.rung, fx.failure)))

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
        self.terminator.serving()                   # a published config brought it back: keep the pod
        eng = self.engines.get(self.machine.engine) if self.machine.engine is not None else None
        self.prompt_cache.before_ready(eng)         # the last stop's prompt cache, before /ready says 200
        serving.serving(self.rt, self.machine.live, fx.index, self.memory, eng and eng.proc, self.model_records)
        if self.worker is not None:                 # it served: the key's failure witnesses were their hosts'
            self.worker.served(self.machine.live.cfg)

    def _do_Failed(self, fx: E.Failed) -> None:
        """FAILED: nothing retries it but a published config (run/terminate.py: a pod may end itself)."""
        failure = fx.failure
        why = f"{failure.failure_class.value}: {self.rt.secrets.redact(failure.reason)}" if failure else "unknown"
        log.error("FAILED: %s", why)
        if self.worker is not None and self.machine is not None:    # say why, record it; released after the grace
            self.worker.failed(why, self.machine.last_failure, self.machine.live.cfg,
                               served=self.machine.served_since is not None)
        self.terminator.failed((self.machine.live.cfg if self.machine else self.boot_cfg).runpod, why)

    def _do_Shutdown(self, fx: E.Shutdown) -> None:
        self.tasks.cancel_all()
        rc = 0
        for token, eng in list(self.engines.items()):
            eng.stopping = True
            self.prompt_cache.before_stop(eng, planned=fx.grace)       # TERM: scale-down, a replaced pod
            rc = eng.proc.stop(eng.live.cfg.health.stop_grace_s)
            del self.engines[token]
        if not self.engines and self.last_engine is not None and fx.code is None:
            rc = self.last_engine.proc.stop(0.0)   # already stopped: its status
        REGISTRY.stop_all(self.boot_cfg.health.stop_grace_s)
        self.exit_code = fx.code if fx.code is not None else exit_code_for(rc)


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


__all__ = ["Options", "Supervisor", "run"]
