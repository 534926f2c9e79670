"""The router as an engine: smg (the SGLang gateway, pinned in supervisor/router-requirements.txt) in
front of replicas, supervised like any engine: launched from the loop thread, its health waited for,
restarted with backoff when it dies, stopped with PID 1.

Why smg and not vllm-router: docs/research/router-choice-2026-12-01.md. What it is started with:

    <python> -m supervisor.router.launch [--key-file F] [--replica URL]... -- smg launch flags
      (the replicas are shown the key first: none accepting it is config_rejected, FAILED)
      --host/--port                   127.0.0.1:[router] engine_port: clients reach smg through the
                                      supervisor's gate on [server] port (supervisor/router/front.py),
                                      which answers 503 while no replica is routed
      --api-key (from the 0600 file)  [server] api_key: the key clients send and the replicas use;
                                      smg enforces it (401) and sends it to the replicas
      --policy                        [router] policy (cache_aware: a session stays where its prefix is warm)
      --balance-abs/rel-threshold     cache_aware's spill gate: 2 and 1.5 (CACHE_AWARE_ARGS)
      --prometheus-host/-port         smg's exporter, on loopback ([router] metrics_port)
      health checks every 2 s         smg's own view of a replica between two feeder polls
      --shutdown-grace-period-secs    what [health] stop_grace_s leaves after smg's 5 s listener hold
      [router] extra_args             anything else `smg launch --help` offers

It starts with no workers: the feeder (supervisor/router/feeder.py) adds each replica whose
readiness says 200 and removes it when it stops saying so. Its /health answers 200 once it listens
(that is the health wait); /ready needs a routed replica besides (run/peripherals.py).
"""

from __future__ import annotations

from pathlib import Path
from ..config import SMG_TERM_HOLD_S, DeployConfig, Rung
from ..failure import FailureClass as F, Signature, sig
from .flags import FlagSnapshot, load_argparse_snapshot
from .llamacpp import LintIssue

LAUNCHER = "supervisor.router.launch"
# What the launcher itself adds to smg's command line when build_argv gives it --key-file (launch.py
# KEY_FLAG): a flag of smg's that no deploy config shows (images/upgrade/kiln_argv.py lints it).
LAUNCHER_FLAGS = ("--api-key",)
# smg's own view of a replica's health between two feeder polls: a dead replica leaves its routing
# within ~2 s even when the feeder's next poll is later (measured: docs/research/router-choice-2026-12-01.md).
HEALTH_ARGS = ("--health-check-interval-secs", "2", "--health-failure-threshold", "1",
               "--health-success-threshold", "1", "--health-check-timeout-secs", "2")
# A worker the feeder adds is already ready; a wrong one gives up in 30 s instead of smg's 30 minutes.
STARTUP_ARGS = ("--worker-startup-timeout-secs", "30", "--worker-startup-check-interval", "1")
# cache_aware's spill gate (`smg launch --help`, 1.13.0): a session's replica is passed over for the
# least-loaded one when its in-flight requests exceed the pool's mean by --balance-abs-threshold AND
# --balance-rel-threshold times it. smg's 64 (capped at 4 for a small pool) lets 4 turns queue on one
# replica of one slot; 2 hands the next one on sooner. On P14's honest workload (3 replicas, 5 and 7
# overlapping sessions) it never had to: the same placement as smg's defaults, no replica above 1.39x
# its fair share (docs/benchmarks.md, P14). [router] extra_args come after and override it.
CACHE_AWARE_ARGS = ("--balance-abs-threshold", "2", "--balance-rel-threshold", "1.5")

