"""SELFTEST as a stage of the lifecycle: the selftest against the healthy engine, in a task beside
the loop, answered as a failure (selftest_failed) or None. A Serverless worker runs it as the gate
([selftest] mode "auto": runner.py's module doc says what that changes), a pod in full. The loop keeps watching the engine
meanwhile: if it dies, the loop cancels this task (which aborts the in-flight request at once)
and treats the death as a crash like any other. A selftest that runs past its own timeout_s is
cut off a little later by a hard deadline here, so no request can hang the stage.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from ..config import DeployConfig, Rung
from ..failure import Failure, FailureClass
from ..process.managed import ManagedProcess
from .runtime import Runtime
from ..lifecycle import events as E
from .tasks import Task

log = logging.getLogger("kiln")
HARD_DEADLINE_SLACK_S = 30.0     # the runner keeps timeout_s itself; this only catches a hang


def stage_work(rt: Runtime, cfg: DeployConfig, rung: Rung, proc: ManagedProcess, token: int
               ) -> tuple[Callable[[Task], E.SelftestDone], Callable[[BaseException], E.SelftestDone]]:
    """The RunSelftest effect as a task: its work and what a crash in it answers."""
    return (lambda task: E.SelftestDone(token, run_stage(rt, cfg, rung, proc, task)),
            lambda e: E.SelftestDone(token, Failure(FailureClass.SELFTEST_FAILED, f"selftest: {type(e).__name__}: {e}",
                                                    rung=rung.name)))


def run_stage(rt: Runtime, cfg: DeployConfig, rung: Rung, proc: ManagedProcess, task: Task) -> Failure | None:
    from ..selftest.client import Client, RequestCancelled
    from ..selftest.runner import run_selftest, sampler_from_argv

    spec = cfg.selftest
    rt.rec.update(selftest={"passed": None, "decode_tok_s": None, "summary": "running", "rung": rung.name})
    host = "127.0.0.1" if cfg.server.host in ("0.0.0.0", "::", "") else cfg.server.host
    client = Client(f"http://{host}:{cfg.server.port}", rt.api_key, timeout_s=spec.request_wall_s,
                    engine=cfg.engine)
    task.on_cancel.append(client.abort)
    # What the engine was told ([sampler], or a rung's own flags): the server must report it.
    expected = sampler_from_argv(list(proc.argv)) if cfg.engine == "llamacpp" else None
    timed_out = threading.Event()

    def cut_off() -> None:
        timed_out.set()
        client.abort()

    timer = threading.Timer(spec.timeout_s + HARD_DEADLINE_SLACK_S, cut_off)
    timer.daemon = True
    started = time.monotonic()
    timer.start()
    report: Any = None
    error: str | None = None
    try:
        report = run_selftest(client, spec, family=cfg.model.family, expected_sampler=expected,
                              log=lambda m: log.info("selftest: %s", rt.secrets.redact(m)), gate=gate_mode(cfg))
    except RequestCancelled:
        if not timed_out.is_set():
            return None                           # cancelled by the loop: nobody waits for this answer
        error = f"did not finish within {spec.timeout_s:g} s (timeout_s)"
    finally:
        timer.cancel()
    elapsed = time.monotonic() - started
    rt.timing(last_selftest_s=elapsed)
    if report is not None:
        record = report.to_dict()
        record["rung"] = rung.name
        rt.rec.update(selftest=record)
        if cfg.plan.predicts:
            plan_check(rt, cfg, proc, record.get("decode_tok_s"))
        for line in report.table().splitlines():
            log.info("selftest | %s", rt.secrets.redact(line))
        if report.passed:
            return None
        reason = "selftest: " + "; ".join(report.failures)
    else:
        reason = f"selftest: {error}"
        rt.rec.update(selftest={"passed": False, "decode_tok_s": None, "summary": reason, "rung": rung.name})
    return Failure(FailureClass.SELFTEST_FAILED, rt.secrets.redact(reason), elapsed_s=elapsed,
                   tail=tuple(proc.tail()), rung=rung.name)


def plan_check(rt: Runtime, cfg: DeployConfig, proc: ManagedProcess, decode_tok_s: float | None) -> None:
    """/status's `plan`: the deploy config's [plan] predictions beside what this boot measured, and the
    engine's own sizing lines, kept from its boot by the timeline's watch (or else its output's tail)."""
    from ..host.hardware import gpu_memory_used_mib
    from ..plan.check import check

    result = check(cfg.plan, engine=cfg.engine, gpu_used_mib=gpu_memory_used_mib() if cfg.plan.card_mib else None,
                   engine_lines=rt.rec.boot.kept() or proc.tail(), decode_tok_s=decode_tok_s)
    rt.rec.update(plan=result)
    for name, row in result["checks"].items():
        log.info("plan: %s predicted %s, measured %s (%s)", name, row["predicted"], row["measured"], row["source"])


def gate_mode(cfg: DeployConfig) -> bool:
    """[selftest] mode: the gate (runner.py) on a Serverless worker's cold path, or when asked."""
    mode = cfg.selftest.mode
    return mode == "gate" or (mode == "auto" and cfg.serverless.active)


def crashed_record(rt: Runtime, rung: Rung, returncode: int | None) -> None:
    """/status's selftest section when the engine died under the selftest."""
    rt.rec.update(selftest={"passed": False, "decode_tok_s": None, "rung": rung.name,
                            "summary": f"the engine exited (status {returncode}) during the selftest"})
