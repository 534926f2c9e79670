"""What RunPod's environment promises a Serverless worker, as Kiln reads it: the load-balancing
contract (ports, the health path and its codes) and the shared network volume's layout.

A base module (stdlib and errors.Problem only): config.py applies `apply_env` and `volume_state_dir`
while it parses, the status server answers with `health_code`, the shell lays out a worker's state.

## The load-balancing worker contract

Facts (runpod/docs, read at 04313c17 and a900806e):

- requests to https://ENDPOINT_ID.api.runpod.ai/<path> go to the worker's HTTP server on `PORT`
  (default 80); the load balancer polls `HEALTH_CHECK_PATH` (default /ping) on `PORT_HEALTH`
  (default: the same as PORT; the OpenAPI text says 80) [serverless/load-balancing/overview.mdx];
- 200 means healthy, 204 initializing, anything else unhealthy: removed from routing [same page];
- RunPod sets RUNPOD_ENDPOINT_ID in every Serverless worker [serverless/development/volume-cache.mdx].

So a worker is in serverless mode when PORT_HEALTH or RUNPOD_ENDPOINT_ID is in its environment;
then PORT is the engine's port (server.port) and PORT_HEALTH the status server's (status.port),
where the health path answers from the lifecycle state (`health_code`). PORT_HEALTH equal to PORT
cannot work: the engine owns PORT, and nothing of Kiln's can answer the health path there.


## The volume

Many workers, one volume: what an endpoint's workers share and what each keeps to itself.

RunPod mounts an endpoint's network volume at /runpod-volume in every Serverless worker
(storage/network-volumes.mdx @a900806e), the same volume for every worker of a datacenter, and
warns that concurrent writes from several workers may corrupt data. So, in serverless mode with
the volume there (`[serverless] volume`, KILN_SERVERLESS_VOLUME: a temp dir in tests), state_dir
is `<volume>/kiln` (unless KILN_STATE_DIR says otherwise) and is laid out as:

    <volume>/kiln/                        shared: written so that concurrent workers never corrupt it
      hf/                                 the Hub cache: downloaded once, under a lock beside it
                                          (model/fetch/volume_lock.py); the others wait, then reuse it
      cache/vllm, torchinductor, triton   compile caches: written atomically by their tools
                                          (engines/caches.py says why that is safe)
      api-key                             a generated key: one for every worker, created once
      serverless/failures/<key>/<worker>  failure witnesses, one file per worker (serverless/failures.py)
      workers/<worker id>/                this worker's own: never written by another while it lives
        .kiln-worker                      Kiln's mark and the worker's heartbeat: a marked directory
                                          whose heartbeat stopped an hour ago is pruned by a later
                                          worker, bounded (serverless/workdirs.py); unmarked, never
        ladder-memory.json, reload/, run/ (engine.log, the children journal, the engine's key file),
        cache/cuda-jit                    the driver's JIT cache (engines/caches.py: not shared while
                                          its worker lives; handed to a new worker of the same image
                                          and GPU kind once it is gone)

Without the volume a worker's state stays where the config says (the container disk), laid out
the same way.

A cluster's nodes (NUM_NODES > 1: cluster_env.py) split state_dir the same way, whether or not one
network volume is mounted on every node at it (`build.py cluster up --volume`): the shared part
above, each node's own in workers/<its id> (run/runtime.py own_state_dir). A node's directory
carries no mark and is never pruned: a cluster is created and deleted whole (its member pods cannot
be deleted one by one), so no node's directory dies while its cluster lives, and once the cluster is
gone (a FAILED one deletes itself) its nodes' engine logs there are what is left to read. The worker id is RUNPOD_POD_ID when RunPod sets it, else the hostname. Whether
load-balancing workers get RUNPOD_POD_ID at all is unresolved: RunPod publishes its env vars for
Pods only, and its SDK reads RUNPOD_POD_ID as the worker id of queue-based workers
(runpod/docs @a900806e lists the variables of Pods only); a container's
hostname is its own either way.
"""


