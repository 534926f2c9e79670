"""One fetch attempt, in the child process (`python -m supervisor.model.fetch`): plan, preflight, download.

Events, one JSON object per line on stdout, are all the parent (parent.py) sees:

    plan      commit, files, total, need (bytes still missing), free, connections, segment
    progress  done (bytes of the model on disk and recorded), total, moved (bytes received + bytes
              verified this run: only grows, what the stall deadline watches), verified, active
              (connections busy now), files_done, every PROGRESS_EVERY_S
    retry     why: a transient failure being ridden out (the segment resumes after a backoff)
    done      snapshot, commit, total, from_cache, note (and verified_after_last_byte_s: how long the
              last verification trailed the last byte received)
    error     kind (hubclient's vocabulary, or entry / disk / verify), message

A transient failure (no network, 429, 5xx) while listing ends the attempt (the parent retries
it, or a complete cached copy serves); during the download it is ridden out segment by segment,
unless a complete cached copy can serve now, which it then does.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ... import hubclient
from ...errors import FetchError
from . import layout, plan
from .download import FileDownload, Meters, Scheduler
from .http_source import HttpSource
from .xet_source import XetSource, available as xet_available

PROGRESS_EVERY_S = 0.5
RETRY_NOTE_EVERY_S = 1.0
CHUNK = 256 << 10            # http_get's write size: what a cut connection can lose (its default is 10 MB)
EXIT_OK, EXIT_ERROR = 0, 2


class Child:
    """Emits events; returns an exit status."""

    def __init__(self, repo: str, revision: str, cache: Path, allow: Sequence[str], entry: str,
                 token: str | None, emit: Callable[..., None], *, connections: int = 32, segment_mib: int = 0,
                 free: Callable[[Path], int] = layout.free_bytes, take_over: bool = False):
        self.repo, self.revision, self.cache, self.allow, self.entry = repo, revision, cache, list(allow), entry
        self.token, self.emit, self.free = token, emit, free
        self.connections, self.segment_mib = connections, segment_mib
        self.take_over = take_over          # a stalled holder's per-file locks are not waited for
        self.meters = Meters()
        self.downloads: list[FileDownload] = []
        self.scheduler: Scheduler | None = None
        self._last_note = 0.0
        self._cached: tuple[Path, str] | None = None
        self._why, self._kind = "", hubclient.UNAVAILABLE

    def run(self) -> int:
        from huggingface_hub import HfApi, constants

        constants.DOWNLOAD_CHUNK_SIZE = CHUNK
        api = HfApi(token=self.token or False)
        try:
            commit, files = plan.list_files(api, self.repo, self.revision)
        except Exception as e:  # noqa: BLE001 - classified: transient ones fall back to the cache
            return self._failed(e, "listing the repo")
        try:
            items = plan.select(files, self.allow, self.entry, self.repo, commit)
        except plan.PlanError as e:
            return self._error(e.kind, str(e))
        snap = layout.storage(self.cache, self.repo) / "snapshots" / commit
        by_blob: dict[str, FileDownload] = {}
        for item in items:              # the same content under two names: one download (one blob lock)
            if item.blob in by_blob:
                by_blob[item.blob].paths.append(item.path)
            else:
                by_blob[item.blob] = FileDownload(self.cache, self.repo, item, snap, 0, self._source(item, commit),
                                                  self.meters)
        self.downloads = list(by_blob.values())
        total = sum(d.item.size for d in self.downloads)
        have = [d.have() for d in self.downloads]
        need = total - sum(have)
        seg = plan.segment_size(need, self.connections, self.segment_mib)
        for d in self.downloads:
            d.seg = seg                 # for files with no journal yet; a journal keeps its own
            d.take_over = self.take_over
        self.cache.mkdir(parents=True, exist_ok=True)
        free = self.free(self.cache)
        self.emit("plan", commit=commit, files=len(self.downloads), total=total, need=need, free=free,
                  connections=self.connections, segment=seg)
        if need + layout.DISK_MARGIN > free:
            missing = sum(1 for d, h in zip(self.downloads, have) if h < d.item.size)
            return self._error("disk", f"not enough disk for {self.repo}@{self.revision}: {layout.human(need)} still "
                                       f"to download ({missing} file(s), {layout.human(total)} in all) but "
                                       f"{layout.human(free)} free at {self.cache}; nothing was downloaded")
        self.scheduler = Scheduler(self.connections, self._transient, self._note)
        threading.Thread(target=self._tick, args=(total,), daemon=True).start()
        try:
            self.scheduler.run(self.downloads)
        except Exception as e:  # noqa: BLE001 - a lock or a partial that cannot be opened
            return self._failed(e, "preparing the download")
        if self.scheduler.stopped_for_cache and self._cached is not None:
            return self._from_cache(self._cached, self._why, self._kind)
        if self.scheduler.error is not None:
            err = self.scheduler.error
            if isinstance(err, FetchError):
                return self._error(self.scheduler.error_kind, str(err))
            return self._failed(err, "downloading")
        layout.write_ref(self.cache, self.repo, self.revision, commit)
        layout.write_manifest(self.cache, self.repo, self.revision, self.allow, commit,
                              {item.path: item.size for item in items}, time.time())
        self._progress(total)
        # How long after the last byte arrived the last file was verified: the hash kept up if this is small.
        tail = time.monotonic() - self.meters.received.last if self.meters.received.last else 0.0
        self.emit("done", snapshot=str(snap), commit=commit, total=total, from_cache=False, note="",
                  verified_after_last_byte_s=round(tail, 3))
        return EXIT_OK

    def _source(self, item: plan.Planned, commit: str) -> Any:
        if item.xet_hash and xet_available():
            return XetSource(self.repo, commit, self.token, item.xet_hash, item.size)
        return HttpSource(self.repo, item.path, commit, self.token)

    # -- events

    def _tick(self, total: int) -> None:
        while True:
            time.sleep(PROGRESS_EVERY_S)
            self._progress(total)

    def _progress(self, total: int) -> None:
        m = self.meters
        self.emit("progress", done=sum(d.done_bytes() for d in self.downloads), total=total,
                  moved=m.received.value + m.hashed.value, verified=m.hashed.value,
                  active=self.scheduler.active if self.scheduler else 0,
                  files_done=sum(1 for d in self.downloads if d.complete), files=len(self.downloads))

    def _note(self, why: str, always: bool = False) -> None:
        """A retry event; routine ones (a backoff) at most every RETRY_NOTE_EVERY_S."""
        now = time.monotonic()
        if always or now - self._last_note >= RETRY_NOTE_EVERY_S:
            self._last_note = now
            self.emit("retry", why=why)

    def _transient(self, e: BaseException) -> bool:
        """A transient failure mid-download: True (stop) if a complete cached copy can serve now."""
        if self._cached is None:
            self._cached = layout.cached_snapshot(self.cache, self.repo, self.revision, self.allow)
            self._why, self._kind = f"downloading: {hubclient.describe(e)}", hubclient.error_kind(e)
        return self._cached is not None

    # -- endings

    def _failed(self, e: BaseException, doing: str) -> int:
        kind = hubclient.error_kind(e)
        why = f"{doing}: {hubclient.describe(e)}"
        if kind in hubclient.TRANSIENT:
            cached = layout.cached_snapshot(self.cache, self.repo, self.revision, self.allow)
            if cached is not None:
                return self._from_cache(cached, why, kind)
        return self._error(kind, why)

    def _from_cache(self, cached: tuple[Path, str], why: str, kind: str = hubclient.UNAVAILABLE) -> int:
        snap, commit = cached
        note = (f"the Hub is {'unreachable' if kind == hubclient.OFFLINE else 'unavailable'} ({why}); "
                f"serving the complete cached copy at commit {commit[:12]}")
        self.emit("done", snapshot=str(snap), commit=commit, total=None, from_cache=True, note=note)
        return EXIT_OK

    def _error(self, kind: str, message: str) -> int:
        self.emit("error", kind=kind, message=message)
        return EXIT_ERROR
