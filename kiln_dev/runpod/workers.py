"""What runs in a stand-in serverless worker: a real Kiln supervisor, as in a stand-in pod
(containers.py), with the env a load-balancing worker gets.

RunPod gives a worker the endpoint's env (secret references resolved) and RUNPOD_ENDPOINT_ID (the
one variable its serverless docs name). Whether a load-balancing worker also gets RUNPOD_POD_ID
is not documented; the stand-in sets it to the worker's id, as RunPod's SDK reads it for queue
workers, and gives no RUNPOD_API_KEY (not documented for serverless: Kiln must not need it).

A worker has its own network namespace on RunPod, so its supervisor listens on PORT and
PORT_HEALTH as the endpoint says; several workers on one loopback cannot, so each private port
(PORT, PORT_HEALTH, and the supervisor's TCP relay) is mapped to a free loopback port and the
variable points at it (Docker's port mapping, seen from inside). The endpoint's network volume is
one host directory per volume id, shared by every worker of it, at /runpod-volume as RunPod
mounts it; env values under /runpod-volume are rewritten to it, and KILN_SERVERLESS_VOLUME names
it for the supervisor (a worker on RunPod finds the path itself). The deploy config the image
would bake comes from the test: `config_for(endpoint, worker_id, volume_dir)`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .containers import REPO_ROOT, SupervisedContainer
from ..supervised import free_port

VOLUME_MOUNT = "/runpod-volume"      # storage/network-volumes.mdx: serverless workers mount it here
VOLUME_ENV = "KILN_SERVERLESS_VOLUME"
SECRET_REF = re.compile(r"\{\{ RUNPOD_SECRET_(\w+) \}\}")
PORT_VARS = ("PORT", "PORT_HEALTH", "KILN_TCP_PORT")


@dataclass
class Worker:
    """One worker of an endpoint, as the stand-in keeps it."""
    id: str
    endpoint_id: str
    version: int
    image: str
    container: Any                      # SupervisedContainer (or a test's container)
    api_port: int
    health_port: int
    health_path: str
    started_at: str
    t0: float = 0.0                     # monotonic start, for uptimeSeconds
    status: str = "INITIALIZING"        # WorkerStatus
    ever_answered: bool = False         # the health path has answered at least once
    inflight: int = 0
    idle_since: float | None = None     # monotonic: healthy with nothing in flight since then
    stale: bool = False                 # runs an older configuration than the endpoint's latest
    stopping: bool = False
    served: int = 0                     # requests routed to it
    system: list[tuple[str, str]] = field(default_factory=list)


class WorkerRunner:
    """Starts a real supervisor per worker. `config_for(endpoint, worker_id, volume_dir)` returns
    the deploy config TOML the image would bake (volume_dir: the host directory behind
    /runpod-volume, or None without a network volume)."""

    def __init__(self, workdir: Path, config_for: Callable[[dict[str, Any], str, Path | None], str],
                 extra_env: dict[str, str] | None = None):
        self.workdir = workdir
        self.config_for = config_for
        self.extra_env = dict(extra_env or {})
        self.started: list[SupervisedContainer] = []

    def volume_dir(self, endpoint: dict[str, Any]) -> Path | None:
        for vid in endpoint.get("networkVolumes") or []:
            return self.workdir / "network-volumes" / vid
        return None

    def start(self, endpoint: dict[str, Any], worker_id: str, env: dict[str, str]) -> tuple[SupervisedContainer,
                                                                                            int, int]:
        """The worker's container, its API port and its health port (both on loopback)."""
        home = self.workdir / "workers" / worker_id
        home.mkdir(parents=True, exist_ok=True)
        volume = self.volume_dir(endpoint)
        if volume:
            volume.mkdir(parents=True, exist_ok=True)
        cfg = home / "deploy.toml"
        cfg.write_text(self.config_for(endpoint, worker_id, volume))
        full = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "RUNPOD_", "HF_"))}
        full.update(PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1", **self.extra_env)
        for k, v in env.items():
            if volume and (v == VOLUME_MOUNT or v.startswith(VOLUME_MOUNT + "/")):
                v = str(volume) + v[len(VOLUME_MOUNT):]
            full[k] = v
        mapped = {var: free_port() for var in PORT_VARS}
        full.update({var: str(port) for var, port in mapped.items()})
        if volume:
            full[VOLUME_ENV] = str(volume)
        full["KILN_CONFIG"] = str(cfg)
        log_path = home / "container.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "supervisor", *str(endpoint.get("args") or "").split()],
                                    stdout=log, stderr=subprocess.STDOUT, env=full, cwd=REPO_ROOT,
                                    start_new_session=True)
        container = SupervisedContainer(proc, log_path, {8080: mapped["PORT"], 8081: mapped["PORT_HEALTH"]})
        self.started.append(container)
        return container, mapped["PORT"], mapped["PORT_HEALTH"]

    def resolve(self, env: dict[str, str], secrets: dict[str, str]) -> dict[str, str]:
        """Secret references resolved, as RunPod does before the container starts."""
        out = {}
        for k, v in env.items():
            m = SECRET_REF.fullmatch(v)
            out[k] = secrets.get(m.group(1), v) if m else v
        return out
