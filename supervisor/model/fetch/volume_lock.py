"""One download of a model per volume: a worker that finds another downloading it waits, then reuses it.

RunPod Serverless workers of one endpoint cold-start together on one network volume
(supervisor/runpod_env.py), and each would download the same model into the same Hub
cache at once: huggingface_hub's per-blob locks (layout.lock_path) keep two downloaders off one
blob, but the one that waits there moves no byte, shows nothing and is ended by the stall deadline.
So `fetch()` (parent.py) takes this lock, an flock on a file beside the cache, one per repo, for
the whole fetch. A worker that finds it taken waits, saying on /status whom it waits for and
since when, and fetches once it has the lock: the blobs are complete by then, so it costs a
listing and no bytes. A holder that dies lets go (the kernel drops an flock with its process); one
whose download stalls is ended by its own stall deadline. One that cannot end itself — a frozen
container (SIGSTOP), a hung host — keeps its flock, so a waiter judges it by what it moves on the
volume (stall.py HolderWatch: its partials and journals, and the progress it notes here) and takes
over, downloading beside it, once it moved nothing for the waiter's `model.fetch_stall_s` of time
the waiter could run. A holder thawed later goes on: both write the same bytes at the same offsets,
and whichever verifies a file second finds the blob already there (download.py).

A takeover is exclusive: waiters that judge the holder stalled at once (they started waiting
together, so their windows end together) each try the flock of the next generation's lock
(`successor`: generation 1 for the first holder, 2 for a stalled taker, ...); one wins and downloads,
the others wait on it as on any holder (its note, its bytes on the volume), take its place when it
lets go (its files complete by then: a listing, no bytes), or take over from it in turn should it
stall too. Before, every one of them downloaded beside the holder: three waiters fetched the model
three times over (issue 50 item 8).

    <state_dir>/hf/.locks/kiln-fetch/models--<owner>--<name>.lock     holder: worker, host, pid, since,
                                                                      moved (bytes, while it progresses)
    <state_dir>/hf/.locks/kiln-fetch/models--<owner>--<name>.take-over-<n>.lock
                                                                      the n-th taker's, the same note

Across hosts: Linux gives flock on NFS whole-file fcntl semantics (since 2.6.12), which the server
arbitrates; which filesystem RunPod's network volumes are, and whether they honour such locks, is
undocumented (unresolved). Where a lock is not honoured, workers download side by side, as
without this lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from .layout import storage

__all__ = ["VolumeLock", "lock_file"]
_BODY = 512              # the holder's note, padded: rewritten in place, never truncated under a reader


def lock_file(cache: Path, repo: str) -> Path:
    return cache / ".locks" / "kiln-fetch" / f"{storage(cache, repo).name}.lock"


class VolumeLock:
    """An exclusive flock on `path`, taken without blocking; the holder's name written inside."""

    def __init__(self, path: Path, holder: str, generation: int = 0):
        self.path = path
        self.holder = holder
        self.generation = generation    # 0: the lock itself; n: the n-th takeover's (`successor`)
        self._fd: int | None = None
        self._note: dict[str, Any] = {}

    def successor(self) -> "VolumeLock":
        """The lock a waiter takes to take over from this one's stalled holder: one waiter wins it."""
        base = self.path.name.removesuffix(".lock").split(".take-over-")[0]
        n = self.generation + 1
        return VolumeLock(self.path.with_name(f"{base}.take-over-{n}.lock"), self.holder, n)

    def try_acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._note = {"worker": self.holder, "host": socket.gethostname(), "pid": os.getpid(),
                      "since": round(time.time(), 3)}
        os.ftruncate(fd, 0)
        self._write_note()
        return True

    @property
    def held(self) -> bool:
        return self._fd is not None

    def progressed(self, moved: int) -> None:
        """The holder moved `moved` bytes so far: said in the lock file, where waiters judge it."""
        if self._fd is not None:
            self._note["moved"] = moved
            self._write_note()

    def _write_note(self) -> None:
        assert self._fd is not None
        try:
            os.pwrite(self._fd, json.dumps(self._note).encode().ljust(_BODY), 0)
        except OSError:
            pass              # a full disk or a volume gone read-only: waiters judge the blobs alone

    def held_by(self) -> dict[str, Any] | None:
        """Who holds it, as the holder wrote it (None when unreadable: it may be writing just now)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)              # the flock goes with the descriptor; the file stays for the next one

    def __enter__(self) -> "VolumeLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