from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any, Mapping

from .errors import Problem

__all__ = ["worker_id", "worker_dir", "volume_state_dir", "SHARED_DIR_NAME", "active", "apply_env", "health_code", "HEALTHY", "INITIALIZING", "UNHEALTHY", "DEFAULT_PORT",
           "DEFAULT_HEALTH_PATH", "STATUS_PATHS", "MODE_VARS", "checked_port", "release_line", "RELEASE_LINE"]

MODE_VARS = ("PORT_HEALTH", "RUNPOD_ENDPOINT_ID")   # either one: a Serverless worker
DEFAULT_PORT = 80                # RunPod's PORT when the endpoint's env does not set it (overview.mdx)
DEFAULT_HEALTH_PATH = "/ping"    # HEALTH_CHECK_PATH's default (overview.mdx @a900806e)
HEALTHY, INITIALIZING, UNHEALTHY = 200, 204, 503
# The status server's own pages (supervisor/status/server.py): the health path must be another.
STATUS_PATHS = ("/", "/live", "/ready", "/status", "/metrics")
_PATH = re.compile(r"/[A-Za-z0-9._~/-]{0,200}")
# Until the selftest passed, and again while the engine is being replaced, the worker initializes.
_GONE = ("FAILED", "STOPPING", "STOPPED")


def active(env: Mapping[str, str]) -> bool:
    """Whether this supervisor is a RunPod Serverless worker (PORT_HEALTH or RUNPOD_ENDPOINT_ID set)."""
    return any(env.get(name) for name in MODE_VARS)


def health_code(state: Any, ready: Any) -> int:
    """What the health path answers in a lifecycle state: 200 SERVING with its selftest passed
    (`ready`), 503 when it can never serve (FAILED: a terminal failure, a crash loop, every rung
    failed) or is going away, 204 otherwise (loading, selftest, restart, reload: initializing)."""
    if ready is True and state == "SERVING":
        return HEALTHY
    if state in _GONE:
        return UNHEALTHY
    return INITIALIZING


# -- the one failure line ---------------------------------------------------------------------------
# A worker that can never serve says so in one line, whatever the phase it failed in (a deploy config
# that does not parse: run/boot_failure.py; a failure once running: run/serverless.py), and `endpoint
# up --wait` (images/runpod/rollout.py) reads the class and cause out of the worker's log with this.
RELEASE_LINE = re.compile(r"serverless worker: it can never serve \((?P<cause>\S+: .*)\); \S+ on port \d+ answers 503")


def release_line(cause: str, health_path: str, port: int, grace_s: float) -> str:
    """The line: `cause` is "<failure class>: <why>", masked already, on one line."""
    return (f"serverless worker: it can never serve ({' '.join(cause.split())}); {health_path} on port {port} "
            f"answers 503 and the worker exits in {grace_s:g} s ([serverless] exit_grace_s) so RunPod releases it")


def checked_port(env: Mapping[str, str]) -> int:
    """The port RunPod's load balancer health-checks: PORT_HEALTH, else PORT, else 80 (overview.mdx),
    each where it is a valid port. A worker whose config failed runs no engine, so it may answer
    there even where PORT_HEALTH is the engine's PORT (the config's own error)."""
    ignored: list[Problem] = []
    for name in ("PORT_HEALTH", "PORT"):
        port = _port(env, name, ignored)
        if port is not None:
            return port
    return DEFAULT_PORT


def _port(env: Mapping[str, str], name: str, problems: list[Problem]) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        port = int(raw)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        problems.append(Problem(f"{name} (env)", "must be a TCP port", raw, "1 .. 65535"))
        return None
    return port


