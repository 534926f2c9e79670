"""Which worker this is, and where its own state goes beside what the endpoint's workers share.

The worker id is RUNPOD_POD_ID when RunPod sets it, else the hostname. Whether load-balancing
workers get RUNPOD_POD_ID at all is unresolved: RunPod publishes its env vars for Pods only, and
its SDK reads RUNPOD_POD_ID as the worker id of queue-based workers
(/work/research/runpod-serverless.md, "Env vars RunPod sets in Serverless workers"); a container's
hostname is its own either way.
"""

from __future__ import annotations

import re
import socket
from typing import Mapping

__all__ = ["worker_id"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def worker_id(env: Mapping[str, str]) -> str:
    """This worker's name, safe as one path segment (at most 64 characters)."""
    raw = env.get("RUNPOD_POD_ID") or socket.gethostname() or "worker"
    safe = _UNSAFE.sub("-", raw).strip(".-")[:64]
    return safe or "worker"
