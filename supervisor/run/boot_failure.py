"""A boot config that does not validate: PID 1 stays up in FAILED and explains, instead of exiting.

An exit restarts the container on RunPod, which fails the same way, in a loop that bills by the
hour and shows a log line at most. So `python -m supervisor run` with a deploy config that cannot
be read (missing, unreadable, not UTF-8), parsed (TOML) or validated (the schema, an environment
override) serves the status page alone, from a Record in FAILED:

    /status   last_failure (class config_rejected): each problem with its field, the value, where it
              came from (the file, or the env var) and the fix
    /live     200: the process answers, nothing to restart;  /ready 503

on the status port it can still read (config.boot_fallback: KILN_STATUS_PORT, else the file's
[status] port, where either is valid, else 8081). With self-termination asked for
(KILN_RUNPOD_TERMINATE_ON_TERMINAL_FAILURE=true, or the file's [runpod] table where it is valid)
and RUNPOD_POD_ID + RUNPOD_API_KEY set, the pod is terminated after the grace
(fleet/self_terminate.py; on a cluster node rank 0 deletes the cluster: fleet/cluster_terminate.py;
the key goes to RunPod's API or $KILN_RUNPOD_API_URL only). TERM or INT stops it: exit 3 (nothing
served). No engine, no watcher, no task: nothing reads state_dir, since the config that names it is
the thing that failed. `run --exit-on-failure` exits 2 instead (CI).

A Serverless worker (runpod_env.active) is released rather than restarted, so it does not stay:
it logs the one failure line a worker logs in every phase (runpod_env.release_line: class
config_rejected and the first problem, which `endpoint up --wait` reads), answers 503 on the
health path on the port RunPod checks (runpod_env.checked_port: no engine runs to hold it) for
`[serverless] exit_grace_s` (config.serverless_fallback: the env's or the file's where valid), so
RunPod shows it UNHEALTHY, then exits 2. It used to exit at once, before any line the CLI knew:
never UNHEALTHY, replaced at once, a cold start billed per replacement.
"""

from __future__ import annotations

import logging
import re
import signal
import time
import tomllib
from pathlib import Path
from typing import Any, Mapping

from .. import __version__
from .. import deploy_env, runpod_env
from ..config import BOM, boot_fallback, serverless_fallback
from ..errors import NO_VALUE, ConfigError, Problem
from ..failure import FailureClass
from ..process.pid1 import SignalRelay, become_subreaper, reap_orphans
from ..redact import Secrets
from ..lifecycle.policy import EXIT_NOTHING_SERVED
from ..lifecycle.state import State
from .record import Record

__all__ = ["serve", "failure_record"]

log = logging.getLogger("kiln")
FROM_ENV = re.compile(r"(?P<field>.+) \(from env (?P<env>[A-Za-z_][A-Za-z0-9_]*)\)")
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "RUNPOD_API_KEY", "KILN_API_KEY", "KILN_OPERATOR_KEY")
# A value that may be a key pasted in the wrong place is not echoed on a page anyone may read.
UNSHOWN = {"server.api_key": "not shown: it may be a key"}
_WAKE_S = 1.0               # orphans reaped and the termination's progress shown at least this often


def failure_record(err: ConfigError, path: str) -> dict[str, Any]:
    """/status's last_failure for a config that did not validate: every problem, where it came
    from and its fix; `hints` says the same in lines, for the HTML page."""
    problems = [_problem(p, path) for p in err.problems]
    hints = [f"{p['field']}" + (f" = {p['value']!r}" if "value" in p else "") + f" (from {p['from']}): "
             f"{p['problem']}. Fix: {p['fix']}" for p in problems]
    hints.append("the supervisor stays up only to say this: no engine runs. Restart the container once it is "
                 "fixed (on RunPod: edit the template's env or the image, then restart or replace the pod)")
    return {"class": FailureClass.CONFIG_REJECTED.value, "reason": f"the deploy config does not validate: "
            f"{len(problems)} problem(s) in {path} and its environment overrides",
            "evidence": hints[0], "problems": problems, "hints": hints, "exit_code": None, "rung": None}


def _problem(p: Problem, path: str) -> dict[str, Any]:
    m = FROM_ENV.fullmatch(p.path)
    field, origin = (m.group("field"), f"env {m.group('env')}") if m else (p.path, path)
    out: dict[str, Any] = {"field": field, "from": origin, "problem": p.message}
    if p.value is not NO_VALUE:              # a missing key has no value to show
        out["value"] = UNSHOWN.get(field, p.value)
    if p.allowed:
        out["allowed"] = p.allowed
    out["fix"] = _fix(field, p, path, m.group("env") if m else None)
    return out


