"""The config watcher: it finds published configs and reports them; it never changes anything.

Two sources, each in its own daemon thread, both feeding one small queue the lifecycle loop reads
(`take()`), with a wake-up call so the loop acts at once:

* **The Hub** (`[watch] repo/branch/path`): one small request per `poll_s` (the branch's commit,
  `repo_info`); only when the commit moves is the file read, at that exact commit (its size first:
  nothing over the cap is downloaded). Errors (no network, 429, 5xx, a missing branch) double the
  interval up to `max_backoff_s`, and the first success after them resets it: an outage is
  survived, never fatal, and shows on /status (`watch.hub`).
* **A local directory** (`[watch] dir`, the file named by `path` inside it), watched with
  watchdog (inotify). Publish by writing a temp file in the directory and renaming it over (atomic:
  the file is complete the moment it appears); Kubernetes-style mounts swap a symlink, so every
  event in the directory counts. A file is read only once it is complete: `debounce_s` without
  events, and no writer still holding it open (a write seen without its close-after-write) — a
  file written in place in chunks is read after its writer closed it, not between the chunks. A
  stat check every FALLBACK_S seconds also catches changes inotify cannot see (a network volume
  written from another host); there, completeness means size and mtime stable across two checks.
  A file already there when watching begins is read once it stays the same for FALLBACK_S (its
  writer may have begun before the watch). The file must resolve inside the directory: a symlink
  out of it (`deploy.toml -> /etc/shadow`) or a symlink loop is reported as an error, and its
  target is never read.

* **A canary branch** (`kiln-canary/<branch>`, supervisor/fleet/record.py), for a pod that reports to
  the fleet (`pod` given): polled in the same round; a new commit there is taken only when its
  `kiln-canary.json` names this pod, is open and unexpired, and is for the same `path`. Such a
  candidate's source is `hub-canary`. No canary branch is the normal case, not an error.

A candidate is reported once per new commit or content; which ones were already decided comes
from the reload book (supervisor/reload/book.py), so a restart does not report them again. Newer
candidates from the same source replace an older one not yet taken: only the latest matters.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ..fleet import record as fleet
from .. import hubclient
from .candidate import MAX_BYTES, Candidate
from ..config import WatchSpec
from ..redact import redact

log = logging.getLogger("kiln.watch")
FALLBACK_S = 2.0
OPEN_WRITER_GIVE_UP_S = 30.0    # a writer that keeps the file open this long without writing: read it anyway


def _read_capped(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(MAX_BYTES + 1)


def _stat(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of what the name points at now; a dangling or looping link counts as present."""
    try:
        st = os.stat(path)
        return (st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        try:
            st = os.lstat(path)
            return (st.st_ino, -1, st.st_mtime_ns)
        except OSError:
            return None


def _resolves_inside(target: Path) -> tuple[bool, str]:
    """Whether the watched file resolves to a regular file inside its directory, and why not."""
    root = os.path.realpath(target.parent)
    try:
        real = os.path.realpath(target, strict=True)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return False, f"{target.name} is a symlink loop: nothing read"
        return False, f"{target.name} is a dangling symlink ({e.strerror}): nothing read"
    if os.path.commonpath([root, real]) != root:
        return False, (f"{target.name} is a symlink to {real}, outside the watch dir {root}: refused, its "
                       "target is never read (publish the file itself, or a link inside the dir)")
    if not os.path.isfile(real):
        return False, f"{target.name} resolves to {real}, which is not a regular file: nothing read"
    return True, ""


class Watcher:
    def __init__(self, spec: WatchSpec, *, cache: Path, token: str | None, seen: dict[str, dict[str, str]],
                 wake: Callable[[], None] = lambda: None, secrets: Callable[[], Sequence[str]] = lambda: (),
                 pod: str | None = None):
        self.spec = spec
        self.cache = cache
        self.token = token
        self.wake = wake
        self.secrets = secrets
        self.pod = pod                      # this pod's fleet id: it may be a canary
        self.hub_origin = f"hf://{spec.repo}@{spec.branch}:{spec.path}" if spec.repo else None
        self.canary_branch = fleet.canary_branch(spec.branch) if spec.repo and pod else None
        self.canary_origin = f"hf://{spec.repo}@{self.canary_branch}:{spec.path}" if self.canary_branch else None
        self.local_path = Path(spec.dir) / spec.path if spec.dir else None
        # Only a key recorded for the same origin counts: a changed [watch] starts afresh.
        self._seen = {src: v.get("key") for src, v in seen.items()
                      if v.get("origin") in (self.hub_origin, self.canary_origin, str(self.local_path))}
        self._canary_looked: str | None = None      # the canary commit whose assignment was read
        self._lock = threading.Lock()
        self._pending: dict[str, Candidate] = {}
        self._stop = threading.Event()
        self._dirty = threading.Event()
        self._last_event = 0.0            # monotonic time of the last directory event
        self._open_writer_since: float | None = None   # a write to the file seen, its close not yet
        self._threads: list[threading.Thread] = []
        self._observer: Any = None
        self._status: dict[str, Any] = {}
        if spec.repo:
            self._status["hub"] = {"repo": spec.repo, "branch": spec.branch, "path": spec.path, "poll_s": spec.poll_s,
                                   "polls": 0, "errors": 0, "consecutive_errors": 0, "revision": None,
                                   "last_ok_at": None, "last_error": None, "unreachable_since": None,
                                   "interval_s": spec.poll_s}
            if self.canary_branch:
                self._status["hub"]["canary"] = {"branch": self.canary_branch, "revision": None, "taken": None,
                                                 "note": None}
        if self.local_path:
            self._status["local"] = {"file": str(self.local_path), "events": 0, "checks": 0, "present": None,
                                     "content_sha256": None, "last_error": None}

    # -- the lifecycle's side ------------------------------------------------------------
    def start(self) -> None:
        if self.spec.repo:
            self._spawn(self._hub_loop, "kiln-watch-hub")
        if self.local_path:
            # The observer is watching before start() returns (the lifecycle starts the watcher
            # before the status page): whatever a publisher writes after /status first answers
            # makes an event. Only the loop runs in its own thread.
            try:
                first = self._observe_local()
            except Exception as e:  # noqa: BLE001 - no inotify (limits, an odd mount): shown, never fatal
                log.exception("kiln-watch-local not started")
                self._set("local", last_error=f"not watching: {type(e).__name__}: {self._redact(str(e))}")
                return
            self._spawn(lambda: self._local_loop(first), "kiln-watch-local")

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        if self._observer is not None:
            try:
                self._observer.stop()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass

    def take(self) -> Candidate | None:
        """The oldest pending candidate (one per source at most), or None."""
        with self._lock:
            if not self._pending:
                return None
            source = min(self._pending, key=lambda s: self._pending[s].detected_at)
            return self._pending.pop(source)

    def status(self) -> dict[str, Any]:
        with self._lock:
            out = {k: dict(v) for k, v in self._status.items()}
        if "hub" in out and out["hub"].get("unreachable_since"):
            out["hub"]["unreachable_for_s"] = round(time.time() - out["hub"]["unreachable_since"], 1)
        return out

    # -- plumbing ------------------------------------------------------------------------
    def _spawn(self, target: Callable[[], None], name: str) -> None:
        def guarded() -> None:
            try:
                target()
            except Exception:  # noqa: BLE001 - a watcher bug must show, and must not take PID 1 down
                log.exception("%s stopped", name)
        t = threading.Thread(target=guarded, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _set(self, source: str, **kv: Any) -> None:
        with self._lock:
            self._status[source].update(kv)

    def _redact(self, text: str) -> str:
        return redact(text, self.secrets())

    def _report(self, c: Candidate) -> None:
        with self._lock:
            if c.source in self._pending:
                log.info("watch: %s superseded by %s before it was looked at",
                         self._pending[c.source].describe(), c.describe())
            self._pending[c.source] = c
        self._seen[c.source] = c.seen_key
        log.info("watch: new config %s (%d bytes)", c.describe(), len(c.data))
        self.wake()

    # -- the Hub -------------------------------------------------------------------------
    def _hub_loop(self) -> None:
        from huggingface_hub import HfApi

        spec = self.spec
        assert spec.repo
        api = HfApi(token=self.token or False)
        interval = spec.poll_s
        timeout = min(30.0, max(5.0, spec.poll_s))
        while not self._stop.is_set():
            try:
                sha = api.repo_info(spec.repo, revision=spec.branch, timeout=timeout).sha
                detected = time.time()
                self._hub_up(sha)
                if sha and sha != self._seen.get("hub"):
                    self._report(self._read_hub(api, sha, detected))
                if self.canary_branch:
                    self._poll_canary(api, timeout)
                interval = spec.poll_s
            except Exception as e:  # noqa: BLE001 - every failure is an outage to ride out
                interval = min(max(interval * 2, spec.poll_s), spec.max_backoff_s)
                self._hub_down(e, interval)
            self._stop.wait(interval)

    def _hub_up(self, sha: str | None) -> None:
        with self._lock:
            st = self._status["hub"]
            st["polls"] += 1
            st["revision"] = sha
            down = hubclient.outage_over(st, self.spec.poll_s)
        if down is not None:
            log.info("watch: the Hub answers again after %.1f s", down)

    def _hub_down(self, e: BaseException, interval: float) -> None:
        kind = hubclient.error_kind(e)
        why = self._redact(hubclient.describe(e))
        with self._lock:
            st = self._status["hub"]
            st["polls"] += 1
            first = hubclient.outage_counted(st, kind, why, interval)
        if first:
            log.warning("watch: cannot poll %s (%s: %s); the server keeps serving, retrying with backoff up to %g s",
                        self.hub_origin, kind, why, self.spec.max_backoff_s)

    def _read_hub(self, api: Any, sha: str, detected: float, *, source: str = "hub",
                  origin: str | None = None) -> Candidate:
        """The file at exactly that commit (size checked before any byte of it is downloaded)."""
        spec = self.spec
        assert spec.repo and self.hub_origin
        base = dict(source=source, origin=origin or self.hub_origin, revision=sha, detected_at=detected)
        data, why = self._hub_file(api, spec.path, sha)
        if data is None:
            return Candidate(**base, error=f"(file): {why}")
        return Candidate(**base, data=data)

    def _hub_file(self, api: Any, path: str, sha: str) -> tuple[bytes | None, str]:
        """A small file of the repo at commit `sha`, or why not (missing, over the size cap)."""
        from huggingface_hub import hf_hub_download
        from huggingface_hub.hf_api import RepoFile

        spec = self.spec
        assert spec.repo
        infos = [i for i in api.get_paths_info(spec.repo, [path], revision=sha) if isinstance(i, RepoFile)]
        if not infos:
            return None, f"{path} is not in {spec.repo} at {sha[:12]}"
        if (infos[0].size or 0) > MAX_BYTES:
            return None, f"is {infos[0].size} bytes; a deploy config is at most {MAX_BYTES} bytes (not downloaded)"
        local = hf_hub_download(spec.repo, path, revision=sha, cache_dir=str(self.cache), token=self.token or False)
        return _read_capped(Path(local)), ""

    def _poll_canary(self, api: Any, timeout: float) -> None:
        """A new commit on the canary branch: taken only when its assignment names this pod."""
        import json

        spec = self.spec
        assert spec.repo and self.canary_branch and self.pod
        try:
            sha = api.repo_info(spec.repo, revision=self.canary_branch, timeout=timeout).sha
        except Exception as e:  # noqa: BLE001 - sorted below
            if hubclient.error_kind(e) == hubclient.NOT_FOUND:
                return                              # no rollout was ever made: the normal case
            raise
        if not sha or sha in (self._canary_looked, self._seen.get(fleet.CANARY_SOURCE)):
            return
        detected = time.time()
        doc, why = self._hub_file(api, fleet.CANARY_FILE, sha)
        if doc is not None:
            try:
                why = fleet.assigned(json.loads(doc), pod=self.pod, path=spec.path, now=time.time()) or ""
            except ValueError:
                why = f"{fleet.CANARY_FILE} is not JSON"
        self._canary_looked = sha
        taken = not why
        self._set("hub", canary={"branch": self.canary_branch, "revision": sha, "taken": taken, "note": why or None})
        log.info("watch: canary commit %s on %s: %s", sha[:12], self.canary_branch,
                 "this pod is a canary: taking it" if taken else f"not taken ({why})")
        if taken:
            self._report(self._read_hub(api, sha, detected, source=fleet.CANARY_SOURCE, origin=self.canary_origin))

    # -- the local directory ---------------------------------------------------------------
    def _observe_local(self) -> tuple[int, int, int] | None:
        """Start the observer on the directory; the file's stat as watching began (None: absent)."""
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        target = self.local_path
        assert target is not None
        target.parent.mkdir(parents=True, exist_ok=True)
        watcher = self

        name = target.name

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                if event.event_type in ("opened", "closed_no_write"):
                    return      # reads (ours included) are not changes
                paths = {os.path.basename(str(event.src_path)), os.path.basename(str(getattr(event, "dest_path", "")))}
                if name in paths:
                    # Created or written: a writer has it open until its close-after-write (a file
                    # created with open("w") is half-written until then too); a rename into place
                    # or a delete ends it.
                    written = event.event_type == "modified" or (
                        event.event_type == "created" and not os.path.islink(str(event.src_path)))
                    if written and os.path.basename(str(event.src_path)) == name:
                        watcher._open_writer_since = watcher._open_writer_since or time.monotonic()
                    elif event.event_type in ("closed", "moved", "deleted"):
                        watcher._open_writer_since = None
                with watcher._lock:
                    watcher._status["local"]["events"] += 1
                watcher._last_event = time.monotonic()
                watcher._dirty.set()

        self._observer = Observer()
        self._observer.schedule(Handler(), str(target.parent), recursive=False)
        self._observer.daemon = True
        self._observer.start()
        first = _stat(target)
        if first is None:
            self._check_local(target, present=False)
        else:
            self._set("local", waiting=f"the file was there when watching began: read once it stays "
                                       f"unchanged for {FALLBACK_S:g} s (its writer may not be done)")
        return first

    def _local_loop(self, first: tuple[int, int, int] | None) -> None:
        target = self.local_path
        assert target is not None
        last_stat: tuple[int, int, int] | None = None
        # A file already there: a writer may have begun it before the observer watched (no event
        # says so), so it is read like one seen by the stat check only, once it stayed the same
        # for FALLBACK_S without events (a pause between chunks is well under that).
        pending_stat = first
        while not self._stop.is_set():
            fired = self._dirty.wait(FALLBACK_S)
            if self._stop.is_set():
                return
            while fired:                         # quiet for debounce_s since the last event
                self._dirty.clear()
                left = self.spec.debounce_s - (time.monotonic() - self._last_event)
                if left <= 0:
                    break
                if self._stop.wait(left):
                    return
            writer = self._open_writer_since
            if writer is not None and time.monotonic() - writer < OPEN_WRITER_GIVE_UP_S:
                self._set("local", waiting="a writer still holds the file open (waiting for its close)")
                continue                          # its close-after-write event wakes us
            self._open_writer_since = None
            now_stat = _stat(target)
            if not fired and now_stat != last_stat and now_stat is not None:
                # Seen by the stat check only (no inotify event): complete once stable across two checks.
                if now_stat != pending_stat:
                    pending_stat = now_stat
                    continue
            pending_stat = None
            if fired or now_stat != last_stat:
                last_stat = now_stat
                self._set("local", waiting=None)
                self._check_local(target, present=now_stat is not None)

    def _check_local(self, target: Path, present: bool) -> None:
        detected = time.time()
        with self._lock:
            self._status["local"]["checks"] += 1
            self._status["local"]["present"] = present
        if not present:
            return
        inside, why = _resolves_inside(target)
        if not inside:
            self._set("local", last_error=why)
            c = Candidate(source="local", origin=str(target), detected_at=detected, error=f"(file): {why}")
            if self._seen.get("local") != why:
                self._report(c)
                self._seen["local"] = why        # reported once per cause, not on every look
            return
        try:
            data = _read_capped(target)
        except OSError as e:
            self._set("local", last_error=f"{type(e).__name__}: {e.strerror}")
            return
        digest = hashlib.sha256(data).hexdigest()
        self._set("local", content_sha256=digest, last_error=None)
        if digest == self._seen.get("local"):
            return
        c = Candidate(source="local", origin=str(target), data=data, detected_at=detected)
        if len(data) > MAX_BYTES:
            c = Candidate(source="local", origin=str(target), data=data, detected_at=detected,
                          error=f"(file): is over {MAX_BYTES} bytes; a deploy config is at most {MAX_BYTES} bytes")
        self._report(c)
