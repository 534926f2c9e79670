"""Launching one rung (the CheckLaunch, Launch, WaitHealthy, Barrier and Calibrate effects): the checks
before anything starts, the start itself, the wait for health, and what an exit means.

    check()     the rung's flags linted against the engine's own --help        -> config_rejected
                the model's GGUF header against what this engine build knows  -> model_incompatible
                (a draft the rung names that the engine cannot load           -> config_rejected: next rung)
    start()     the port is free (a foreign listener is not our engine)        -> port_in_use
                a balanced rung's split planned from the GGUF layout + free VRAM -> config_rejected
                argv (a list; no shell), the environment without secrets the engine does not need,
                the process in its own session, with a parent-death signal  -> engine_missing
    launch_rung()  start() with the boot timeline watching the engine's own lines, and the rung-switch time
    health_work()  the health wait (engines/health.py), as a task
    barrier_work() between rungs: our processes gone, GPU memory back (ladder/reclaim.py), as a task
    calibrate()    a balanced rung's split re-planned, or the environment a failure asks for, set
    down()      why an engine that exited or stalled failed: ONE classify call, with the engine's
                signatures and hints, for every way an engine goes down

check, start and down run on the loop thread: the process is started from it, so its parent-death
signal is tied to the thread that lives as long as the supervisor (PR_SET_PDEATHSIG follows the
forking thread); the health wait and the barrier run as tasks beside it.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from ..config import DeployConfig, LadderSpec, Rung
from ..errors import KilnError
from ..failure import Failure, FailureClass, classify
from ..lifecycle import events as E
from ..process.managed import REGISTRY, ManagedProcess
from .logs import engine_lines
from .runtime import Runtime
from .tasks import Task
from ..lifecycle.state import Live
from ..engines import registry
from ..engines.caches import own_caches

log = logging.getLogger("kiln")

# The engine's output in the volume (<state_dir>/run/engine.log), rotated by size: engine.log and
# ENGINE_LOG_KEEP older files, ENGINE_LOG_MAX_BYTES each (256 MiB in all, next to a model of tens of
# GiB). Constants, not config: the same lines reach the container log through the supervisor, so
# this file is the volume's short memory for a post-mortem, and a new deploy-config field would
# change every config's hash (the ladder memory's key, a published config's "unchanged").
ENGINE_LOG = "engine.log"
ENGINE_LOG_MAX_BYTES = 64 * 1024 * 1024
ENGINE_LOG_KEEP = 3


def check(rt: Runtime, live: Live, index: int) -> Failure | None:
    """The rung's pre-launch checks: its flags, and the model file (and a draft it names) against
    what this engine build knows. Nothing is started; a failure names what and the fix."""
    cfg = live.cfg
    rung = cfg.ladder.rungs[index]
    rt.rec.update(rung={"name": rung.name, "index": index, "count": len(cfg.ladder.rungs)})
    assert rt.engine is not None
    header = _header(live.model_path) if cfg.engine == "llamacpp" else None
    gpus = len(rt.hw.gpus) if rt.hw else None
    issues = [str(i) for i in rt.engine.lint_rung(cfg, index, rung, rt.snapshot,
                                                  gpu_count=cfg.hardware.gpu_count or gpus, model=header)]
    if issues:
        return Failure(FailureClass.CONFIG_REJECTED, "lint: " + " | ".join(issues), rung=rung.name)
    for w in rt.engine.lint_rung_warnings(cfg, index, rung, rt.snapshot, model=header):
        rt.warn(str(w))
    if live.model_path is None:
        return None
    problems = model_problems(cfg, rung, live.model_path, rt.snapshot)
    if not problems:
        return None
    if all(p.role == "draft" for p in problems):
        # The rung's draft, not the model: a rung without the draft may still load (the field notes' DSpark).
        return Failure(FailureClass.CONFIG_REJECTED, "draft: " + " | ".join(str(p) for p in problems),
                       rung=rung.name)
    from ..model import check as model_check

    return model_check.failure(problems, rung.name)


def model_problems(cfg: DeployConfig, rung: Rung, model_path: Path, snapshot: Any) -> list[Any]:
    """The preflight of one llama.cpp rung: its model, the draft it names (-md / --model-draft /
    --spec-draft-model / LLAMA_ARG_SPEC_DRAFT_MODEL) and the keys its --override-kv supplies, against
    the facts beside the engine's flag snapshot (share/kiln/). Other engines: nothing to check."""
    if cfg.engine != "llamacpp":
        return []
    from ..engines import llamacpp
    from ..model import check as model_check

    facts = model_check.load_facts(Path(cfg.server.flag_snapshot).parent)
    return model_check.check_model(model_path, facts, draft=llamacpp.draft_model(cfg, rung, snapshot),
                                   kv_overrides=llamacpp.kv_override_keys(cfg, rung, snapshot))