def _fix(field: str, p: Problem, path: str, env: str | None) -> str:
    allowed = f"allowed: {p.allowed}; " if p.allowed else ""
    if env == deploy_env.ENV or (env is None and path == deploy_env.SOURCE):
        return (f"{allowed}correct the deploy config file and deploy it again (`python build.py pods up --config "
                f"FILE`, `endpoint up --config FILE`, `cluster up --config FILE`): {deploy_env.ENV} is that file in "
                "base64, put in the pod's environment by the deploying command")
    if env:
        return (f"{allowed}correct {env} in the pod's environment (a RunPod template's env), or remove it so "
                "the file's value applies")
    if field == "(file)" and p.message.startswith("cannot be read"):
        return (f"give a deploy config that exists and can be read: --config FILE or $KILN_CONFIG (now {path}); "
                "the image's own is /etc/kiln/deploy.toml, a profile /etc/kiln/profiles/NAME.toml")
    if field == "(toml)":
        return f"correct the TOML syntax at the line and column named, in {path}"
    if field == "(file)":
        return f"{allowed}in {path}"
    return (f"{allowed}change {field} in {path} (the image bakes it: correct the target's deploy config and "
            "rebuild, or point KILN_CONFIG at a corrected copy; some fields have a KILN_* env override)")


def _file_data(path: str, text: str | None = None) -> Any:
    """The config's TOML (`text`, else the file's), however invalid its values (for boot_fallback); None
    when it does not parse. Bytes that are not UTF-8 become U+FFFD: a bad byte in a comment hides no port."""
    try:
        if text is None:
            text = Path(path).read_bytes().decode("utf-8", errors="replace")
        return tomllib.loads(text.removeprefix(BOM))
    except (OSError, ValueError):
        return None


def serve(err: ConfigError, path: str, env: Mapping[str, str], *, serverless: bool = False,
          text: str | None = None) -> int:
    """Stay up in FAILED, explaining `err` on /status, until TERM or INT; the exit status (3). A
    Serverless worker (`serverless`) logs the one failure line every phase logs (runpod_env.
    release_line), answers 503 on the health path RunPod checks and exits after its grace instead.
    `text`: the config's own text when it came from the environment (deploy_env.py), not a file."""
    from ..status.listen import CannotListen
    from ..status.server import StatusServer

    data = _file_data(path, text)
    status, runpod = boot_fallback(data, env)
    failure = failure_record(err, path)
    secrets = Secrets(env.get(k) for k in SECRET_ENV)
    for line in str(err).splitlines():
        log.error("%s", secrets.redact(line))
    rec = Record(__version__)
    rec.update(config={"hash": None, "source": path, "from": "boot", "origin": path, "revision": None},
               last_failure=secrets.redact_data(failure))
    rec.bump("failures", FailureClass.CONFIG_REJECTED.value)
    rec.transition(State.FAILED, failure["reason"])
    relay = SignalRelay()
    relay.install()
    become_subreaper()
    worker = serverless_fallback(data, env) if serverless else None
    port = runpod_env.checked_port(env) if worker else status.port
    grace_s = worker.exit_grace_s if worker else None
    if worker is not None:              # said before the 503: whoever sees UNHEALTHY finds the line in the log
        cause = secrets.redact(f"{FailureClass.CONFIG_REJECTED.value}: {failure['reason']}: {failure['evidence']}")
        log.error("%s", runpod_env.release_line(cause, worker.health_path, port, grace_s or 0.0))
    server = StatusServer(status.host, port, rec.snapshot, secrets=lambda: list(secrets),
                          health_path=worker.health_path if worker else None)
    try:
        if grace_s != 0:
            server.start()
            if worker is None:
                log.error("FAILED: the deploy config does not validate; staying up to say so on http://%s:%d/status "
                          "(TERM stops)", status.host, server.port)
    except CannotListen as e:           # still up: the log above is all there is, and the pod may terminate
        log.error("FAILED: the deploy config does not validate, and /status cannot be served: %s", e)
        grace_s = 0.0 if worker else None           # a worker with no health path to answer on has nothing to wait for
    terminator = None
    if runpod.terminate_on_terminal_failure and worker is None:
        from ..fleet import cluster_terminate         # a single pod: fleet/self_terminate.py

        terminator = cluster_terminate.arm(runpod, env, failure=f"config_rejected: {failure['evidence'][:300]}",
                                           on_event=rec.event)
    deadline = None if grace_s is None else time.monotonic() + grace_s
    try:
        while deadline is None or time.monotonic() < deadline:
            if terminator is not None:
                rec.update(runpod_terminate=terminator.to_dict())
            relay.wakeup.wait(_WAKE_S if deadline is None else max(0.0, min(_WAKE_S, deadline - time.monotonic())))
            relay.wakeup.clear()          # before reading, so no signal is lost
            stop = [s for s in relay.pending() if s in (signal.SIGTERM, signal.SIGINT)]
            if stop:
                log.info("received %s: stopping", signal.Signals(stop[0]).name)
                break
            reap_orphans(())
    finally:
        if terminator is not None:
            terminator.cancel()         # told to stop: the pod is someone else's decision now
        server.stop()
    rec.transition(State.STOPPING)
    rec.transition(State.STOPPED)
    return EXIT_NOTHING_SERVED
