"""A worker that can never serve records why on the shared volume, so the next one does not repeat it.

A Serverless worker that fails for good answers 503 on its health path and exits after a grace
(supervisor/run/loop.py); RunPod then starts another worker. When the failure is
deterministic, that worker would download, load and fail the same way, and the next, and the
next: an endless replace loop billed by the second. So the failure is recorded here, keyed by
what decides it, and a later worker with the same key answers 503 and exits after the grace at
once, with no download and no load. Its exit is a crash to RunPod, and RunPod documents what it
does about those: "When an endpoint consistently produces unhealthy (crashing) workers, Runpod
scales it down to stop billing and reduce thrashing, and sends you an email" (runpod/docs
serverless/troubleshooting.mdx @a900806e, last changed 07222825).

    <shared>/serverless/failures/<key>.json     class, reason (masked), worker, at, what the key is of

The key is (image identity, config, GPU kind): the issue asks for image and config; the GPU kind is
added because one endpoint's pools mix GPU types (AMPERE_48 holds the A6000 and the A40), and an
OOM or a throughput floor on one says nothing of another. The config counts as its hash without
the ports (`config_identity`): workers of one endpoint sharing a host get different PORT and
PORT_HEALTH, and a port decides no recorded failure (a taken one is not recorded). A record older than
`[serverless] failure_ttl_s` is ignored (and replaced by the next failure), so a failure recorded
wrongly, or fixed by an env change the key does not see (a token), blocks no longer than that;
a new image or config is a new key and never waits. Deleting the file lifts it at once.

Not recorded: what depends on the host or the network rather than the image and config: a driver
too old (driver_incompatible), a port taken on the host (port_in_use), and a model that never
arrived (load_error before any rung ran: the Hub, the network or a token in the env).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..config import DeployConfig
from ..failure import Failure, FailureClass

__all__ = ["Recorded", "config_identity", "failure_key", "recordable", "record", "recall", "as_failure",
           "records_dir"]

REASON_MAX = 600          # characters of the (masked) reason kept in the record
_HOST_BOUND = frozenset({FailureClass.DRIVER_INCOMPATIBLE, FailureClass.PORT_IN_USE})


@dataclass(frozen=True)
class Recorded:
    failure_class: FailureClass
    reason: str
    worker: str
    at: float                 # Unix time the failure was recorded
    path: Path

    def age_s(self, now: float) -> float:
        return max(0.0, now - self.at)


def records_dir(shared: Path) -> Path:
    return shared / "serverless" / "failures"


def config_identity(cfg: DeployConfig) -> str:
    """The config's hash (DeployConfig.hash) without what a worker's environment sets per worker:
    the engine's port, the TCP relay's and the status server's."""
    d = cfg.to_dict()
    for table in ("watch", "runpod", "serverless", "status"):
        d.pop(table)
    d["server"].pop("port")
    d["server"].pop("tcp_port")
    blob = json.dumps(d, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(blob.encode()).hexdigest()


def failure_key(image: str, config_hash: str, gpus: Sequence[str]) -> str:
    """The record's name: what decides whether another worker would fail the same way."""
    parts = {"image": image, "config": config_hash, "gpus": sorted(gpus)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def recordable(failure: Failure | None) -> bool:
    """Whether a later worker of the same image and config, on the same GPUs, would fail the same way."""
    if failure is None or failure.failure_class in _HOST_BOUND:
        return False
    return not (failure.failure_class == FailureClass.LOAD_ERROR and failure.rung is None)


def record(shared: Path, key: str, failure: Failure, *, reason: str, worker: str, now: float,
           about: dict[str, Any]) -> Path:
    """Write the record atomically (a reader sees the old one or the new one); `reason` is masked
    already. Returns its path. OSError when the volume cannot be written (the caller warns)."""
    path = records_dir(shared) / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"class": failure.failure_class.value, "reason": reason[:REASON_MAX], "worker": worker,
            "at": round(now, 3), "rung": failure.rung, "key_of": about}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
    return path


def recall(shared: Path, key: str, *, ttl_s: float, now: float) -> Recorded | None:
    """The record for `key` when there is one younger than `ttl_s`; None for none, an old one or a
    damaged one (a damaged record costs one more attempt, never a wrong refusal)."""
    path = records_dir(shared) / f"{key}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        at = float(data["at"])
        cls = FailureClass(data["class"])
        reason, worker = str(data.get("reason") or ""), str(data.get("worker") or "?")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    # A record from the future (a host clock ahead) counts from now: it still expires within ttl_s.
    if not math.isfinite(at) or now - min(at, now) >= ttl_s:
        return None
    return Recorded(cls, reason, worker, min(at, now), path)


def as_failure(rec: Recorded, *, ttl_s: float, now: float) -> Failure:
    """The recorded failure as this worker's own: same class, the reason saying where it comes from."""
    left = max(0.0, ttl_s - rec.age_s(now))
    return Failure(rec.failure_class,
                   f"recorded {rec.age_s(now):.0f} s ago on the shared volume by worker {rec.worker}, with this "
                   f"image and config on these GPUs, so this worker neither downloads nor loads anything: "
                   f"{rec.reason} (the record expires in {left:.0f} s, [serverless] failure_ttl_s; a new image "
                   f"or config is not held by it; deleting {rec.path} lifts it now)")