def _header(path: Path | None):  # type: ignore[no-untyped-def]
    """The model's GGUF header for the lint, or None when it cannot be read (the model check says why)."""
    if path is None:
        return None
    from ..errors import KilnError
    from ..model.gguf_layout import read_header

    try:
        return read_header(path)
    except (KilnError, OSError):
        return None


def secret_env_names(cfg: DeployConfig) -> set[str]:
    """Variables holding secrets the engine has no use for (least privilege)."""
    names = {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "RUNPOD_API_KEY"}
    kind, _, ref = cfg.server.api_key.partition(":")
    if kind == "env":
        names.add(ref)
    return names


def engine_environment(engine: Any, cfg: DeployConfig, rung: Rung, pod_env: Mapping[str, str],
                       api_key: str | None, own_dir: Path | None = None) -> dict[str, str]:
    """The engine's environment: its defaults (the compile caches; those never shared between
    Serverless workers under `own_dir`) < the pod's environment, without the secrets the engine has
    no use for < the rung's env < what the engine must have (vLLM's key)."""
    secret_names = secret_env_names(cfg)
    env = engine.engine_defaults(cfg, rung)
    if own_dir is not None:
        env = own_caches(env, cfg, rung, own_dir)
    env.update({k: v for k, v in pod_env.items() if k not in secret_names})
    env.update(rung.env)
    env.update(engine.engine_env(cfg, rung, api_key))
    return env


def port_holder(host: str, port: int) -> str | None:
    """Who already listens on the engine's port, or None when it is free (a connect, then psutil
    for a name: listen.holder, which never reads another process's command line)."""
    from ..status.listen import holder

    target = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    try:
        with socket.create_connection((target, port), timeout=0.5):
            pass
    except OSError:
        return None
    return holder(port) or "another process"


def _balanced(rt: Runtime, cfg: DeployConfig, rung: Rung, model: Path) -> Rung:
    from ..ladder import balanced as placement                      # only balanced rungs pay for these imports
    from ..model.gguf_layout import read_layout

    if rung.name not in rt.balancers:
        hw = rt.hardware_probe()                 # fresh: free memory now, visible GPUs only
        layout = read_layout(model)
        rt.balancers[rung.name] = placement.Balancer(
            layout, [g.memory_free_mib for g in hw.gpus], reserve_mib=rung.reserve_mib,
            n_ctx=placement.context_from_args(list(cfg.server.extra_args) + list(rung.args), layout),
            rounds=rung.calibration_rounds, slack_mib=rung.calibration_slack_mib)
    bal = rt.balancers[rung.name]
    split = bal.plan()
    rt.rec.update(placement={"rung": rung.name, "rounds": bal.history})
    rt.rec.event("placement", f"{rung.name}: {split.describe()}")
    return dataclasses.replace(rung, args=tuple(split.args()) + tuple(rung.args))


def _boot_args(rt: Runtime, cfg: DeployConfig, rung: Rung, model: Path | None) -> list[str]:
    """The engine's flags for a faster boot where they are safe (its boot_args), said in the log."""
    from ..model.prefetch import weight_files

    try:
        weights = sum(p.stat().st_size for p in weight_files(model)) if model is not None else None
    except OSError:
        weights = None
    gpus = [g.memory_free_mib for g in rt.hw.gpus] if rt.hw else []
    prefetched = rt.prefetch is not None and rt.prefetch.useful
    args, why = rt.engine.boot_args(cfg, rung, snapshot=rt.snapshot, env=dict(rt.env), weights_bytes=weights,
                                    gpu_free_mib=gpus, prefetched=prefetched)
    if args:
        log.info("rung %s: %s: %s", rung.name, " ".join(args), why)
    return args


