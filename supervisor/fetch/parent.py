"""Model fetch from the Hub into the volume's cache: pinned, filtered, preflighted, resumable.

    repo + revision (branch, tag or pinned commit) + allow_patterns (one quant out of many)
      -> list the files at that commit (huggingface_hub: repo_info, list_repo_tree)
      -> disk preflight: the bytes still missing against the free space, refused before any byte
      -> each missing file through huggingface_hub's http_get, into a partial that survives
         (Range resume: after a cut connection, a killed process, a restarted container)
      -> verify (size, and the content hash the Hub names the blob by) -> into the cache
      -> a manifest of what is complete, so an outage or a 429 can still serve it

The cache is huggingface_hub's own layout (blobs/, snapshots/<commit>/, refs/) under
<state_dir>/hf, so its tools read it. Nothing here ever deletes a complete blob: a moved branch
or a changed ETag only adds a snapshot beside the old one (llama.cpp deletes a cached 50 GB
model when the ETag changes, llama.cpp#20005; a Hub 429 blocks a cached model there, #21677).
huggingface_hub 2.4's own hf_hub_download resumes only within one call: on any failure it
deletes its (per-process) partial file, which for a 181 GiB model is an hour lost.

The download runs in a child process (`python -m supervisor.fetch`) that prints one JSON event
per line; the parent (`fetch()`, called by the lifecycle loop) watches those events: a download
that moves no byte for `model.fetch_stall_s` is killed (a stall-based deadline, not a total
one: a slow link that keeps moving is fine), and a stop request kills it at once. A transient
failure (no network, 429, 5xx) with no complete cached copy is retried with backoff, resuming,
for as long as the stall deadline allows.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import queue
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from . import hubclient
from .config import COMMIT, DeployConfig
from .errors import Cancelled, FetchError
from .redact import redact

DISK_MARGIN = 1 << 20        # refs, manifests and tree caches need a little room too
PROGRESS_EVERY_S = 0.5
CHUNK = 1 << 20              # resume and progress granularity (huggingface_hub's default is 10 MB)
META_TIMEOUT_S = 20.0
EXIT_OK, EXIT_ERROR = 0, 2


def cache_dir(cfg: DeployConfig) -> Path:
    return Path(cfg.state_dir) / "hf"


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def free_bytes(path: Path) -> int:
    """Free bytes for an unprivileged writer on the filesystem holding `path` (statvfs)."""
    return shutil.disk_usage(path).free


# ---------------------------------------------------------------------------- child side


@dataclass(frozen=True)
class Planned:
    path: str          # in the repo
    size: int
    blob: str          # the cache's blob name: the LFS sha256, else the git blob sha1


def _manifest_path(cache: Path, repo: str, revision: str, allow: Sequence[str]) -> Path:
    key = hashlib.sha256("\0".join([repo, revision, *sorted(allow)]).encode()).hexdigest()[:24]
    return cache / "kiln-manifests" / f"{key}.json"


def _storage(cache: Path, repo: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--"))


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def cached_snapshot(cache: Path, repo: str, revision: str, allow: Sequence[str]) -> tuple[Path, str] | None:
    """(snapshot dir, commit) of a complete earlier fetch of this repo/revision/patterns, or None.
    Complete means every file the manifest lists is there with its size."""
    try:
        man = json.loads(_manifest_path(cache, repo, revision, allow).read_text(encoding="utf-8"))
        snap = _storage(cache, repo) / "snapshots" / man["commit"]
        for rel, size in man["files"].items():
            if (snap / rel).stat().st_size != size:
                return None
        return snap, man["commit"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _digest_matches(path: Path, blob: str, emit: Callable[..., None], moved: list[int]) -> bool:
    """The blob name is a content hash: sha256 (LFS files) or git's blob sha1 (regular files)."""
    size = path.stat().st_size
    if len(blob) == 64:
        h = hashlib.sha256()
    elif len(blob) == 40:
        h = hashlib.sha1(b"blob %d\0" % size)
    else:
        return True   # an ETag that is no hash we know: the size check is all we have
    with path.open("rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            h.update(block)
            moved[0] += len(block)     # hashing a big file is progress too: not a stall
    return h.hexdigest() == blob


class _Child:
    """One fetch attempt, in the child process. Emits events; returns an exit status."""

    def __init__(self, repo: str, revision: str, cache: Path, allow: Sequence[str], entry: str,
                 token: str | None, emit: Callable[..., None], free: Callable[[Path], int] = free_bytes):
        self.repo, self.revision, self.cache, self.allow, self.entry = repo, revision, cache, list(allow), entry
        self.token, self.emit, self.free = token, emit, free
        self.storage = _storage(cache, repo)
        self.moved = [0]         # bytes hashed (verification progress)
        self.plan: list[Planned] = []

    def run(self) -> int:
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile
        from huggingface_hub.utils import filter_repo_objects

        api = HfApi(token=self.token or False)
        try:
            if COMMIT.fullmatch(self.revision):
                commit = self.revision
            else:
                commit = api.repo_info(self.repo, revision=self.revision, timeout=META_TIMEOUT_S).sha
            files = [f for f in api.list_repo_tree(self.repo, revision=commit, recursive=True)
                     if isinstance(f, RepoFile)]
        except Exception as e:  # noqa: BLE001 - classified: transient ones fall back to the cache
            return self._failed(e, "listing the repo")
        wanted = list(filter_repo_objects(files, allow_patterns=self.allow or None, key=lambda f: f.path))
        if not wanted:
            return self._error("entry", f"no file of {self.repo}@{commit[:12]} matches allow_patterns "
                                        f"{self.allow or ['*']}")
        hits = [f.path for f in wanted if fnmatch.fnmatchcase(f.path, self.entry)]
        if len(hits) != 1:
            return self._error("entry", f"model.entry {self.entry!r} matches {len(hits)} of the files to fetch "
                                        f"({', '.join(hits[:5]) or 'none'}); it must match exactly one")
        self.plan = [Planned(f.path, int(f.size or 0), f.lfs.sha256 if f.lfs else f.blob_id) for f in wanted]
        total = sum(p.size for p in self.plan)
        need = sum(p.size - self._have(p) for p in self.plan)
        self.cache.mkdir(parents=True, exist_ok=True)
        free = self.free(self.cache)
        self.emit("plan", commit=commit, files=len(self.plan), total=total, need=need, free=free)
        if need + DISK_MARGIN > free:
            missing = sum(1 for p in self.plan if self._have(p) < p.size)
            return self._error("disk", f"not enough disk for {self.repo}@{self.revision}: {human(need)} still to "
                                       f"download ({missing} file(s), {human(total)} in all) but {human(free)} free "
                                       f"at {self.cache}; nothing was downloaded")
        ticker = threading.Thread(target=self._tick, args=(total,), daemon=True)
        ticker.start()
        snap = self.storage / "snapshots" / commit
        for p in self.plan:
            try:
                self._one(p, commit, snap)
            except FetchError as e:
                return self._error("verify", str(e))
            except Exception as e:  # noqa: BLE001
                return self._failed(e, f"downloading {p.path}")
        if commit != self.revision:
            ref = self.storage / "refs" / self.revision
            ref.parent.mkdir(parents=True, exist_ok=True)
            ref.write_text(commit)
        _write_json(_manifest_path(self.cache, self.repo, self.revision, self.allow),
                    {"repo": self.repo, "revision": self.revision, "allow_patterns": self.allow, "commit": commit,
                     "files": {p.path: p.size for p in self.plan}, "at": time.time()})
        self.emit("progress", done=total, total=total, moved=self.moved[0])
        self.emit("done", snapshot=str(snap), commit=commit, total=total, from_cache=False, note="")
        return EXIT_OK

    # -- pieces

    def _paths(self, p: Planned) -> tuple[Path, Path]:
        blobs = self.storage / "blobs"
        return blobs / p.blob, blobs / f"{p.blob}.incomplete"

    def _have(self, p: Planned) -> int:
        """Bytes of this file already on disk: all of it (a complete blob), or the partial's length."""
        blob, part = self._paths(p)
        try:
            if blob.stat().st_size == p.size:
                return p.size
        except OSError:
            pass
        try:
            return min(part.stat().st_size, p.size)
        except OSError:
            return 0

    def _tick(self, total: int) -> None:
        while True:
            time.sleep(PROGRESS_EVERY_S)
            self.emit("progress", done=sum(self._have(p) for p in self.plan), total=total, moved=self.moved[0])

    def _one(self, p: Planned, commit: str, snap: Path) -> None:
        import fcntl

        from huggingface_hub import constants
        from huggingface_hub.file_download import hf_hub_url, http_get
        from huggingface_hub.utils import build_hf_headers

        blob, part = self._paths(p)
        link = snap / p.path
        if not (blob.is_file() and blob.stat().st_size == p.size):
            blob.parent.mkdir(parents=True, exist_ok=True)
            # huggingface_hub's own lock for this blob: another downloader of the same cache waits.
            lock_path = self.cache / ".locks" / self.storage.name / f"{p.blob}.lock"
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            with open(lock_path, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (blob.is_file() and blob.stat().st_size == p.size):
                    constants.DOWNLOAD_CHUNK_SIZE = CHUNK   # finer resume points and progress
                    headers = build_hf_headers(token=self.token or False)
                    headers["Accept-Encoding"] = "identity"
                    with open(part, "r+b" if part.exists() else "wb") as f:
                        have = f.seek(0, os.SEEK_END)
                        if have > p.size:            # not this blob's prefix: start over
                            f.seek(0)
                            f.truncate()
                            have = 0
                        if have < p.size:
                            http_get(hf_hub_url(self.repo, p.path, revision=commit), f, resume_size=have,
                                     headers=headers, expected_size=p.size, displayed_filename=p.path)
                    if part.stat().st_size != p.size or not _digest_matches(part, p.blob, self.emit, self.moved):
                        part.unlink(missing_ok=True)   # a wrong partial would poison every resume
                        raise FetchError(f"{p.path}: the downloaded bytes do not match the Hub's "
                                         f"{'sha256' if len(p.blob) == 64 else 'git oid'} {p.blob[:12]}")
                    os.chmod(part, 0o644)
                    os.replace(part, blob)
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
            tmp.unlink(missing_ok=True)
            os.symlink(os.path.relpath(blob, link.parent), tmp)
            os.replace(tmp, link)

    def _failed(self, e: BaseException, doing: str) -> int:
        kind = hubclient.classify(e)
        why = f"{doing}: {hubclient.describe(e)}"
        if kind in hubclient.TRANSIENT:
            cached = cached_snapshot(self.cache, self.repo, self.revision, self.allow)
            if cached is not None:
                snap, commit = cached
                note = (f"the Hub is {'unreachable' if kind == hubclient.OFFLINE else 'unavailable'} ({why}); "
                        f"serving the complete cached copy at commit {commit[:12]}")
                self.emit("done", snapshot=str(snap), commit=commit, total=None, from_cache=True, note=note)
                return EXIT_OK
        return self._error(kind, why)

    def _error(self, kind: str, message: str) -> int:
        self.emit("error", kind=kind, message=message)
        return EXIT_ERROR


def _emitter(stream: Any) -> Callable[..., None]:
    lock = threading.Lock()

    def emit(event: str, **kv: Any) -> None:
        with lock:
            stream.write(json.dumps({"event": event, **kv}) + "\n")
            stream.flush()
    return emit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m supervisor.fetch", description="fetch one model into the cache "
                                 "(the supervisor runs this; events are JSON lines on stdout)")
    ap.add_argument("--repo", required=True)
    ap.add_argument("--revision", default="main")
    ap.add_argument("--cache", required=True)
    ap.add_argument("--entry", required=True)
    ap.add_argument("--allow", action="append", default=[])
    a = ap.parse_args(argv)
    emit = _emitter(sys.stdout)
    try:
        return _Child(a.repo, a.revision, Path(a.cache), a.allow, a.entry, hubclient.token(), emit).run()
    except Exception as e:  # noqa: BLE001 - the parent needs one line, not a traceback
        emit("error", kind="other", message=hubclient.describe(e))
        return EXIT_ERROR


# ---------------------------------------------------------------------------- parent side


@dataclass
class FetchResult:
    path: Path                  # the file the engine loads
    snapshot: Path
    commit: str | None
    from_cache: bool
    note: str = ""
    total_bytes: int | None = None
    attempts: int = 1
    events: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "commit": self.commit, "from_cache": self.from_cache, "note": self.note,
                "total_bytes": self.total_bytes, "attempts": self.attempts}


