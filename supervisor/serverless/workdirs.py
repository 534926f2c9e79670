"""Each Serverless worker's own directory on the shared volume: marked as Kiln's, kept alive by a
heartbeat, pruned once its worker is gone, its driver JIT cache handed on rather than thrown away.

    <shared>/workers/<id>/                  a worker's own (supervisor/runpod_env.py): engine log (up to
                                            256 MiB), the reload book, ladder memory, run/, cache/cuda-jit
                                            (the driver's JIT cache, up to 4 GiB: engines/caches.py)
      .kiln-worker                          MARK: Kiln made this directory (worker, image, GPUs); its
                                            mtime is the heartbeat, touched every HEARTBEAT_S
    <shared>/workers/.pruning-<by>-<id>/    a dead worker's directory claimed by the worker pruning it

Workers come and go (scale to zero, new releases, RunPod replacing a failed one), each with a new id,
and nothing ever deleted their directories. A worker's directory is dead when its mark has not been
touched for DEAD_AFTER_S, measured against the volume's own clock (the mtime this worker's touch just
gave its own mark), so a skew between hosts' clocks does not make a live worker look dead. A worker
frozen longer than that (SIGSTOP) loses its directory; it keeps running on what it has open.

What is pruned and what is never touched:
- only directories carrying MARK (and tombstones, which carry a dead worker's mark): a directory
  without one, a user's or an older Kiln's, is never deleted, nor is anything outside workers/;
- at most PRUNE_MAX directories per worker boot, each claimed first by an atomic rename to a
  tombstone whose mark is touched, so two workers pruning at once never delete the same tree, and a
  pruner that dies half way leaves a tombstone a later worker claims once that mark is DEAD_AFTER_S
  old (the mark goes last, so it stays recognisable);
- the driver's JIT cache of a dead worker of the same image and GPU kind is renamed into this worker's
  own directory when it has none yet (before its engine starts): the cache is not safe to share between
  live writers (engines/caches.py: NVIDIA documents no cross-process locking; DeepEP#683), but one with
  no writer left is, so a PTX-only build pays its JIT once per chain of workers rather than once each.
  Another image's or GPU kind's entries would only miss, so those are deleted. vLLM's, Inductor's and
  Triton's caches are shared already (under <shared>/cache, not in a worker's directory);
- a JIT cache reached through a symbolic link (cache/ or cuda-jit), or holding one that leads out of
  it, is never taken: a rename through the link moved whatever it led to, outside the volume too. It
  is said (the log, /status serverless.pruned.jit_cache_refused) and the link pruned with its directory.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..process.statefile import write_atomic

__all__ = ["MARK", "HEARTBEAT_S", "DEAD_AFTER_S", "PRUNE_MAX", "JIT_CACHE", "Pruned", "mark", "beat", "dead",
           "adopt_jit_cache", "prune", "now_on"]

MARK = ".kiln-worker"
HEARTBEAT_S = 60.0
DEAD_AFTER_S = 3600.0     # sixty missed heartbeats: a live worker is never near it
PRUNE_MAX = 8             # directories one worker prunes at its boot (bounded work; the next boot goes on)
TOMBSTONE = ".pruning-"
JIT_CACHE = Path("cache") / "cuda-jit"     # engines/caches.py CUDA_JIT, under a worker's own directory
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")    # runpod_env.worker_id's


@dataclass
class Pruned:
    removed: list[str] = field(default_factory=list)     # the dead workers' ids
    bytes: int = 0
    adopted: str | None = None                           # the worker whose JIT cache this one took
    errors: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)     # dead workers' JIT caches not taken: why (a link)

    def to_dict(self) -> dict[str, Any]:
        return {"removed": list(self.removed), "bytes": self.bytes, "adopted_jit_cache_of": self.adopted,
                "errors": list(self.errors), "jit_cache_refused": list(self.refused)}


def mark(own: Path, *, worker: str, image: str, gpus: Sequence[str], now: float) -> Path:
    """Mark `own` as this worker's, Kiln-made (atomically); the write is the first heartbeat."""
    path = own / MARK
    write_atomic(path, json.dumps({"worker": worker, "image": image, "gpus": sorted(gpus), "started": round(now, 3)},
                                  sort_keys=True).encode())
    return path


def beat(own: Path) -> float:
    """Touch the mark; returns its new mtime, the volume's "now". OSError when it cannot."""
    path = own / MARK
    os.utime(path)
    return path.stat().st_mtime