def start(rt: Runtime, cfg: DeployConfig, index: int, model: Path | None,
          on_line: Callable[[str], None],
          on_lines: Callable[[list[str]], None] | None = None) -> ManagedProcess | Failure:
    """The rung's engine, started; or why it could not be (nothing runs then). `model` is None only for
    the router, which serves no model of its own."""
    rung = cfg.ladder.rungs[index]
    host, port = cfg.engine_address
    holder = port_holder(host, port)
    if holder is not None:
        return Failure(FailureClass.PORT_IN_USE, f"port {port} is already in use by {holder}: it is "
                       "not our engine; free the port or move the engine (server.port / KILN_SERVER_PORT)",
                       rung=rung.name)
    if rung.placement == "balanced" and model is not None:
        try:
            rung = _balanced(rt, cfg, rung, model)
        except KilnError as e:                   # DoesNotFit, GGUFError
            return Failure(FailureClass.CONFIG_REJECTED, f"balanced placement: {e}", rung=rung.name)
    assert rt.engine is not None
    extra: dict[str, str] = {}
    if cfg.engine == "llamacpp":            # the prompt cache's slots (supervisor/promptcache/)
        extra["slot_save_path"] = str(rt.prompt_cache_dir)
        what = "the prompt cache's directory"
        try:
            rt.prompt_cache_dir.mkdir(parents=True, exist_ok=True)
            rt.unwritten(what, None)
        except OSError as e:
            rt.unwritten(what, f"cannot create {rt.prompt_cache_dir}: {e.strerror or e}; the prompt cache is not "
                         "kept across restarts")
    argv = rt.engine.build_argv(cfg, rung, model_path=str(model) if model is not None else None,
                                api_key_file=str(rt.key_file) if rt.key_file else None,
                                vcpus=rt.hw.vcpus if rt.hw else None, **extra)
    argv += _boot_args(rt, cfg, rung, model) + rt.node_argv           # a cluster's rank: its node flags
    env = {**rt.node_env, **engine_environment(rt.engine, cfg, rung, rt.env, rt.api_key, own_dir=rt.state_dir)}
    env.update(rt.relaunch_env.get(rung.name, {}))   # what an earlier failure of this rung asked for
    rt.launched_env[rung.name] = {k: env.get(k) for k in registry.relaunch_values(rt.engine)}
    log_path = rt.run_dir / ENGINE_LOG
    try:
        proc = ManagedProcess.start(argv, env=env, on_line=on_line, on_lines=on_lines, redact=list(rt.secrets),
                                    log_file=_log_file(rt, log_path),
                                    log_max_bytes=ENGINE_LOG_MAX_BYTES, log_keep=ENGINE_LOG_KEEP, role="engine",
                                    on_unkillable=lambda info: unkillable(rt, rung, info))
    except OSError as e:                         # no such binary, not executable, a bad interpreter line
        return Failure(FailureClass.ENGINE_MISSING, f"cannot start {argv[0]!r}: {e.strerror or e}; "
                       "use an image built for this engine, or point server.binary at its executable",
                       rung=rung.name)
    rt.rec.bump("launches")
    rt.rec.update(engine={"pid": proc.pid, "port": cfg.engine_address[1], "argv": [rt.secrets.redact(a) for a in argv],
                          "log": {"path": str(log_path), "max_bytes": ENGINE_LOG_MAX_BYTES, "keep": ENGINE_LOG_KEEP}})
    return proc


def _log_file(rt: Runtime, path: Path) -> str | None:
    """The engine's log file, or None when the disk will not give it one: the engine starts anyway (its
    output still reaches the supervisor's log and /status's tail), and /status says so."""
    what = f"the engine's log ({path})"
    try:
        with open(path, "ab"):
            pass
    except OSError as e:
        rt.unwritten(what, f"cannot open {what}: {e.strerror or e}; its output reaches the supervisor's log only")
        return None
    rt.unwritten(what, None)
    return str(path)


def launch_rung(rt: Runtime, live: Live, index: int, *, last_exit_at: float | None) -> ManagedProcess | Failure:
    """Launch: the rung's engine started (start()), the boot timeline watching its own lines from its
    exec (and keeping the sizing lines the engine names: SIZING), and the time since the failed rung's
    exit when one fell through (P6)."""
    watch = rt.rec.boot.engine(getattr(rt.engine, "PHASES", ()), live.cfg.ladder.rungs[index].name,
                               getattr(rt.engine, "SIZING", None))
    proc = start(rt, live.cfg, index, live.model_path, on_line=_widening(rt, live.cfg, watch.line),
                 on_lines=engine_lines)
    if isinstance(proc, Failure):
        return proc
    watch.arm(proc.started_at)            # the boot timeline's engine_exec, then the engine's own phases
    if last_exit_at is not None:
        switch = proc.started_at - last_exit_at
        rt.timing(last_rung_switch_s=switch)
        log.info("rung switch took %.3f s", switch)
    return proc


def _widening(rt: Runtime, cfg: DeployConfig, on_line: Callable[[str], None]) -> Callable[[str], None]:
    """on_line, and on the engine's first line the model prefetch widened to `[startup]
    prefetch_widen_to` streams: the engine has loaded its binary and libraries by the time it writes,
    so the boot's path needs the disk for nothing but the weights from then on (issue 38)."""
    to = cfg.startup.prefetch_widen_to
    if not to:
        return on_line
    first = [True]

    def line(text: str) -> None:
        if first[0]:
            first[0] = False
            p = rt.prefetch
            try:
                if p is not None:
                    p.widen(to)
            except Exception as e:          # no thread or buffer to be had: the read goes on as it was
                log.warning("model prefetch: could not widen to %d streams: %s", to, e)
        on_line(text)

    return line


