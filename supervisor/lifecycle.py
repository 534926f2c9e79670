"""The lifecycle loop: the one place that changes the supervisor's state.

    PREFLIGHT -> FETCH -> LAUNCHING(rung) -> LOADING -> HEALTHY -> [SELFTEST] -> SERVING
    LAUNCHING/LOADING failure: classify -> next rung (fall_through) or FAILED
    SERVING, server dies: RESTARTING (backoff) -> same rung; crash loop -> FAILED
    SERVING or FAILED, a published config: validate (invalid -> rejected, server untouched)
      -> RELOADING -> stop -> ladder with it -> [SELFTEST] -> SERVING
      -> any step fails: ROLLBACK -> ladder with the last good config -> SERVING (or FAILED)
    TERM/INT: STOPPING -> STOPPED, exit with the server's status (or 128+N)

Health waits, the selftest, the model fetch and the config watcher only report;
this loop decides. Signals are recorded by the relay and acted on here.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from . import __version__, apikey, fetch, hardware, hubclient, model
from . import candidate as candidates
from .config import DeployConfig, Rung
from . import engines
from .engines.flags import FlagSnapshot
from .errors import ConfigError, FetchError, KilnError
from .failure import Failure, FailureClass, classify

CONFIG_REJECTED, CRASHED, OOM, SELFTEST_FAILED = (FailureClass.CONFIG_REJECTED, FailureClass.CRASHED,
                                                 FailureClass.OOM, FailureClass.SELFTEST_FAILED)
from .health import wait_healthy
from .ladder import LadderMemory, image_identity, memory_key, reclaim, start_index
from .pid1 import SignalRelay, become_subreaper, exit_code_for, reap_orphans
from .process import REGISTRY, ManagedProcess
from .relay import TcpRelay
from .reload import HISTORY_KEEP, ReloadBook, adopt_last_good, record_decision, status_record
from .state import Record, State
from .status import StatusServer
from .watch import Watcher
from .redact import redact

log = logging.getLogger("kiln")
ENGINE_LOG = logging.getLogger("kiln.engine")
EXIT_NOTHING_SERVED = 3   # FAILED before any server ran (config, hardware, fetch)

# Terminal classes are never retried by a restart: the same launch would fail the same way
# (a selftest runs at temperature 0: the same engine gives the same answers).
TERMINAL = {CONFIG_REJECTED, "load_error", "port_in_use", SELFTEST_FAILED}
_FAILED, _RECOVERED = "failed", "recovered"     # how _serve and _failed hand over to each other


@dataclass
class Options:
    exit_on_failure: bool = False
    hardware_probe: Callable[[], hardware.Hardware] = hardware.probe
    gpu_used: Callable[[], list[int] | None] = hardware.gpu_memory_used_mib
    env: Mapping[str, str] | None = None
    status: bool = True


class Stop(Exception):
    """A stop was requested (TERM/INT) while the loop was busy."""


class Supervisor:
    def __init__(self, cfg: DeployConfig, opts: Options | None = None):
        self.cfg = cfg
        self.opts = opts or Options()
        self.env = dict(os.environ if self.opts.env is None else self.opts.env)
        self.rec = Record(__version__)
        self.relay = SignalRelay()
        self.proc: ManagedProcess | None = None
        self.secrets: list[str] = []
        self.stop_requested = False
        self.failure: Failure | None = None
        self.last_returncode: int | None = None
        self.state_dir = Path(cfg.state_dir)
        self.run_dir = self.state_dir / "run"
        self.snapshot_flags: FlagSnapshot | None = None
        self.hw: hardware.Hardware | None = None
        self.baseline_mib: list[int] | None = None
        self.model_path: Path | None = None
        self.key_file: Path | None = None
        self.status: StatusServer | None = None
        self.memory = LadderMemory(self.state_dir / "ladder-memory.json")
        self.balancers: dict[str, Any] = {}      # rung name -> placement.Balancer
        self.engine: Any = None                  # the engine module (supervisor/engines), set in PREFLIGHT
        self.tcp_relay: TcpRelay | None = None
        self._wake = self.relay.wakeup
        self.book = ReloadBook(self.state_dir / "reload")
        self.watcher: Watcher | None = None
        self.hub_token: str | None = None
        self.api_key: str | None = None
        self.config_text: str | None = None      # the live config's text, when it came from a watcher
        self.origin: dict[str, Any] = {"source": "boot", "origin": cfg.source, "revision": None}
        self.good: tuple[DeployConfig, Path | None, str | None, dict[str, Any]] | None = None

    # -- small plumbing ---------------------------------------------------------------
    def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once on a signal or a child's exit."""
        self._wake.wait(seconds)
        self._wake.clear()
        self._drain_signals()

    def _drain_signals(self) -> None:
        for sig in self.relay.pending():
            if sig in (signal.SIGTERM, signal.SIGINT):
                if not self.stop_requested:
                    log.info("received %s: stopping", signal.Signals(sig).name)
                self.stop_requested = True
            elif sig == signal.SIGHUP and self.proc is not None:
                # PID 1 forwards what it does not handle itself (as tini does).
                log.info("received SIGHUP: forwarding to the engine's process group")
                self.proc.signal_group(signal.SIGHUP)
        reap_orphans(REGISTRY.pids())

    def _should_stop(self) -> bool:
        self._drain_signals()
        return self.stop_requested

    def _transition(self, state: State, detail: str = "") -> None:
        self.rec.transition(state, detail)
        log.info("state %s%s", state.value, f": {detail}" if detail else "")

    def _secret_env_names(self) -> set[str]:
        """Variables holding secrets the engine has no use for (least privilege)."""
        names = {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "RUNPOD_API_KEY"}
        kind, _, ref = self.cfg.server.api_key.partition(":")
        if kind == "env":
            names.add(ref)
        return names

    def _redact(self, text: str) -> str:
        return redact(text, self.secrets)

    # -- entry --------------------------------------------------------------------------
    def run(self) -> int:
        self.relay.install()
        become_subreaper()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.hub_token = hubclient.token(self.env)
        if self.hub_token:
            self.secrets.append(self.hub_token)
        self._adopt_last_good()
        self._show_config()
        self.rec.update(reload=status_record(self.book.history(HISTORY_KEEP)))
        if self.opts.status:
            self.status = StatusServer(self.cfg.status.host, self.cfg.status.port, self._snapshot,
                                       secrets=lambda: self.secrets)
            self.status.start()
        if self.cfg.server.tcp_port:
            self._start_tcp_relay(self.cfg.server.tcp_port)
        if self.cfg.watch.enabled:
            self.watcher = Watcher(self.cfg.watch, cache=fetch.cache_dir(self.cfg), token=self.hub_token,
                                   seen=self.book.seen(), wake=self._wake.set, secrets=lambda: self.secrets)
            self.watcher.start()
        try:
            code = self._main()
        except Stop:
            code = self._stop()
        finally:
            if self.watcher:
                self.watcher.stop()
            if self.proc is not None and self.proc.poll() is None:
                self.proc.stop(self.cfg.health.stop_grace_s)
            REGISTRY.stop_all(1.0)
            if self.tcp_relay:
                self.tcp_relay.stop()
            if self.status:
                self.status.stop()
        return code

    def _snapshot(self) -> dict[str, Any]:
        snap = self.rec.snapshot()
        if self.watcher is not None:
            snap["watch"] = self.watcher.status()
        return snap

    def _main(self) -> int:
        ok = self._preflight() and self._fetch_model() and self._walk_ladder()
        result: int | str = self._serve() if ok else _FAILED
        while result == _FAILED:
            result = self._failed()
            if result == _RECOVERED:
                result = self._serve()
        assert isinstance(result, int)
        return result

    def _fetch_model(self) -> bool:
        self._transition(State.FETCH, self.cfg.model.source)
        try:
            self.model_path = self._resolve_model(self.cfg)
        except FetchError as e:
            self._record_failure(Failure(FailureClass.LOAD_ERROR, self._redact(str(e))))
            return False
        if self._should_stop():
            raise Stop
        return True

    def _resolve_model(self, cfg: DeployConfig) -> Path:
        """The model file for cfg: local, or fetched from the Hub (stop-responsive; FetchError)."""
        local = model.resolve(cfg)
        if local is not None:
            self.rec.update(model={"source": cfg.model.source, "path": str(local)})
            return local
        logged = [0.0]

        def progress(ev: dict[str, Any]) -> None:
            self.rec.update(model={"source": cfg.model.source, "fetch": ev})
            if ev.get("event") != "progress" or time.monotonic() - logged[0] >= 10.0:
                logged[0] = time.monotonic()
                log.info("model fetch: %s", " ".join(f"{k}={v}" for k, v in ev.items()))
        try:
            res = fetch.fetch(cfg, self.env, token=self.hub_token, should_stop=self._should_stop, sleep=self._sleep,
                              report=progress, secrets=self.secrets)
        except fetch.Cancelled:
            raise Stop from None
        self.rec.update(model={"source": cfg.model.source, "revision": cfg.model.revision, **res.to_dict()})
        if res.from_cache:
            self.rec.warn(f"model: {res.note}")
            log.warning("model: %s", res.note)
        else:
            log.info("model: %s at commit %s -> %s", cfg.model.source, (res.commit or "?")[:12], res.path)
        return res.path

    # -- PREFLIGHT ----------------------------------------------------------------------
    def _preflight(self) -> bool:
        for name in ("HF_TOKEN", "RUNPOD_API_KEY"):
            if self.env.get(name):
                self.secrets.append(self.env[name])
        self.hw = self.opts.hardware_probe()
        self.rec.update(hardware=self.hw.to_dict())
        # The probe just read each visible card's memory: that is the baseline (no second NVML session).
        self.baseline_mib = [g.memory_used_mib for g in self.hw.gpus] or None
        return self._prepare(self.cfg)

    def _prepare(self, cfg: DeployConfig) -> bool:
        """Engine module, API key, hardware guard and flag snapshot for cfg (at boot and on reload)."""
        try:
            self.engine = engines.get(cfg.engine)
        except KeyError as e:
            self._record_failure(Failure(CONFIG_REJECTED, str(e.args[0])))
            return False
        try:
            key = apikey.resolve(cfg.server.api_key, self.state_dir, self.env)
        except ConfigError as e:
            self._record_failure(Failure(CONFIG_REJECTED, str(e)))
            return False
        if key.value and key.value not in self.secrets:
            self.secrets.append(key.value)
        self.key_file = apikey.engine_key_file(key, self.run_dir)
        self.api_key = key.value
        log.info("API key: %s", key.origin)
        if key.value is None:
            self.rec.warn("the engine runs without an API key (server.api_key = \"none\")")
        assert self.hw is not None
        mismatches = hardware.check(cfg.hardware, self.hw)
        if mismatches:
            self._record_failure(Failure(CONFIG_REJECTED, "hardware does not match the config: "
                                         + "; ".join(mismatches)))
            return False
        snap_path = Path(cfg.server.flag_snapshot)
        self.snapshot_flags = None
        if snap_path.is_file():
            self.snapshot_flags = self.engine.load_snapshot(snap_path)
        else:
            self.rec.warn(f"no flag snapshot at {snap_path}: rungs are not linted against the engine's flags")
        return True

    # -- the ladder -----------------------------------------------------------------------
    def _lint(self, index: int, rung: Rung) -> list[str]:
        gpus = len(self.hw.gpus) if self.hw else None
        return [str(i) for i in self.engine.lint_rung(self.cfg, index, rung, self.snapshot_flags,
                                                   gpu_count=self.cfg.hardware.gpu_count or gpus)]

    def _walk_ladder(self) -> bool:
        rungs = self.cfg.ladder.rungs
        key = memory_key(self.cfg, self.hw or hardware.Hardware((), None, "none", 0, 0, 0), image_identity())
        first, why = start_index(self.cfg, self.memory.recall(key))
        self.rec.event("ladder", f"starting at rung {first} ({why})")
        failed_at: float | None = None
        launched_before = False
        for index in range(first, len(rungs)):
            rung = rungs[index]
            self.rec.update(rung={"name": rung.name, "index": index, "count": len(rungs)})
            issues = self._lint(index, rung)
            if issues:
                fail = Failure(CONFIG_REJECTED, "lint: " + " | ".join(issues), rung=rung.name)
                self._record_failure(fail)
                if CONFIG_REJECTED in self.cfg.ladder.fall_through and index + 1 < len(rungs):
                    continue
                return False
            if launched_before:
                self._barrier()
            if self._should_stop():
                raise Stop
            outcome = self._launch_and_wait(index, rung, failed_at=failed_at)
            launched_before = True
            exited_at = self.proc.exited_at if self.proc else None
            if outcome is None:
                if self.cfg.ladder.remember:
                    self.memory.remember(key, rung.name)
                return True
            failed_at = exited_at or time.monotonic()
            if outcome.failure_class in self.cfg.ladder.fall_through and index + 1 < len(rungs):
                log.info("rung %s failed (%s): falling through to %s", rung.name, outcome.failure_class,
                         rungs[index + 1].name)
                continue
            return False
        return False

    def _barrier(self) -> None:
        rep = reclaim(REGISTRY, baseline_mib=self.baseline_mib, gpu_used=self._gpu_used_visible,
                      timeout_s=self.cfg.ladder.reclaim_timeout_s, slack_mib=self.cfg.ladder.reclaim_slack_mib)
        self.rec.event("reclaim", rep.describe())
        if rep.vram_back is False:
            self.rec.warn(f"GPU memory did not return to its baseline between rungs: {rep.describe()}")

    def _balancer(self, rung: Rung) -> Any:
        """The rung's split planner, made on first use from the model's header and free VRAM."""
        from . import placement                      # only balanced rungs pay for these imports
        from .gguf_layout import read_layout

        if rung.name not in self.balancers:
            assert self.model_path is not None
            hw = self.opts.hardware_probe()       # fresh: free memory now, visible GPUs only
            layout = read_layout(self.model_path)
            self.balancers[rung.name] = placement.Balancer(
                layout, [g.memory_free_mib for g in hw.gpus], reserve_mib=rung.reserve_mib,
                n_ctx=placement.context_from_args(list(self.cfg.server.extra_args) + list(rung.args), layout),
                rounds=rung.calibration_rounds, slack_mib=rung.calibration_slack_mib)
        return self.balancers[rung.name]

    def _launch(self, rung: Rung) -> ManagedProcess:
        assert self.model_path is not None
        self._transition(State.LAUNCHING, rung.name)
        if rung.placement == "balanced":
            bal = self._balancer(rung)
            split = bal.plan()
            self.rec.update(placement={"rung": rung.name, "rounds": bal.history})
            self.rec.event("placement", f"{rung.name}: {split.describe()}")
            rung = dataclasses.replace(rung, args=tuple(split.args()) + tuple(rung.args))
        argv = self.engine.build_argv(self.cfg, rung, model_path=str(self.model_path),
                                   api_key_file=str(self.key_file) if self.key_file else None,
                                   vcpus=self.hw.vcpus if self.hw else None)
        env = {k: v for k, v in self.env.items() if k not in self._secret_env_names()}
        env.update(rung.env)
        env.update(self.engine.engine_env(self.cfg, rung, self.api_key))
        proc = ManagedProcess.start(argv, env=env, on_line=self._engine_line, redact=self.secrets,
                                    log_file=str(self.run_dir / "engine.log"))
        self.proc = proc
        self.rec.bump("launches")
        self.rec.update(engine={"pid": proc.pid, "port": self.cfg.server.port,
                                "argv": [self._redact(a) for a in argv]})
        threading.Thread(target=self._wake_on_exit, args=(proc,), daemon=True).start()
        self._transition(State.LOADING, f"pid {proc.pid}")
        return proc

    def _start_tcp_relay(self, port: int) -> None:
        """The TCP port is a convenience beside the HTTP one: a busy port is a warning, not a failure."""
        relay = TcpRelay(self.cfg.server.host, port, self.cfg.server.host, lambda: self.cfg.server.port)
        try:
            relay.start()
        except OSError as e:
            self.rec.warn(f"TCP relay not started: port {port}: {e.strerror or e}")
            log.warning("TCP relay not started on port %d: %s", port, e.strerror or e)
            return
        self.tcp_relay = relay
        log.info("TCP relay: port %d -> the engine's port", port)

    def _check_host_resident(self) -> None:
        """The seed's wall: weights left in host RAM run at the speed of the host's vCPUs (16 vCPU ran
        the identical placement 1.9x slower than 41). Warn when vCPU per host-resident GiB is low."""
        if self.cfg.engine != "llamacpp" or self.hw is None or self.model_path is None:
            return
        from .gguf_layout import shards

        try:
            model_gib = sum(p.stat().st_size for p in shards(self.model_path)) / 2**30
        except OSError:
            return
        used = self._gpu_used_visible() or []
        in_vram_gib = sum(max(u - b, 0) for u, b in zip(used, self.baseline_mib or [])) / 1024
        host_gib = max(model_gib - in_vram_gib, 0.0)
        self.rec.update(placement_estimate={"model_gib": round(model_gib, 4), "vram_gib": round(in_vram_gib, 4),
                                            "host_resident_gib": round(host_gib, 4)})
        warning = hardware.host_resident_warning(self.cfg.hardware, self.hw, host_gib)
        if warning:
            self.rec.warn(warning)
            log.warning("%s", warning)

    def _gpu_used_visible(self) -> list[int] | None:
        """Used MiB on the GPUs the engine can see, in the probe's order (the baseline's order)."""
        used = self.opts.gpu_used()
        if used is None or self.hw is None:
            return None
        try:
            return [used[g.index] for g in self.hw.gpus]
        except IndexError:
            return None

    def _wake_on_exit(self, proc: ManagedProcess) -> None:
        proc.exited().wait()
        self._wake.set()

    def _engine_line(self, line: str) -> None:
        ENGINE_LOG.info("%s", line)

    def _launch_and_wait(self, index: int, rung: Rung, failed_at: float | None = None) -> Failure | None:
        """Launch a rung; None when it is healthy, else why it failed.

        A balanced rung that runs out of memory is re-planned from the engine's shortfall lines
        and relaunched, up to its calibration_rounds, before it counts as failed."""
        from .gguf_layout import GGUFError
        from .placement import DoesNotFit

        while True:
            try:
                outcome = self._launch_once(index, rung, failed_at)
            except (DoesNotFit, GGUFError) as e:
                fail = Failure(CONFIG_REJECTED, f"balanced placement: {e}", rung=rung.name)
                self._record_failure(fail)
                return fail
            if (outcome is None or rung.placement != "balanced" or outcome.failure_class != OOM
                    or self.balancers[rung.name].calibrate(outcome.tail) is None):
                return outcome
            bal = self.balancers[rung.name]
            self.rec.update(placement={"rung": rung.name, "rounds": bal.history})
            self.rec.event("calibrate", f"{rung.name}: new budgets {bal.budgets} MiB after {bal.history[-1]['shortfall_mib']}")
            self._barrier()
            failed_at = self.proc.exited_at if self.proc else None

    def _launch_once(self, index: int, rung: Rung, failed_at: float | None) -> Failure | None:
        proc = self._launch(rung)
        if failed_at is not None:
            # From the failed rung's exit to this rung's process start (the ladder's P6).
            switch = proc.started_at - failed_at
            self.rec.update(timings={**self.rec.snapshot()["timings"], "last_rung_switch_s": round(switch, 4)})
            log.info("rung switch took %.3f s", switch)
        out = wait_healthy(proc, self.cfg.server.host, self.cfg.server.port,
                           stall_s=self.cfg.health.stall_s, max_s=self.cfg.health.max_s,
                           poll_s=self.cfg.health.poll_s, should_stop=self._should_stop, sleep=self._sleep,
                           stall_lines=self.engine.STALL_LINES)
        if out.stopped:
            raise Stop
        if out.ready:
            self._transition(State.HEALTHY, f"{rung.name} in {out.elapsed_s:.3f} s")
            self.rec.update(timings={**self.rec.snapshot()["timings"], "last_load_s": round(out.elapsed_s, 4)})
            if self.cfg.selftest.enabled:
                fail = self._selftest(rung, proc)
                if fail is not None:
                    return fail
            timings = self.rec.snapshot()["timings"]
            timings.setdefault("boot_to_ready_s", round(time.monotonic() - self.rec.boot_monotonic, 4))
            self.rec.update(timings=timings)
            self._transition(State.SERVING, rung.name)
            self._check_host_resident()
            return None
        rc = proc.stop(self.cfg.health.stop_grace_s)   # reaps and drains the rest of the output
        self.last_returncode = rc if out.exited else None
        fail = classify(returncode=rc if out.exited else None, elapsed_s=out.elapsed_s, tail=proc.tail(),
                        signatures=self.engine.SIGNATURES, hint_signatures=self.engine.HINTS,
                        stalled=out.stalled, stall_reason=out.reason, rung=rung.name)
        self._record_failure(fail)
        return fail

    def _selftest(self, rung: Rung, proc: ManagedProcess) -> Failure | None:
        """SELFTEST: probes and measurements against the healthy engine, in a worker thread that
        only reports; this loop waits on it, stays responsive to a stop or the engine's exit,
        and decides. None when it passed, else the failure (the engine is stopped)."""
        from .selftest.client import Cancelled, Client
        from .selftest.runner import run_selftest, sampler_from_argv

        spec = self.cfg.selftest
        self._transition(State.SELFTEST, rung.name)
        self.rec.update(selftest={"passed": None, "decode_tok_s": None, "summary": "running", "rung": rung.name})
        host = "127.0.0.1" if self.cfg.server.host in ("0.0.0.0", "::", "") else self.cfg.server.host
        client = Client(f"http://{host}:{self.cfg.server.port}", self.api_key, timeout_s=spec.request_wall_s,
                        engine=self.cfg.engine)
        result: dict[str, Any] = {}
        # What the engine was told ([sampler], or a rung's own flags): the server must report it.
        argv = (self.rec.snapshot().get("engine") or {}).get("argv") or []
        expected = sampler_from_argv(argv) if self.cfg.engine == "llamacpp" else None

        def work() -> None:
            try:
                result["report"] = run_selftest(client, spec, family=self.cfg.model.family,
                                                expected_sampler=expected,
                                                log=lambda m: log.info("selftest: %s", self._redact(m)))
            except Cancelled:
                result["cancelled"] = True
            except Exception as e:      # a selftest bug must not hang the loop: it fails, explained
                log.exception("selftest crashed")
                result["error"] = f"{type(e).__name__}: {e}"

        worker = threading.Thread(target=work, name="kiln-selftest", daemon=True)
        started = time.monotonic()
        worker.start()
        hard_deadline = started + spec.timeout_s + 30.0     # the runner keeps timeout_s itself
        while worker.is_alive():
            self._sleep(0.2)
            if self.stop_requested or proc.poll() is not None or time.monotonic() > hard_deadline:
                client.abort()            # ends the in-flight request now
                worker.join(5.0)
                break
        if self.stop_requested:
            raise Stop
        elapsed = time.monotonic() - started
        self.rec.update(timings={**self.rec.snapshot()["timings"], "last_selftest_s": round(elapsed, 4)})
        if proc.poll() is not None:       # the engine died under the selftest: a crash like any other
            rc = proc.stop(0.0)
            self.last_returncode = rc
            self.rec.update(selftest={"passed": False, "decode_tok_s": None, "rung": rung.name,
                                      "summary": f"the engine exited (status {rc}) during the selftest"})
            fail = classify(returncode=rc, elapsed_s=elapsed, tail=proc.tail(), signatures=self.engine.SIGNATURES,
                            hint_signatures=self.engine.HINTS, rung=rung.name)
            self._record_failure(fail)
            return fail
        report = result.get("report")
        if report is not None:
            record = report.to_dict()
            record["rung"] = rung.name
            self.rec.update(selftest=record)
            for line in report.table().splitlines():
                log.info("selftest | %s", self._redact(line))
            if report.passed:
                return None
            reason = "selftest: " + "; ".join(report.failures)
        else:
            why = result.get("error") or f"did not finish within {spec.timeout_s:g} s (timeout_s)"
            reason = f"selftest: {why}"
            self.rec.update(selftest={"passed": False, "decode_tok_s": None, "summary": reason, "rung": rung.name})
        proc.stop(self.cfg.health.stop_grace_s)    # not ready means not serving: free the port and the GPU
        self.last_returncode = None
        fail = Failure(SELFTEST_FAILED, self._redact(reason), elapsed_s=elapsed, tail=proc.tail(), rung=rung.name)
        self._record_failure(fail)
        return fail

    def _record_failure(self, fail: Failure) -> None:
        self.failure = fail
        self.rec.bump("failures", fail.failure_class)
        d = fail.to_dict()
        d["reason"] = self._redact(str(d["reason"]))
        d["stderr_tail"] = [self._redact(x) for x in d["stderr_tail"]][-40:]
        self.rec.update(last_failure=d)
        self.rec.event("failure", f"{fail.failure_class}: {d['reason'][:300]}")
        log.error("failure %s%s: %s", fail.failure_class, f" on rung {fail.rung}" if fail.rung else "", d["reason"])
        for hint in fail.hints:
            log.error("  hint: %s", self._redact(hint))

    # -- SERVING and restarts ----------------------------------------------------------------
    def _serve(self) -> int | str:
        """Serve until a stop (exit code), or _FAILED. Restarts crashes; applies published configs."""
        self._mark_good()
        restarts: list[float] = []       # monotonic times of recent restarts, for the window
        backoff = self.cfg.restart.backoff_initial_s
        while True:
            assert self.proc is not None
            served_since = time.monotonic()
            while self.proc.poll() is None:
                self._sleep(1.0)
                if self.stop_requested:
                    return self._stop()
                cand = self.watcher.take() if self.watcher else None
                if cand is not None:
                    if not self._reload(cand):
                        return _FAILED
                    if self.rec.state == State.SERVING and self.proc.started_at > served_since:
                        restarts, backoff = [], self.cfg.restart.backoff_initial_s   # a new config starts afresh
                        served_since = time.monotonic()
            rung_index = self.rec.snapshot()["rung"]["index"]
            rung = self.cfg.ladder.rungs[rung_index]
            rc = self.proc.stop(0.0)
            uptime = time.monotonic() - served_since
            self.last_returncode = rc
            fail = classify(returncode=rc, elapsed_s=uptime, tail=self.proc.tail(),
                            signatures=self.engine.SIGNATURES, rung=rung.name)
            self._record_failure(fail)
            if uptime >= self.cfg.restart.stable_s:
                backoff = self.cfg.restart.backoff_initial_s   # it ran long enough: start over
            # Relaunch until healthy, a terminal failure, a crash loop, or a stop.
            while True:
                self._transition(State.RESTARTING, f"{self.failure.failure_class if self.failure else '?'}")
                now = time.monotonic()
                restarts = [t for t in restarts if now - t <= self.cfg.restart.window_s] + [now]
                if len(restarts) > self.cfg.restart.max_restarts:
                    last = self.failure
                    self._record_failure(Failure(
                        last.failure_class if last else CRASHED,
                        f"crash loop: {len(restarts)} failures within {self.cfg.restart.window_s:.0f} s "
                        f"(restart.max_restarts = {self.cfg.restart.max_restarts}); last: "
                        f"{last.reason if last else '?'}",
                        exit_code=self.last_returncode, tail=last.tail if last else (), rung=rung.name))
                    return _FAILED
                self.rec.bump("restarts")
                log.info("restarting rung %s in %.2f s", rung.name, backoff)
                deadline = time.monotonic() + backoff
                while time.monotonic() < deadline:
                    self._sleep(deadline - time.monotonic())
                    if self.stop_requested:
                        return self._stop()
                backoff = min(max(backoff * 2, 0.001), self.cfg.restart.backoff_max_s)
                self._barrier()
                outcome = self._launch_and_wait(rung_index, rung)
                if outcome is None:
                    break
                if outcome.failure_class in TERMINAL:
                    return _FAILED

    # -- published configs: validate, apply, roll back -------------------------------------------
    def _reload(self, cand: candidates.Candidate) -> bool:
        """Decide on one candidate. False only when nothing serves afterwards (FAILED)."""
        started = time.monotonic()
        was_failed = self.rec.state == State.FAILED
        hw = self.hw or self.opts.hardware_probe()
        verdict = candidates.validate(cand, running=self.cfg, env=self.env, hw=hw)
        if not verdict.ok:
            self.book.keep_rejected(cand.data)
            return self._decided(cand, "rejected", None, [self._redact(p) for p in verdict.problems], started,
                                 serving=not was_failed)
        new = verdict.cfg
        assert new is not None and verdict.text is not None
        origin = {"source": cand.source, "origin": cand.origin, "revision": cand.revision}
        if new.hash == self.cfg.hash and not was_failed:
            self.origin, self.config_text = origin, verdict.text
            self._show_config()
            self._mark_good()
            return self._decided(cand, "unchanged", new.hash, [], started)
        serving_model = self.rec.snapshot().get("model")
        try:
            if new.model == self.cfg.model and self.model_path is not None and not was_failed:
                path = self.model_path             # same [model]: a model update is a new revision there
            else:
                path = self._resolve_model(new)    # while the old server still serves
        except FetchError as e:
            self.rec.update(model=serving_model)
            return self._decided(cand, "rejected", new.hash, [self._redact(f"model: {e}")], started,
                                 serving=not was_failed)
        self._transition(State.RELOADING, f"{cand.describe()} (config {new.hash[:12]})")
        if self.proc is not None:
            self.proc.stop(self.cfg.health.stop_grace_s)
        self._barrier()
        ok = self._switch_to(new, path, verdict.text, origin)
        if ok:
            return self._decided(cand, "applied", new.hash, [], started)
        cause = self.failure.reason if self.failure else "unknown"
        cause = f"{self.failure.failure_class}: {cause}" if self.failure else cause
        if self.good is None:
            self._decided(cand, "failed", new.hash, [cause], started, serving=False)
            return False
        good_cfg, good_path, good_text, good_origin = self.good
        self._transition(State.ROLLBACK, cause[:200])
        log.error("reload of %s failed (%s): rolling back to config %s", cand.describe(), cause, good_cfg.hash[:12])
        if self.proc is not None:
            self.proc.stop(self.cfg.health.stop_grace_s)
        self._barrier()
        if self._switch_to(good_cfg, good_path, good_text, good_origin):
            return self._decided(cand, "rolled_back", new.hash, [cause], started)
        self._decided(cand, "failed", new.hash, [cause, "the rollback failed too: "
                                                 + (self.failure.reason if self.failure else "?")], started,
                      serving=False)
        return False

    def _switch_to(self, cfg: DeployConfig, path: Path | None, text: str | None, origin: dict[str, Any]) -> bool:
        """Make cfg the live config and walk its ladder; True when it reached SERVING."""
        self.cfg, self.model_path, self.config_text, self.origin = cfg, path, text, origin
        self.balancers = {}
        self._show_config()
        if not self._prepare(cfg):
            return False
        if path is None:
            try:
                self.model_path = self._resolve_model(cfg)
            except FetchError as e:
                self._record_failure(Failure(FailureClass.LOAD_ERROR, self._redact(str(e))))
                return False
        return self._walk_ladder()

    def _decided(self, cand: candidates.Candidate, outcome: str, cfg_hash: str | None, causes: list[str],
                 started: float, serving: bool = True) -> bool:
        self.rec.update(reload=record_decision(self.book, cand, outcome, cfg_hash, causes,
                                               took_s=time.monotonic() - started, live_hash=self.cfg.hash))
        if outcome in ("applied", "rolled_back"):
            self._mark_good()
        self.rec.event(f"reload_{outcome}", f"{cand.describe()}" + (f": {causes[0][:300]}" if causes else ""))
        level = logging.INFO if outcome in ("applied", "unchanged") else logging.ERROR
        log.log(level, "reload %s: %s%s", outcome, cand.describe(),
                "".join(f"\n  - {c}" for c in causes))
        return serving

    def _mark_good(self) -> None:
        """The live config serves: it is what a later failure rolls back to, and what a restart boots."""
        self.good = (self.cfg, self.model_path, self.config_text, dict(self.origin))
        if self.config_text is not None:
            self.book.save_good(self.config_text, {"hash": self.cfg.hash, "base_hash": self.base_hash, **self.origin})
        else:
            self.book.forget_good()

    def _show_config(self) -> None:
        self.rec.update(config={"hash": self.cfg.hash, "source": self.cfg.source, "from": self.origin["source"],
                                "origin": self.origin["origin"], "revision": self.origin["revision"],
                                "since": round(time.time(), 3)})
        log.info("config live: hash %s from %s%s", self.cfg.hash[:12], self.origin["origin"],
                 f" at revision {self.origin['revision']}" if self.origin["revision"] else "")

    def _adopt_last_good(self) -> None:
        """Boot the last published config that served, unless the image's own config changed since."""
        self.base_hash = self.cfg.hash
        found = adopt_last_good(self.book, self.cfg, self.env) if self.cfg.watch.enabled else None
        if found is not None:
            self.cfg, self.config_text, self.origin = found
            self.rec.event("config", f"booting the last good published config {self.cfg.hash[:12]} "
                                     f"({self.origin['origin']})")

    # -- endings -------------------------------------------------------------------------------
    def _failed(self) -> int | str:
        if self.rec.state != State.FAILED:
            self._transition(State.FAILED, self.failure.failure_class if self.failure else "")
        code = exit_code_for(self.last_returncode) if self.last_returncode else EXIT_NOTHING_SERVED
        if self.opts.exit_on_failure:
            self._transition(State.STOPPING, "exit on failure")
            self._transition(State.STOPPED)
            return code
        # Stay up so /status explains the failure on the pod; leave on TERM/INT; a published
        # config that serves brings it back.
        while not self.stop_requested:
            self._sleep(1.0)
            cand = self.watcher.take() if self.watcher else None
            if cand is not None and self._reload(cand) and self.rec.state == State.SERVING:
                return _RECOVERED
            if self.rec.state != State.FAILED and not self.stop_requested:
                self._transition(State.FAILED, self.failure.failure_class if self.failure else "")
        self._transition(State.STOPPING, "signal")
        self._transition(State.STOPPED)
        return code

    def _stop(self) -> int:
        if self.rec.state not in (State.STOPPING, State.STOPPED):
            self._transition(State.STOPPING, "signal")
        rc = 0
        if self.proc is not None:
            rc = self.proc.stop(self.cfg.health.stop_grace_s)
        REGISTRY.stop_all(self.cfg.health.stop_grace_s)
        self._transition(State.STOPPED)
        return exit_code_for(rc)


def setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger("kiln")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False


def run(cfg: DeployConfig, opts: Options | None = None) -> int:
    try:
        return Supervisor(cfg, opts).run()
    except KilnError as e:
        log.error("%s", e)
        return EXIT_NOTHING_SERVED