def _about(directory: Path) -> dict[str, Any]:
    try:
        data = json.loads((directory / MARK).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def dead(workers: Path, own: Path, *, now: float, dead_after_s: float = DEAD_AFTER_S) -> list[Path]:
    """Marked directories (and tombstones) under `workers` but `own` whose mark is older than
    `dead_after_s` by the volume's clock (`now`: beat()'s answer), the longest dead first."""
    found = []
    try:
        entries = list(workers.iterdir())
    except OSError:
        return []
    for d in entries:
        if d == own or d.is_symlink() or not d.is_dir():
            continue
        try:
            seen = (d / MARK).stat().st_mtime
        except OSError:
            continue                                     # no mark: not Kiln's to delete
        if now - seen > dead_after_s:
            found.append((seen, d))
    return [d for _, d in sorted(found)]


def _linked(d: Path) -> str | None:
    """Why the JIT cache under the worker directory `d` must not be handed over, or None: a link on
    the way to it (cache/ or cuda-jit itself: renaming through it would move whatever it leads to, on
    the volume or not), or a link in it that leads out of it. Looks, never follows."""
    source = d / JIT_CACHE
    for step in (source.parent, source):
        if step.is_symlink():
            return f"{step} is a symbolic link (to {os.readlink(step)})"
    if not source.is_dir():
        return None
    top = os.path.realpath(source)
    for root, dirs, files in os.walk(source):          # followlinks=False: a linked directory is in `dirs`
        for name in dirs + files:
            path = os.path.join(root, name)
            if os.path.islink(path) and os.path.commonpath([top, os.path.realpath(path)]) != top:
                return f"{path} is a symbolic link out of the cache (to {os.readlink(path)})"
    return None


def adopt_jit_cache(dead_dirs: Sequence[Path], own: Path, *, image: str, gpus: Sequence[str],
                    refused: list[str] | None = None) -> str | None:
    """Rename the JIT cache of a dead worker of this image and GPU kind into `own` when `own` has none;
    the id of the worker it came from, or None. A rename: atomic, one adopter wins. A cache reached
    through a symbolic link, or holding one that leads out of it, is never taken: why goes to `refused`."""
    target = own / JIT_CACHE
    if target.exists():
        return None
    for d in dead_dirs:
        about = _about(d)
        if about.get("image") != image or sorted(about.get("gpus") or []) != sorted(gpus):
            continue
        source = d / JIT_CACHE
        why = _linked(d)
        if why is not None:
            if refused is not None:
                refused.append(f"the JIT cache of worker {about.get('worker') or d.name} was not taken over: {why}")
            continue
        if not source.is_dir():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(source, target)
        except OSError:
            continue                                     # another worker took it first
        return str(about.get("worker") or d.name)
    return None


def _remove(tree: Path, errors: list[str]) -> int:
    """Delete a claimed tree bottom-up, its mark last; the bytes freed. Never follows a symlink."""
    freed = 0
    for root, dirs, files in os.walk(tree, topdown=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = Path(root) / name
            if path == tree / MARK:
                continue
            try:
                freed += path.lstat().st_size
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as e:
                errors.append(f"{path}: {e.strerror or e}")
        for name in dirs:
            path = Path(root) / name
            if not path.is_symlink():
                try:
                    path.rmdir()
                except OSError:
                    pass
    try:
        (tree / MARK).unlink()
        tree.rmdir()
    except FileNotFoundError:
        pass
    except OSError as e:
        errors.append(f"{tree}: {e.strerror or e}")
    return freed


def prune(workers: Path, own: Path, dead_dirs: Sequence[Path], *, pruner: str, limit: int = PRUNE_MAX,
          pruned: Pruned | None = None) -> Pruned:
    """Delete up to `limit` of `dead_dirs` (dead(): marked, not `own`), each claimed first by renaming it
    to a tombstone of this worker's; one another worker claimed first is skipped."""
    out = pruned or Pruned()
    for d in list(dead_dirs)[:limit]:
        said = str(_about(d).get("worker") or "")
        name = said if _SEGMENT.fullmatch(said) else d.name       # a tombstone's own worker, not its name
        claimed = workers / f"{TOMBSTONE}{pruner}-{name}"
        try:
            os.rename(d, claimed)
        except OSError:
            continue
        try:
            os.utime(claimed / MARK)            # claimed: alive again for DEAD_AFTER_S, unless this pruner dies
        except OSError:
            pass
        out.bytes += _remove(claimed, out.errors)
        out.removed.append(name)
    return out


def now_on(own: Path) -> float:
    """The volume's clock as this worker sees it: its mark touched now (time.time() if it cannot be)."""
    try:
        return beat(own)
    except OSError:
        return time.time()