def unkillable(rt: Runtime, rung: Rung, info: dict[str, Any]) -> None:
    """An engine that outlived SIGKILL (uninterruptible sleep: a wedged GPU driver): on /status under
    `unkillable` (by pid), a warning, the history. It is left behind; the supervisor goes on."""
    procs = ", ".join(f"pid {p['pid']} ({p['state']})" for p in info.get("processes", []))
    rt.rec.merge("unkillable", **{str(info["pid"]): {**info, "rung": rung.name}})
    rt.rec.event("unkillable", f"{rung.name}: {procs}")
    rt.warn(f"engine of rung {rung.name} did not die after SIGKILL: {procs}; uninterruptible sleep (D state) "
            "is usually a wedged GPU driver: it holds its memory until the kernel lets go, which may need the "
            "pod (or host) restarted")


def down(rt: Runtime, proc: ManagedProcess, rung: Rung, *, returncode: int | None,
         stall_reason: str | None = None) -> Failure:
    """Why the engine failed, from its exit, how long it ran, and its own words."""
    assert rt.engine is not None
    end = proc.exited_at if proc.exited_at is not None else (None if stall_reason else time.monotonic())
    elapsed_s = end - proc.started_at if end is not None else None
    return classify(returncode=returncode, elapsed_s=elapsed_s, tail=proc.tail(), signatures=rt.engine.SIGNATURES,
                    hint_signatures=rt.engine.HINTS, stalled=stall_reason is not None, stall_reason=stall_reason,
                    rung=rung.name)


# -- the effects around a launch, as the loop hands them to a task or runs them -----------------------
def health_work(rt: Runtime, proc: ManagedProcess, cfg: DeployConfig, token: int
                ) -> tuple[Callable[[Task], E.HealthDone | None], Callable[[BaseException], E.HealthDone]]:
    """WaitHealthy: the engine's health wait (engines/health.py) as a task. Its answer: ready, stalled
    (health.py says why), or nothing when the engine exited (the exit event tells) or it was cancelled."""
    from ..engines.health import wait_healthy

    def work(task: Task) -> E.HealthDone | None:
        out = wait_healthy(proc, *cfg.engine_address, stall_s=cfg.health.stall_s,
                           max_s=cfg.health.max_s, poll_s=cfg.health.poll_s,
                           should_stop=task.cancelled.is_set, sleep=task.cancelled.wait,
                           stall_lines=rt.engine.STALL_LINES if rt.engine else None)
        if out.ready:
            rt.timing(last_load_s=out.elapsed_s)
            return E.HealthDone(token, True, out.elapsed_s)
        if out.stalled:
            return E.HealthDone(token, False, out.elapsed_s, out.reason or "stalled")
        return None

    return work, lambda e: E.HealthDone(token, False, 0.0, f"health wait failed: {e}")


def barrier_work(rt: Runtime, spec: LadderSpec, done: Callable[[], E.BarrierDone]
                 ) -> Callable[[Task], E.BarrierDone]:
    """Barrier: between rungs, the last engine's processes gone and its GPU memory back (ladder/reclaim.py)."""
    from ..ladder.reclaim import reclaim

    def work(task: Task) -> E.BarrierDone:
        rep = reclaim(REGISTRY, baseline_mib=rt.baseline_mib, gpu_used=rt.gpu_used_visible,
                      timeout_s=spec.reclaim_timeout_s, slack_mib=spec.reclaim_slack_mib, sleep=task.cancelled.wait)
        rt.rec.event("reclaim", rep.describe())
        if rep.vram_back is False:
            rt.warn(f"GPU memory did not return to its baseline between rungs: {rep.describe()}")
        return done()

    return work


def calibrate(rt: Runtime, rung: str, failure: Failure) -> bool:
    """Calibrate: the balanced rung's split re-planned from the OOM's shortfall lines (ladder/balanced.py),
    or the environment a failure asks for set on the rung's relaunches (the engine's RELAUNCH_ENV,
    merged with what earlier failures asked for): not when the launch that failed already had it,
    so the same failure is never relaunched into again. False: nothing new to try."""
    forced = registry.relaunch_env(rt.engine).get(failure.failure_class)
    if forced is not None:
        launched = rt.launched_env.get(rung, {})
        ok = any(launched.get(k) != v for k, v in forced.items())
        if ok:
            rt.relaunch_env[rung] = {**rt.relaunch_env.get(rung, {}), **forced}
            rt.rec.event("relaunch", f"{rung}: {failure.reason}; relaunched with "
                                     f"{', '.join(f'{k}={v}' for k, v in forced.items())}")
        return ok
    bal = rt.balancers.get(rung)
    ok = bal is not None and bal.calibrate(failure.tail) is not None
    if ok:
        rt.rec.update(placement={"rung": rung, "rounds": bal.history})
        rt.rec.event("calibrate", f"{rung}: new budgets {bal.budgets} MiB after {bal.history[-1]['shortfall_mib']}")
    return ok
