"""What surrounds the lifecycle loop and reports to it: the status page, the TCP relay, the config
watcher, the fleet reporter, the reload book and the model fetch. None of them decides anything;
the machine does.

They start once the engine is on its way (the loop calls `start()` the first time it has nothing
else to do), so a boot pays for none of their imports before the engine is launched (P1).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from . import events as E
from ..config import DeployConfig
from ..errors import Cancelled, FetchError
from ..failure import Failure, FailureClass
from ..reload.decide import HISTORY_KEEP, ReloadBook, adopt_last_good, record_decision, status_record
from .state import Live, Origin, State

if TYPE_CHECKING:
    from .loop import Supervisor

log = logging.getLogger("kiln")
SETTLED = (State.SERVING, State.FAILED, State.RESTARTING, State.STOPPED)


class Services:
    def __init__(self, sup: "Supervisor"):
        self.sup = sup
        self.rt = sup.rt
        self.rec = sup.rec
        self.book = ReloadBook(sup.state_dir / "reload")
        self.started = False
        self.status: Any = None
        self.tcp: Any = None
        self.watcher: Any = None
        self.reporter: Any = None                 # supervisor/fleet/reporter.py, with a [watch] repo that reports
        self.base_hash = ""
        self._taken: dict[int, float] = {}        # id(candidate) -> when the loop took it
        self.terminator: Any = None               # runpod_self.Termination while FAILED with the option on

    # -- boot and shutdown -----------------------------------------------------------------------
    def boot_live(self, cfg: DeployConfig) -> Live:
        """The image's config, or the last published one that served when it replaced this very config."""
        self.base_hash = cfg.hash
        self.rec.update(reload=status_record(self.book.history(HISTORY_KEEP)))
        found = adopt_last_good(self.book, cfg, self.rt.env) if cfg.watch.enabled else None
        if found is None:
            return Live(cfg, origin=Origin("boot", cfg.source))
        good_cfg, text, origin = found
        self.rec.event("config", f"booting the last good published config {good_cfg.hash[:12]} ({origin.where})")
        return Live(good_cfg, text=text, origin=origin)

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        cfg = self.sup.boot_cfg
        if self.sup.opts.status:
            from ..status.server import StatusServer

            self.status = StatusServer(cfg.status.host, cfg.status.port, self.snapshot,
                                       secrets=lambda: list(self.rt.secrets))
            self.status.start()
        if cfg.server.tcp_port:
            self._start_tcp_relay(cfg.server.tcp_port)
        if cfg.watch.enabled:
            from ..model.fetch import cache_dir
            from ..reload.watch import Watcher

            pod = None
            if cfg.watch.reporting and not self.rt.hub_token:
                log.info("fleet report: off, no Hub token to write with (HF_TOKEN or a secret file); this pod "
                         "reads configs but neither reports nor takes canaries")
            elif cfg.watch.reporting:
                from ..fleet.record import pod_id
                from ..fleet.reporter import Reporter

                pod = pod_id(self.rt.env)
                self.reporter = Reporter(cfg.watch, pod=pod, token=self.rt.hub_token, snapshot=self.snapshot,
                                         secrets=lambda: list(self.rt.secrets))
            self.watcher = Watcher(cfg.watch, cache=cache_dir(cfg), token=self.rt.hub_token, seen=self.book.seen(),
                                   wake=lambda: self.sup.inbox.put(E.Tick()), secrets=lambda: list(self.rt.secrets),
                                   pod=pod)
            self.watcher.start()
            if self.reporter is not None:
                self.reporter.start()

    def stop(self, *, failed_for_good: bool = False) -> None:
        if self.terminator is not None:
            if failed_for_good:                    # leaving FAILED on exit_on_failure: let the pod go first
                self.terminator.wait(self.terminator.grace_s + 60.0)
            else:
                self.terminator.cancel()
        for part in (self.watcher, self.reporter, self.tcp, self.status):   # the reporter's last record: STOPPED
            if part is not None:
                part.stop()

    def state_changed(self, state: State) -> None:
        """The loop entered a state. A settled one is news for the fleet record (the reporter paces
        the writes); the steps of a walk are not: each would cost a commit and hold the verdict
        that follows back by one write interval. The heartbeat shows a long walk."""
        if self.reporter is not None and state in SETTLED:
            self.reporter.poke()

    def snapshot(self) -> dict[str, Any]:
        snap = self.rec.snapshot()
        if self.watcher is not None:
            snap["watch"] = self.watcher.status()
            if self.reporter is not None:
                snap["watch"]["report"] = self.reporter.status()
        if self.tcp is not None:
            snap["tcp_relay"] = self.tcp.status()
        return snap

    def _start_tcp_relay(self, port: int) -> None:
        """The TCP port is a convenience beside the HTTP one: a busy port is a warning, not a failure."""
        from ..status.relay import TcpRelay

        machine = self.sup.machine
        relay = TcpRelay(self.sup.boot_cfg.server.host, port, self.sup.boot_cfg.server.host,
                         lambda: machine.live.cfg.server.port if machine else self.sup.boot_cfg.server.port)
        try:
            relay.start()
        except OSError as e:
            self.rt.warn(f"TCP relay not started: port {port}: {e.strerror or e}")
            return
        self.tcp = relay
        log.info("TCP relay: port %d -> the engine's port", port)

    # -- the config on /status ---------------------------------------------------------------------
    def show_config(self, live: Live) -> None:
        o = live.origin
        self.rec.update(config={"hash": live.cfg.hash, "source": live.cfg.source, "from": o.channel,
                                "origin": o.where, "revision": o.revision, "since": round(time.time(), 3)})
        log.info("config live: hash %s from %s%s", live.cfg.hash[:12], o.where,
                 f" at revision {o.revision}" if o.revision else "")

    # -- the model -----------------------------------------------------------------------------
    def fetch(self, token: int, live: Live, *, candidate: bool) -> None:
        """The model file for live's config: local at once, or fetched from the Hub in a task."""
        from ..model import resolve as model

        cfg = live.cfg
        key = "model_candidate" if candidate else "model"
        try:
            local = model.resolve(cfg)
        except FetchError as e:
            self.sup.inbox.put(E.ModelReady(token, failure=self._load_error(e)))
            return
        if local is not None:
            self._model_record(key, local, {"source": cfg.model.source, "path": str(local)})
            self.sup.inbox.put(E.ModelReady(token, path=local))
            return
        from ..model import fetch

        logged = [0.0]

        def progress(ev: dict[str, Any]) -> None:
            self.rec.update(**{key: {"source": cfg.model.source, "fetch": ev}})
            if ev.get("event") != "progress" or time.monotonic() - logged[0] >= 10.0:
                logged[0] = time.monotonic()
                log.info("model fetch: %s", " ".join(f"{k}={v}" for k, v in ev.items()))

        def work(task: Any) -> E.ModelReady | None:
            try:
                res = fetch.fetch(cfg, self.rt.env, token=self.rt.hub_token, should_stop=task.cancelled.is_set,
                                  sleep=task.cancelled.wait, report=progress, secrets=list(self.rt.secrets))
            except Cancelled:
                return None
            except FetchError as e:
                return E.ModelReady(token, failure=self._load_error(e))
            self._model_record(key, res.path, {"source": cfg.model.source, "revision": cfg.model.revision,
                                               **res.to_dict()})
            if res.from_cache:
                self.rt.warn(f"model: {res.note}")
            else:
                log.info("model: %s at commit %s -> %s", cfg.model.source, (res.commit or "?")[:12], res.path)
            return E.ModelReady(token, path=res.path)

        self.sup.tasks.start(token, "fetch", work,
                             on_error=lambda e: E.ModelReady(token, failure=self._load_error(e)))

    def _load_error(self, e: BaseException) -> Failure:
        return Failure(FailureClass.LOAD_ERROR, self.rt.secrets.redact(str(e)))

    def _model_record(self, key: str, path: Any, record: dict[str, Any]) -> None:
        self.sup.model_records[str(path)] = record
        self.rec.update(**{key: record})

    # -- published configs ---------------------------------------------------------------------------
    def take_candidate(self, running: Live) -> E.CandidateChecked | None:
        from ..reload import candidate as candidates

        cand = self.watcher.take() if self.watcher is not None else None
        if cand is None:
            return None
        self._taken[id(cand)] = time.monotonic()
        hw = self.rt.hw or self.rt.hardware_probe()
        verdict = candidates.validate(cand, running=running.cfg, env=self.rt.env, hw=hw)
        if not verdict.ok:
            self.book.keep_rejected(cand)
            return E.CandidateChecked(cand, None, tuple(self.rt.secrets.redact(p) for p in verdict.problems))
        assert verdict.cfg is not None
        return E.CandidateChecked(cand, Live(verdict.cfg, text=verdict.text,
                                             origin=Origin(cand.source, cand.origin, cand.revision)))

    def record_reload(self, fx: E.RecordReload) -> None:
        cand = fx.candidate
        taken = self._taken.pop(id(cand), time.monotonic())
        live_hash = self.sup.machine.live.cfg.hash if self.sup.machine else ""
        causes = [self.rt.secrets.redact(c) for c in fx.causes]
        tail = [self.rt.secrets.redact(line) for line in fx.tail]
        self.rec.update(reload=record_decision(self.book, cand, fx.outcome, fx.config_hash, causes,
                                               took_s=time.monotonic() - taken, live_hash=live_hash,
                                               stderr_tail=tail))
        if self.reporter is not None:            # the verdict goes to the fleet record
            self.reporter.poke()
        self.rec.event(f"reload_{fx.outcome}", f"{cand.describe()}" + (f": {causes[0][:300]}" if causes else ""))
        level = logging.INFO if fx.outcome in ("applied", "unchanged") else logging.ERROR
        log.log(level, "reload %s: %s%s", fx.outcome, cand.describe(), "".join(f"\n  - {c}" for c in causes))

    def mark_good(self, live: Live) -> None:
        """The live config serves: it is what a later failure rolls back to, and what a restart boots."""
        if live.text is not None:
            o = live.origin
            self.book.save_good(live.text, {"hash": live.cfg.hash, "base_hash": self.base_hash, "source": o.channel,
                                            "origin": o.where, "revision": o.revision})
        else:
            self.book.forget_good()

    # -- serving and failing -------------------------------------------------------------------
    def serving(self, index: int) -> None:
        from . import preflight

        machine = self.sup.machine
        assert machine is not None
        live = machine.live
        preflight.remember(self.rt, live.cfg, self.sup.memory, live.cfg.ladder.rungs[index].name)
        timings = self.rec.snapshot()["timings"]
        if "boot_to_ready_s" not in timings:
            self.rt.timing(boot_to_ready_s=time.monotonic() - self.rec.boot_monotonic)
        if self.terminator is not None:            # a published config brought it back: keep the pod
            self.terminator.cancel()
            self.rec.update(runpod_terminate=self.terminator.to_dict())
            self.terminator = None
        record = self.sup.model_records.get(str(live.model_path))
        if record is not None:
            self.rec.update(model=record, model_candidate=None)
        self._placement_estimate(live)

    def failed(self, failure: Failure | None) -> None:
        """FAILED: nothing retries it but a published config. On RunPod, with [runpod]
        terminate_on_terminal_failure, the pod is terminated after a grace (supervisor/fleet/self_terminate.py)."""
        why = f"{failure.failure_class.value}: {self.rt.secrets.redact(failure.reason)}" if failure else "unknown"
        log.error("FAILED: %s", why)
        machine = self.sup.machine
        spec = machine.live.cfg.runpod if machine else self.sup.boot_cfg.runpod
        if self.terminator is None and spec.terminate_on_terminal_failure:
            from ..fleet import self_terminate as runpod_self

            self.terminator = runpod_self.arm(spec, self.rt.env, failure=why, on_event=self.rec.event)
            if self.terminator is not None:
                self.rec.update(runpod_terminate=self.terminator.to_dict())

    def _placement_estimate(self, live: Live) -> None:
        """The seed's wall: weights left in host RAM run at the speed of the host's vCPUs (16 vCPU ran
        the identical placement 1.9x slower than 41). Warn when vCPU per host-resident GiB is low."""
        from ..host import hardware

        hw = self.rt.hw
        if live.cfg.engine != "llamacpp" or hw is None or live.model_path is None:
            return
        from ..model.gguf_layout import shards

        try:
            model_gib = sum(p.stat().st_size for p in shards(live.model_path)) / 2**30
        except OSError:
            return
        used = self.rt.gpu_used_visible() or []
        in_vram_gib = sum(max(u - b, 0) for u, b in zip(used, self.rt.baseline_mib or [])) / 1024
        host_gib = max(model_gib - in_vram_gib, 0.0)
        self.rec.update(placement_estimate={"model_gib": round(model_gib, 4), "vram_gib": round(in_vram_gib, 4),
                                            "host_resident_gib": round(host_gib, 4)})
        warning = hardware.host_resident_warning(live.cfg.hardware, hw, host_gib)
        if warning:
            self.rt.warn(warning)