def _child_env(env: Mapping[str, str], token: str | None) -> dict[str, str]:
    out = dict(env)
    root = str(Path(__file__).resolve().parents[1])
    out["PYTHONPATH"] = root + (os.pathsep + out["PYTHONPATH"] if out.get("PYTHONPATH") else "")
    if token:
        out["HF_TOKEN"] = token
    out.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    out["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    out["PYTHONUNBUFFERED"] = "1"
    return out


def fetch(cfg: DeployConfig, env: Mapping[str, str], *, token: str | None, should_stop: Callable[[], bool],
          sleep: Callable[[float], None], report: Callable[[dict[str, Any]], None] = lambda e: None,
          secrets: Sequence[str] = (), python: str = sys.executable) -> FetchResult:
    """Fetch cfg.model (an hf:// source) into the cache; the file to load, or FetchError/Cancelled."""
    from .model import pick_entry
    from .process import ManagedProcess

    spec = cfg.model
    assert spec.hf_repo and spec.entry
    revision = spec.revision or "main"
    argv = [python, "-m", "supervisor.fetch", "--repo", spec.hf_repo, "--revision", revision,
            "--cache", str(cache_dir(cfg)), "--entry", spec.entry]
    for pattern in spec.allow_patterns:
        argv += ["--allow", pattern]
    child_env = _child_env(env, token)
    stall_s = spec.fetch_stall_s
    last_move = time.monotonic()
    best = -1
    backoff = 1.0
    attempts = 0
    last_error: str | None = None      # the previous attempt's transient failure, if any
    while True:
        attempts += 1
        events: queue.Queue[str] = queue.Queue()
        proc = ManagedProcess.start(argv, env=child_env, on_line=events.put, redact=list(secrets), tail_lines=50)
        final: dict[str, Any] | None = None
        try:
            while final is None:
                while True:
                    try:
                        line = events.get_nowait()
                    except queue.Empty:
                        break
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue          # a library's stray print; the tail keeps it
                    if ev.get("event") in ("done", "error"):
                        final = ev
                    elif ev.get("event") in ("plan", "progress"):
                        moved = int(ev.get("done") or 0) + int(ev.get("moved") or 0)
                        if moved > best:
                            best, last_move = moved, time.monotonic()
                        report(ev)
                if final is not None:
                    break
                if proc.poll() is not None:
                    proc.stop(0)          # joins the reader: every line it printed is queued now
                    if events.empty():
                        tail = " | ".join(proc.tail()[-3:])
                        final = {"event": "error", "kind": "other",
                                 "message": f"the fetch process exited with status {proc.poll()}: {tail}"}
                    continue
                if should_stop():
                    raise Cancelled("stop requested during the model fetch")
                if time.monotonic() - last_move > stall_s:
                    if last_error:
                        raise FetchError(f"could not fetch {spec.source}@{revision} and no complete copy is cached: "
                                         f"{last_error} (no progress for {stall_s:g} s, model.fetch_stall_s)")
                    raise FetchError(f"the download of {spec.source}@{revision} moved no byte for {stall_s:g} s "
                                     "(model.fetch_stall_s); what arrived is kept and resumes next time")
                sleep(0.1)
        finally:
            proc.stop(2.0)
        if final["event"] == "done":
            report(final)
            snap = Path(final["snapshot"])
            return FetchResult(pick_entry(snap, spec.entry), snap, final.get("commit"), bool(final.get("from_cache")),
                               redact(final.get("note") or "", secrets), final.get("total"), attempts)
        kind, message = final.get("kind"), redact(str(final.get("message")), secrets)
        if kind not in hubclient.TRANSIENT:
            raise FetchError(f"could not fetch {spec.source}@{revision}: {message}")
        # No complete copy in the cache, and the Hub is away: retry (resuming) until the stall deadline.
        last_error = message
        left = stall_s - (time.monotonic() - last_move)
        if left <= 0:
            raise FetchError(f"could not fetch {spec.source}@{revision} and no complete copy is cached: {message} "
                             f"(no progress for {stall_s:g} s, model.fetch_stall_s)")
        report({"event": "retry", "in_s": min(backoff, left), "why": message})
        deadline = time.monotonic() + min(backoff, left)
        while time.monotonic() < deadline:
            if should_stop():
                raise Cancelled("stop requested during the model fetch")
            sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        backoff = min(backoff * 2, 30.0)


if __name__ == "__main__":
    sys.exit(main())
