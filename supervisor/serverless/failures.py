"""A worker that can never serve records why on the shared volume, so the next ones do not repeat it.

A Serverless worker that fails for good answers 503 on its health path and exits after a grace
(supervisor/run/loop.py); RunPod then starts another worker. When the failure is
deterministic, that worker would download, load and fail the same way, and the next, and the
next: an endless replace loop billed by the second. So the failure is recorded here, keyed by
what decides it, and once two different workers have recorded the same failure a later worker with
the same key answers 503 and exits after the grace at once, with no download and no load. Its exit is
a crash to RunPod, and RunPod documents what it does about those: "When an endpoint consistently
produces unhealthy (crashing) workers, Runpod scales it down to stop billing and reduce thrashing,
and sends you an email" (runpod/docs serverless/troubleshooting.mdx @a900806e, last changed 07222825).

    <shared>/serverless/failures/<key>/<worker>.json   one witness: class, reason (masked), at, rung,
                                                       what the key is of
    <shared>/serverless/failures/<key>/served          the last time a worker of the key served: worker, at

One file per witness, never one shared file rewritten: two workers failing at once on a network
volume would otherwise each read the record, add themselves and replace it, and one would be lost.

## What is recorded: a property of image + config + GPU kind, never of one host

A record makes every later worker refuse for `[serverless] failure_ttl_s`, each billing its grace,
so only a failure that another worker of the same image, config and GPU kind would meet again is
recorded (`RECORDED`):
- config_rejected    the lint or the engine's parser refused the config: the same argv everywhere;
- model_incompatible the model file is not one this engine build loads: the image's and the config's;
- engine_missing     the image has no engine binary;
- oom                the model and the config do not fit this GPU kind (before the worker served);
- load_error         the model on the volume cannot be read by a rung (a rung ran: not the network);
- selftest_failed    the answers (greedy, deterministic) or the throughput floor on this GPU kind.

Never recorded, because one host decides them: stalled (a slow disk, a network volume under load, a
noisy neighbour), crashed (a crash loop, a crash after serving, a signal: an Xid error, the
container's OOM killer, a flaky card; a crash with no known signature is by definition not known
to be the config's, and RunPod's own thrash protection quoted above covers one that is),
driver_incompatible (the host's driver), port_in_use (the host's ports), load_error before any
rung (the Hub, the network, a token in the env), fork_unsafe (relaunched, never terminal); and
anything after the worker served (`served`): it proved this image, config and GPU kind can serve.

One witness blocks nobody (`WITNESSES`): a recordable class can still be one host's accident (an
OOM beside a leaked process, a throughput floor on a throttled card), and the same failure from two
different workers within the TTL is what makes it the key's. The second worker pays the load the
first did; every worker after it is spared.

A worker that served (SERVING: its selftest passed, where the config has one) clears its key's
witnesses (`served`): it proved this image, config and GPU kind can serve, so the failures before it
were their hosts'. It deletes them and marks the time, and a witness written before the mark counts
no more (one whose worker failed before the serve but whose file landed after, or one it could not
delete). Without that, two transient OOMs on two workers blocked the key for the whole TTL although
other workers served with it in between (issue 50 item 8). Two failures after the last serve block
as before.

## The key, the TTL, clearing

The key is (image identity, config, GPU kind): the GPU kind is added because one endpoint's pools mix
GPU types (AMPERE_48 holds the A6000 and the A40), and an OOM or a throughput floor on one says
nothing of another. The config counts as its hash without the ports (`config_identity`): workers of
one endpoint sharing a host get different PORT and PORT_HEALTH, and a port decides no recorded
failure. A witness older than `[serverless] failure_ttl_s` is ignored, so a failure recorded wrongly,
or fixed by an env change the key does not see (a token), blocks no longer than that; a new image or
config is a new key and never waits. Deleting `<key>/` lifts it at once where the volume can be
reached (a pod mounting it; RunPod's S3-compatible API); everywhere else `CLEARED_ENV` on the
endpoint (`build.py endpoint failures --clear` sets it: a new release) makes its workers ignore,
and delete, every witness written before that time.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..config import DeployConfig
from ..failure import Failure, FailureClass
from ..process.statefile import write_atomic

__all__ = ["Recorded", "config_identity", "failure_key", "recordable", "record", "recall", "as_failure",
           "records_dir", "cleared_at", "forget", "served", "RECORDED", "WITNESSES", "CLEARED_ENV", "SERVED_MARK"]

REASON_MAX = 600          # characters of the (masked) reason kept in a witness
WITNESSES = 2             # different workers that must fail the same way before the key blocks
RECORDED = frozenset({FailureClass.CONFIG_REJECTED, FailureClass.MODEL_INCOMPATIBLE, FailureClass.ENGINE_MISSING,
                      FailureClass.OOM, FailureClass.LOAD_ERROR, FailureClass.SELFTEST_FAILED})
# The endpoint's env: a Unix time; witnesses written before it are ignored and deleted.
CLEARED_ENV = "KILN_SERVERLESS_FAILURES_CLEARED_AT"
FORGET_MAX = 256          # witness files one worker deletes at most (bounded work at boot)
SERVED_MARK = "served"    # <key>/served: when a worker of the key last served (not a witness: no .json)


@dataclass(frozen=True)
class Recorded:
    failure_class: FailureClass
    reason: str               # the newest witness's
    workers: tuple[str, ...]  # the witnesses that make the block, oldest first
    at: float                 # when the oldest of them wrote: the block lifts when it expires
    path: Path                # the key's directory

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


def recordable(failure: Failure | None, *, served: bool = False) -> bool:
    """Whether a later worker of the same image and config, on the same GPUs, would fail the same way
    (the module doc says which classes, and why); never after this worker served."""
    if failure is None or served or failure.failure_class not in RECORDED:
        return False
    return not (failure.failure_class == FailureClass.LOAD_ERROR and failure.rung is None)


def record(shared: Path, key: str, failure: Failure, *, reason: str, worker: str, now: float,
           about: dict[str, Any]) -> Path:
    """Write this worker's witness atomically (a reader sees the old one or the new one); `reason` is
    masked already, `worker` one path segment (runpod_env.worker_id). Returns its path. OSError when
    the volume cannot be written (the caller warns)."""
    path = records_dir(shared) / key / f"{worker}.json"
    body = {"class": failure.failure_class.value, "reason": reason[:REASON_MAX], "worker": worker,
            "at": round(now, 3), "rung": failure.rung, "key_of": about}
    write_atomic(path, json.dumps(body, indent=1, sort_keys=True).encode())    # no temp file left on ENOSPC
    return path


def _witnesses(directory: Path, now: float) -> list[tuple[float, FailureClass, str, str]]:
    """(at, class, worker, reason) of each readable witness; a damaged one is left out (it costs one
    more attempt, never a wrong refusal). A time from the future (a host clock ahead) counts as now."""
    out = []
    try:
        files = sorted(directory.glob("*.json"))
    except OSError:
        return []
    for path in files:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            at = float(data["at"])
            cls = FailureClass(data["class"])
            reason = str(data.get("reason") or "")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if math.isfinite(at):
            out.append((min(at, now), cls, path.stem, reason))
    return out


def _served_at(directory: Path) -> float | None:
    """When a worker of this key last served (its mark); None when none did, or the mark is unreadable."""
    try:
        at = float(json.loads((directory / SERVED_MARK).read_text(encoding="utf-8"))["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return at if math.isfinite(at) else None


def served(shared: Path, key: str, *, worker: str, now: float) -> int:
    """A worker of `key` served: mark the time (a witness written before it counts no more, wherever
    it is read) and delete the witnesses before it; returns how many it deleted. OSError when the
    volume cannot be written (the caller warns)."""
    directory = records_dir(shared) / key
    write_atomic(directory / SERVED_MARK, json.dumps({"worker": worker, "at": round(now, 3)}).encode())
    gone = 0
    for at, _, name, _ in _witnesses(directory, now):
        if at < now:
            try:
                (directory / f"{name}.json").unlink()
                gone += 1
            except OSError:
                continue                          # ignored by recall all the same: it is before the mark
    return gone


def recall(shared: Path, key: str, *, ttl_s: float, now: float, cleared_at: float | None = None,
           witnesses: int = WITNESSES) -> Recorded | None:
    """The block on `key`: when `witnesses` different workers recorded the same class within `ttl_s`
    (and after `cleared_at`, and after the last time a worker of the key served); None otherwise."""
    directory = records_dir(shared) / key
    since = max((t for t in (cleared_at, _served_at(directory)) if t is not None), default=None)
    fresh = [w for w in _witnesses(directory, now)
             if now - w[0] < ttl_s and (since is None or w[0] >= since)]
    by_class: dict[FailureClass, dict[str, tuple[float, str]]] = {}
    for at, cls, worker, reason in fresh:
        seen = by_class.setdefault(cls, {})
        if worker not in seen or seen[worker][0] < at:
            seen[worker] = (at, reason)          # a worker's newest; one file per worker anyway
    for cls, seen in by_class.items():
        if len(seen) >= witnesses:
            newest = sorted(seen.items(), key=lambda kv: kv[1][0], reverse=True)[:witnesses]
            ordered = sorted(newest, key=lambda kv: kv[1][0])
            return Recorded(cls, ordered[-1][1][1], tuple(w for w, _ in ordered), ordered[0][1][0], directory)
    return None


def cleared_at(env: Mapping[str, str]) -> tuple[float | None, str | None]:
    """(the clear mark's Unix time, None) from the endpoint's env; (None, a problem naming the variable,
    the value and the fix) when it is set but not a time; (None, None) when it is not set."""
    raw = env.get(CLEARED_ENV)
    if raw is None or raw.strip() == "":
        return None, None
    try:
        at = float(raw)
    except ValueError:
        at = math.nan
    if not math.isfinite(at) or at < 0:
        return None, (f"{CLEARED_ENV} = {raw!r} is not a Unix time in seconds, so no failure record is cleared: "
                      "set it with `python build.py endpoint failures --target T --clear`, or remove it")
    return at, None


def forget(shared: Path, before: float, *, limit: int = FORGET_MAX) -> int:
    """Delete up to `limit` witnesses written before `before` (the clear mark), every key's; returns
    how many. Only files this module writes, under its own directory."""
    gone = 0
    for directory in sorted(p for p in records_dir(shared).glob("*") if p.is_dir()):
        for at, _, worker, _ in _witnesses(directory, math.inf):
            if gone >= limit:
                return gone
            if at < before:
                try:
                    (directory / f"{worker}.json").unlink()
                    gone += 1
                except OSError:
                    continue
        try:
            directory.rmdir()                    # empty now: nothing left of the key
        except OSError:
            pass
    return gone


def as_failure(rec: Recorded, *, ttl_s: float, now: float) -> Failure:
    """The recorded failure as this worker's own: same class, the reason saying where it comes from."""
    left = max(0.0, ttl_s - rec.age_s(now))
    workers = " and ".join(rec.workers)
    return Failure(rec.failure_class,
                   f"recorded on the shared volume by workers {workers} ({len(rec.workers)} different workers "
                   f"failed the same way within [serverless] failure_ttl_s), with this image and config on these "
                   f"GPUs, so this worker neither downloads nor loads anything: {rec.reason} (the record expires "
                   f"in {left:.0f} s; a new image or config is not held by it; `python build.py endpoint failures "
                   f"--target T --clear` lifts it, as does deleting {rec.path})")