SIGNATURES: tuple[Signature, ...] = (
    # supervisor/router/launch.py, when the pinned package is not importable by server.binary
    sig(F.ENGINE_MISSING, r"kiln router: the router's package", "smg (the router) is not installed for "
        "server.binary"),
    # supervisor/router/launch.py, when no replica accepts the router's key (terminal: the key does not
    # change under a restart)
    sig(F.CONFIG_REJECTED, r"kiln router: no replica accepts the router's key", "no replica accepts the router's "
        "key (server.api_key): it must be the key the replicas were started with"),
    sig(F.PORT_IN_USE, r"Address already in use|AddrInUse|address in use", "a port of the router is in use "
        "(server.port, or [router] metrics_port)"),
    sig(F.CONFIG_REJECTED, r"unrecognized arguments|error: argument|invalid choice|ambiguous option",
        "smg's parser rejected an argument ([router] extra_args)"),
)
HINTS: tuple[Signature, ...] = ()
STALL_LINES = None


def load_snapshot(path: str | Path) -> FlagSnapshot:
    """`smg launch --help`, when a snapshot is given (the router image does not bake one: smg's own
    parser refuses an unknown flag at start, which is config_rejected)."""
    return load_argparse_snapshot(path)


def lint_rung(cfg: DeployConfig, index: int, rung: Rung, snapshot: FlagSnapshot | None,
              gpu_count: int | None = None, *, model: object = None) -> list[LintIssue]:
    if snapshot is None:
        return []
    issues = []
    for i, arg in enumerate(cfg.router.extra_args):
        name = arg.split("=", 1)[0]
        if name.startswith("--") and snapshot.get(name) is None:
            near = snapshot.nearest(name)
            issues.append(LintIssue(f"router.extra_args[{i}]", f"{name} is not a flag of this smg"
                                    + (f" (did you mean {near}?)" if near else "")))
    return issues


def lint_rung_warnings(cfg: DeployConfig, index: int, rung: Rung, snapshot: FlagSnapshot | None, *,
                       model: object = None) -> list[LintIssue]:
    return []


def sampler_overrides(cfg: DeployConfig, rung: Rung, snapshot: FlagSnapshot | None = None) -> dict[str, str]:
    return {}


def boot_args(cfg: DeployConfig, rung: Rung, **_: object) -> tuple[list[str], str]:
    """Nothing: the router loads no model."""
    return [], "the router loads no model"


def build_argv(cfg: DeployConfig, rung: Rung, *, model_path: str | None = None, api_key_file: str | None = None,
               port: int | None = None, vcpus: float | None = None) -> list[str]:
    r = cfg.router
    argv = [cfg.server.binary, "-m", LAUNCHER]
    if api_key_file:
        argv += ["--key-file", api_key_file]
    argv += ["--probe-timeout", f"{r.probe_timeout_s:g}"]
    for rep in r.replicas:              # shown the key before smg starts (router/keycheck.py)
        argv += ["--replica", rep.url]
    return argv + ["--", "--host", "127.0.0.1", "--port", str(port or r.engine_port), "--policy", r.policy,
                   "--prometheus-host", "127.0.0.1", "--prometheus-port", str(r.metrics_port),
                   *HEALTH_ARGS, *STARTUP_ARGS, "--shutdown-grace-period-secs", str(shutdown_grace_s(cfg)),
                   *(CACHE_AWARE_ARGS if r.policy == "cache_aware" else ()), "--log-level", "info", *r.extra_args]


def shutdown_grace_s(cfg: DeployConfig) -> int:
    """How long smg waits for in-flight requests after TERM: what the stop grace leaves once smg has
    held its listener (SMG_TERM_HOLD_S) and with a margin for its own cleanup, so smg exits by itself
    before the supervisor's SIGKILL."""
    return max(1, int(cfg.health.stop_grace_s - SMG_TERM_HOLD_S - 5.0))


def engine_env(cfg: DeployConfig, rung: Rung, api_key: str | None) -> dict[str, str]:
    """The launcher is this supervisor's module: the router's Python finds it where this one was
    found, whatever the working directory. smg's logs without colour codes."""
    return {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "NO_COLOR": "1"}


def engine_defaults(cfg: DeployConfig, rung: Rung) -> dict[str, str]:
    return {}
