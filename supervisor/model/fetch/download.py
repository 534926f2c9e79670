"""The download itself: segments of every file over a bounded number of connections.

    files ──▶ FileDownload (per file: lock, partial, journal, verifier, source)
                 │ the segments its journal does not have
                 ▼
    Scheduler: one queue, `connections` worker threads; each takes the first ready segment
               (file order, then offset: the verifier's frontier advances and finished files
               are verified early), fetches it into the partial (HTTP range or Xet stream),
               flushes it, records it in the journal, hands it to the verifier
                 │ a transient failure (no network, 429, 5xx, a cut stream): the segment goes
                 │ back with its bytes so far and a backoff, and resumes where it stopped
                 ▼
    Verifier (hashing.py): in order, as segments land → the digest matches → the partial
               becomes the blob (atomic rename) and is linked into the snapshot

Shards download concurrently (connections spill from one file to the next) and a large file as
concurrent ranges. A fatal failure (auth, not found, a server that ignores Range, a full disk, a
file whose bytes do not match its digest twice) stops the whole fetch with a message naming the
file; finished segments stay in their journals for the next attempt.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ... import hubclient
from ...errors import FetchError
from . import layout
from .hashing import Meter, Verifier
from .journal import SegmentJournal
from .plan import Planned, segments
from .sink import RangeIgnored, Sink

MAX_BACKOFF_S = 10.0


@dataclass
class SegmentTask:
    """One segment of one file, waiting for a worker (or retried after a transient failure)."""
    file: "FileDownload"
    index: int
    sink: Sink | None = None        # kept across a transient failure, so the segment resumes mid-way
    attempts: int = 0
    not_before: float = 0.0


@dataclass
class Meters:
    received: Meter = field(default_factory=Meter)   # bytes that arrived this run
    hashed: Meter = field(default_factory=Meter)     # bytes verified this run (read back and hashed)


class FileDownload:
    """One file of the plan, from its partial (or nothing) to a verified blob linked into the snapshot."""

    def __init__(self, cache: Path, repo: str, item: Planned, snapshot: Path, seg: int, source: Any, meters: Meters):
        self.cache, self.repo, self.item, self.snapshot, self.source = cache, repo, item, snapshot, source
        self.meters = meters
        self.paths = [item.path]        # every path in the repo with this content: one download, all linked
        self.blob, self.part = layout.blob_paths(cache, repo, item.blob)
        self.journal_path = self.part.with_name(self.part.name + ".journal")
        self.seg = seg
        self.complete = False
        self.retried = False            # a digest mismatch gets one fresh download, not more
        self.scheduler: Scheduler | None = None
        self.journal: SegmentJournal | None = None
        self.verifier: Verifier | None = None
        self.fd: int | None = None
        self._lock_file: Any = None
        self.take_over = False          # parent.py took over from a stalled holder: its file locks are not waited for

    def have(self) -> int:
        """Bytes of this file already on disk and known good or recorded: all (a blob) or the journal's."""
        if self._blob_complete():
            return self.item.size
        j = SegmentJournal.load(self.journal_path, self.item.blob, self.item.size, self.part)
        return j.done_bytes() if j is not None else 0

    def start(self, scheduler: "Scheduler") -> list[SegmentTask]:
        """Take huggingface_hub's lock for the blob, open the partial; the segments still to fetch."""
        self.scheduler = scheduler
        if self._blob_complete():
            self._finish_link()
            return []
        lock = layout.lock_path(self.cache, self.repo, self.item.blob)
        lock.parent.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(lock, "a")
        try:                            # another downloader of this cache waits ...
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | (fcntl.LOCK_NB if self.take_over else 0))
        except BlockingIOError:
            pass                        # ... unless its holder stalled: write beside it, the same bytes in place
        if self._blob_complete():                        # ... and it may have finished the blob meanwhile
            self._finish_link()
            return []
        return self._open()

    def _open(self) -> list[SegmentTask]:
        self.blob.parent.mkdir(parents=True, exist_ok=True)
        journal = SegmentJournal.open(self.journal_path, self.item.blob, self.item.size, self.seg, self.part)
        self.fd = os.open(self.part, os.O_RDWR | os.O_CREAT, 0o644)
        if not journal.done and os.fstat(self.fd).st_size != self.item.size:
            # Nothing trusted in it: start over, full length and sparse (segments land in place).
            os.ftruncate(self.fd, 0)
            os.ftruncate(self.fd, self.item.size)
        self.journal, self.seg = journal, journal.seg
        # The missing segments before the verifier starts: it may send a recorded one back at once.
        missing = [SegmentTask(self, i) for i in range(len(segments(self.item.size, self.seg))) if i not in journal.done]
        self.verifier = Verifier(self.fd, journal, self.meters.hashed, self._corrupt, self._verified, self._broken)
        self.verifier.start()
        return missing

    def _blob_complete(self) -> bool:
        try:
            return self.blob.is_file() and self.blob.stat().st_size == self.item.size
        except OSError:
            return False

    def bounds(self, index: int) -> tuple[int, int]:
        return index * self.seg, min((index + 1) * self.seg, self.item.size)

    def done_bytes(self) -> int:
        if self.complete:
            return self.item.size
        return self.journal.done_bytes() if self.journal is not None else 0

    # -- called by the scheduler's workers and the verifier

    def landed(self, task: SegmentTask) -> None:
        """A segment's bytes are all in the partial: flush them, then record it, then hash it."""
        assert self.fd is not None and self.journal is not None and self.verifier is not None and task.sink
        os.fdatasync(self.fd)           # the journal must never claim bytes a crash could lose
        self.journal.finished(task.index, task.sink.crc)
        self.verifier.landed(task.index)

    def _corrupt(self, index: int) -> None:
        assert self.scheduler is not None
        self.scheduler.add([SegmentTask(self, index)], front=True)

    def _verified(self, ok: bool, actual: str) -> None:
        assert self.scheduler is not None and self.journal is not None and self.fd is not None
        item = self.item
        if ok:
            os.fchmod(self.fd, 0o644)
            os.close(self.fd)
            self.fd = None
            try:
                os.replace(self.part, self.blob)
            except FileNotFoundError:
                # Another downloader of this partial (one that took over from us while we were stopped,
                # or the stalled holder we took over from, thawed) verified it and moved it first.
                if not self._blob_complete():
                    raise
            self.journal.remove()
            self._finish_link()
            return
        # Every segment read back as it arrived, so what arrived was wrong; the Hub's one digest per
        # file cannot say where. Discard the file (only this one) and fetch it once more.
        self.journal.remove()
        os.close(self.fd)
        self.fd = None
        self.part.unlink(missing_ok=True)
        why = (f"{item.path}: the downloaded bytes do not match the Hub's {item.digest_name} {item.blob[:12]} "
               f"(got {actual[:12]})")
        if self.retried:
            self.scheduler.fail(FetchError(why + "; fetched twice, both wrong, so the file was discarded"), "verify")
            return
        self.retried = True
        self.scheduler.note(why + "; discarding the file and fetching it again", always=True)
        self.scheduler.add(self._open())

    def _broken(self, e: BaseException) -> None:
        assert self.scheduler is not None
        self.scheduler.fail(FetchError(f"{self.item.path}: verifying the partial failed: {hubclient.describe(e)}; "
                                       "what arrived is kept"), "disk")

    def _finish_link(self) -> None:
        self.complete = True
        for rel in self.paths:
            layout.link(self.blob, self.snapshot, rel)
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None
        if self.scheduler is not None:
            self.scheduler.file_done(self)

    def stop(self) -> None:
        if self.verifier is not None:
            self.verifier.stop()