def apply_env(data: dict[str, Any], env: Mapping[str, str], problems: list[Problem]) -> str | None:
    """In serverless mode, put RunPod's PORT and PORT_HEALTH into the raw config `data` (server.port,
    status.port) and return the health path (HEALTH_CHECK_PATH); None when not in serverless mode.
    A KILN_SERVER_PORT or KILN_STATUS_PORT that says otherwise is a problem, never silently lost."""
    if not active(env):
        return None
    bad = len(problems)
    port = _port(env, "PORT", problems)
    health = _port(env, "PORT_HEALTH", problems)
    if len(problems) > bad:
        return DEFAULT_HEALTH_PATH
    engine_port = port if port is not None else DEFAULT_PORT
    # RunPod's default for PORT_HEALTH is PORT (overview.mdx); its OpenAPI text says 80. Either way
    # an unset PORT_HEALTH lands on the engine's port unless PORT is unset too and 80 is both.
    health_port = health if health is not None else engine_port
    if health_port == engine_port:
        said = (f"PORT_HEALTH = {health}" if health is not None else
                "PORT_HEALTH is not set, and RunPod then health-checks PORT")
        problems.append(Problem(
            "PORT_HEALTH (env)", f"{said}, which is the engine's port (PORT = {engine_port}{'' if port else ', its default'}): "
            "the engine owns PORT, so the health path cannot answer there",
            health_port, "another port, e.g. PORT_HEALTH=8081 beside PORT=8000, set in the endpoint's env and "
            "exposed with it (ports: [\"8000/http\", \"8081/http\"])"))
        return DEFAULT_HEALTH_PATH
    for name, path, want in (("KILN_SERVER_PORT", "server.port", engine_port),
                             ("KILN_STATUS_PORT", "status.port", health_port)):
        other = env.get(name)
        if other not in (None, "", str(want)):
            problems.append(Problem(f"{path} (from env {name})", f"contradicts RunPod's "
                                    f"{'PORT' if path == 'server.port' else 'PORT_HEALTH'} ({want}) on a "
                                    "Serverless worker", other, f"unset {name}, or set it to {want}"))
    data.setdefault("server", {})["port"] = engine_port
    data.setdefault("status", {})["port"] = health_port
    path = env.get("HEALTH_CHECK_PATH") or DEFAULT_HEALTH_PATH
    if not _PATH.fullmatch(path):
        problems.append(Problem("HEALTH_CHECK_PATH (env)", "must be a plain absolute path", path,
                                f"e.g. {DEFAULT_HEALTH_PATH}"))
        return DEFAULT_HEALTH_PATH
    if path.rstrip("/") in {p.rstrip("/") for p in STATUS_PATHS}:
        problems.append(Problem("HEALTH_CHECK_PATH (env)", "is one of the status server's own pages on "
                                "PORT_HEALTH; RunPod's health check needs a path of its own", path,
                                f"{DEFAULT_HEALTH_PATH} (the default), or another path not in "
                                f"{', '.join(STATUS_PATHS)}"))
        return DEFAULT_HEALTH_PATH
    return path


# -- the volume ------------------------------------------------------------------------------------
SHARED_DIR_NAME = "kiln"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def worker_id(env: Mapping[str, str]) -> str:
    """This worker's name, safe as one path segment (at most 64 characters)."""
    raw = env.get("RUNPOD_POD_ID") or socket.gethostname() or "worker"
    safe = _UNSAFE.sub("-", raw).strip(".-")[:64]
    return safe or "worker"


def worker_dir(state_dir: str | Path, env: Mapping[str, str]) -> Path:
    """Where this worker keeps what no other worker may write."""
    return Path(state_dir) / "workers" / worker_id(env)


def volume_state_dir(volume: object) -> str | None:
    """`<volume>/kiln` when `volume` (the raw [serverless] volume) is a directory that exists."""
    if not isinstance(volume, str) or not volume.startswith("/") or ".." in Path(volume).parts:
        return None
    return str(Path(volume) / SHARED_DIR_NAME) if Path(volume).is_dir() else None
