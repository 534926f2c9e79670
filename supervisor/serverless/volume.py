"""Many workers, one volume: what an endpoint's workers share and what each keeps to itself.

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
      serverless/failures/                deterministic failures (serverless/failures.py)
      workers/<worker id>/                this worker's own: never written by another
        ladder-memory.json, reload/, run/ (engine.log, the children journal, the engine's key file),
        cache/cuda-jit                    the driver's JIT cache (engines/caches.py: not shared)

Without the volume a worker's state stays where the config says (the container disk), laid out
the same way. The worker id is RUNPOD_POD_ID when RunPod sets it, else the hostname. Whether
load-balancing workers get RUNPOD_POD_ID at all is unresolved: RunPod publishes its env vars for
Pods only, and its SDK reads RUNPOD_POD_ID as the worker id of queue-based workers
(/work/research/runpod-serverless.md, "Env vars RunPod sets in Serverless workers"); a container's
hostname is its own either way. Stdlib only: supervisor/config.py uses `volume_state_dir`.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Mapping

__all__ = ["worker_id", "worker_dir", "volume_state_dir", "SHARED_DIR_NAME"]

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