class Scheduler:
    """`connections` workers over one queue of segments; runs until every file is verified or one fails."""

    def __init__(self, connections: int, on_transient: Callable[[BaseException], bool],
                 note: Callable[..., None]):
        self.connections = connections
        self.on_transient = on_transient     # True: stop (a complete cached copy will serve instead)
        self.note = note
        self.active = 0
        self._tasks: list[SegmentTask] = []
        self._open: set[int] = set()
        self._cond = threading.Condition()
        self.error: BaseException | None = None
        self.error_kind = "other"
        self.stopped_for_cache = False

    def run(self, files: list[FileDownload]) -> None:
        with self._cond:
            self._open = {id(f) for f in files}
        for f in files:
            self.add(f.start(self))
        workers = [threading.Thread(target=self._work, name=f"fetch-{n}", daemon=True)
                   for n in range(self.connections)]
        for w in workers:
            w.start()
        with self._cond:
            while self._open and self.error is None and not self.stopped_for_cache:
                self._cond.wait(0.5)
            self._tasks.clear()
            self._cond.notify_all()
        if self.error is not None or self.stopped_for_cache:
            for f in files:
                f.stop()

    def add(self, tasks: list[SegmentTask], front: bool = False) -> None:
        with self._cond:
            self._tasks = tasks + self._tasks if front else self._tasks + tasks
            self._cond.notify_all()

    def file_done(self, f: FileDownload) -> None:
        with self._cond:
            self._open.discard(id(f))
            self._cond.notify_all()

    def fail(self, error: BaseException, kind: str) -> None:
        with self._cond:
            if self.error is None:
                self.error, self.error_kind = error, kind
            self._cond.notify_all()

    def _next(self) -> SegmentTask | None:
        with self._cond:
            while True:
                if self.error is not None or self.stopped_for_cache or not self._open:
                    return None
                now = time.monotonic()
                for n, task in enumerate(self._tasks):
                    if task.not_before <= now:
                        self.active += 1
                        return self._tasks.pop(n)
                wait = min((t.not_before for t in self._tasks), default=now + 0.5) - now
                self._cond.wait(max(0.01, min(wait, 0.5)))

    def _work(self) -> None:
        while (task := self._next()) is not None:
            try:
                self._fetch(task)
            except BaseException as e:  # noqa: BLE001 - every failure is classified right here
                self._failed(task, e)
            finally:
                with self._cond:
                    self.active -= 1

    def _fetch(self, task: SegmentTask) -> None:
        f = task.file
        if task.sink is None:
            assert f.fd is not None
            start, end = f.bounds(task.index)
            task.sink = Sink(f.fd, start, end, f.meters.received)
        try:
            f.source.fetch(task.sink)
        except OSError as e:
            if e.errno is not None or task.sink.full:
                raise
            # http_get's "Consistency check failed": a body shorter than asked, without a network error.
            raise EOFError(f"{f.item.path}: {e}") from e
        if not task.sink.full:
            raise EOFError(f"{f.item.path}: the transfer ended {task.sink.end - task.sink.next} bytes short")
        f.landed(task)

    def _failed(self, task: SegmentTask, e: BaseException) -> None:
        name = task.file.item.path
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            self.fail(FetchError(f"{name}: the disk filled up under the download ({e.strerror}); "
                                 "what arrived is kept"), "disk")
        elif isinstance(e, RangeIgnored):
            self.fail(FetchError(f"{name}: {e}"), "other")
        elif _transient(e):
            if self.on_transient(e):
                with self._cond:
                    self.stopped_for_cache = True
                    self._cond.notify_all()
                return
            task.attempts += 1
            delay = min(MAX_BACKOFF_S, 0.5 * 2 ** task.attempts)
            task.not_before = time.monotonic() + delay
            self.note(f"{name}: {hubclient.describe(e)}; retrying in {delay:g} s")
            self.add([task], front=True)      # with its bytes so far: it resumes mid-segment
        else:
            self.fail(e, hubclient.error_kind(e))


def _transient(e: BaseException) -> bool:
    """Worth trying again: the network, the Hub's 429/5xx, a stream cut short, hf_xet's own failures
    other than a refused token or a missing file."""
    if hubclient.error_kind(e) in hubclient.TRANSIENT or isinstance(e, (EOFError, ConnectionError, TimeoutError)):
        return True
    if type(e).__module__.split(".")[0] == "hf_xet" or "xet" in type(e).__name__.lower():
        return not isinstance(e, (PermissionError, FileNotFoundError))
    return False
