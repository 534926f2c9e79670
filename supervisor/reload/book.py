"""The reload book: what hot reload must not lose, kept in the volume (<state_dir>/reload/).

    last-good.toml + last-good.json   the last published config that reached SERVING, and where it
                                      came from (origin, Hub revision, the boot config it replaced)
    history.jsonl                     one line per candidate: applied, unchanged, rejected,
                                      rolled_back or failed, with the cause; trimmed to HISTORY_KEEP
    seen.json                         per watch source, the last revision / content hash decided,
                                      so a restart does not re-apply (or re-roll back) a known one
    last-rejected.toml                the bytes of the last rejected candidate, to read at leisure

Writes are atomic (temp file + rename). Only the lifecycle loop writes (through
supervisor/run/reload.py); /status reads the in-memory copy it keeps in its record. A container
restart boots from last-good when the image's own config is the one it replaced (a new image with
a new baked config starts from that instead).

A book that cannot be written (a full disk) never stops a decision: history lines and seen markers
that could not be written are kept in memory (shown on /status, and written first once there is
room), and /status warns of each file that is behind, with what it costs (process/statefile.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..config import DeployConfig, parse_config
from ..errors import ConfigError
from ..lifecycle.state import Origin
from ..process.statefile import Writes, write_atomic
from .boot_only import keep_boot_only
from ..lifecycle.reload import TAIL_KEPT

if TYPE_CHECKING:
    from .candidate import Candidate

log = logging.getLogger("kiln")

HISTORY_KEEP = 500
SHOWN = 10          # history entries /status carries


class ReloadBook:
    def __init__(self, root: Path, writes: Writes | None = None):
        self.root = root
        self.writes = writes or Writes()
        self._unwritten: list[dict[str, Any]] = []              # history lines the disk had no room for
        self._unwritten_seen: dict[str, dict[str, str]] = {}     # seen markers likewise

    def _what(self, name: str) -> str:
        return f"the reload book's {name} ({self.root / name})"

    # -- last good -----------------------------------------------------------------------
    def last_good(self) -> tuple[str, dict[str, Any]] | None:
        try:
            meta = json.loads((self.root / "last-good.json").read_text(encoding="utf-8"))
            text = (self.root / "last-good.toml").read_text(encoding="utf-8")
        except (OSError, ValueError):
            return None
        return (text, meta) if isinstance(meta, dict) else None

    def save_good(self, text: str, meta: dict[str, Any]) -> None:
        def write() -> None:
            # The text first: a crash between the two leaves the old meta, whose hash no longer matches.
            write_atomic(self.root / "last-good.toml", text.encode("utf-8"))
            write_atomic(self.root / "last-good.json", json.dumps({**meta, "at": time.time()}, indent=1).encode())

        self.writes.attempt(self._what("last-good.toml"), "a restart boots the config that served before this one",
                            write)

    def forget_good(self) -> None:
        for name in ("last-good.json", "last-good.toml"):
            (self.root / name).unlink(missing_ok=True)

    # -- history -------------------------------------------------------------------------
    def append(self, entry: dict[str, Any]) -> None:
        self._unwritten = (self._unwritten + [entry])[-HISTORY_KEEP:]
        if self.writes.attempt(self._what("history.jsonl"), "reload decisions are kept in memory (on /status) and "
                               "written once there is room", lambda: self._append(self._unwritten)):
            self._unwritten = []

    def _append(self, entries: list[dict[str, Any]]) -> None:
        path = self.root / "history.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            # a line torn by a power cut ends without a newline: end it, or this entry joins it and is lost too
            torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
            data = memoryview((("\n" if torn else "") + "".join(json.dumps(e, sort_keys=True) + "\n"
                                                                for e in entries)).encode("utf-8"))
            try:
                while data:
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, size)      # no part of a line left behind: they are all written again later
                raise
        finally:
            os.close(fd)
        if os.stat(path).st_size > HISTORY_KEEP * 2 * 1024:      # now and then, not on every append
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[-HISTORY_KEEP:]
            with contextlib.suppress(OSError):     # untrimmed costs nothing now: the next append trims
                write_atomic(path, ("\n".join(lines) + "\n").encode("utf-8"))

    def history(self, n: int = SHOWN) -> list[dict[str, Any]]:
        try:
            # a damaged byte costs at most its own line (U+FFFD in a value, or a line that no longer
            # parses), never the whole history
            lines = (self.root / "history.jsonl").read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            lines = []
        out = []
        for line in lines:                  # at most HISTORY_KEEP lines: the trim in append()
            try:
                entry = json.loads(line)
            except ValueError:
                continue        # a torn last line after a power cut: skip it, keep the rest
            if isinstance(entry, dict):
                out.append(entry)
        return (out + self._unwritten)[-n:]

    # -- seen ------------------------------------------------------------------------------
    def seen(self) -> dict[str, dict[str, str]]:
        try:
            data = json.loads((self.root / "seen.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        return {**(data if isinstance(data, dict) else {}), **self._unwritten_seen}

    def mark_seen(self, source: str, origin: str, key: str) -> None:
        self._unwritten_seen[source] = {"origin": origin, "key": key}
        data = json.dumps(self.seen(), indent=1).encode()
        if self.writes.attempt(self._what("seen.json"), "a restart may decide the same published config again",
                               lambda: write_atomic(self.root / "seen.json", data)):
            self._unwritten_seen = {}

    def keep_rejected(self, cand: "Candidate") -> None:
        """The bytes of a rejected candidate, to read at leisure: only what the watcher itself read
        from the watch dir or the repo (never through a link out of it) and under the size cap."""
        from .candidate import MAX_BYTES          # only once a candidate exists (P1: not at boot)

        if cand.error or not cand.data or len(cand.data) > MAX_BYTES:
            return
        data = cand.data
        self.writes.attempt(self._what("last-rejected.toml"), "the rejected config's bytes are not kept (its "
                            "problems are in the history)", lambda: write_atomic(self.root / "last-rejected.toml",
                                                                                 data, 0o600))


def history_entry(cand: "Candidate", outcome: str, cfg_hash: str | None, causes: list[str], *, took_s: float,
                  live_hash: str, stderr_tail: list[str] | None = None) -> dict[str, Any]:
    """One line of history: what was published where, what became of it, and why."""
    now = time.time()
    entry = {"t": round(now, 3), "outcome": outcome, "source": cand.source, "origin": cand.origin,
             "revision": cand.revision, "content_sha256": cand.content_sha256, "config_hash": cfg_hash,
             "live_hash": live_hash, "cause": causes[0] if causes else None, "problems": causes[:40],
             "detected_at": round(cand.detected_at, 3) if cand.detected_at else None,
             "detect_to_decided_s": round(now - cand.detected_at, 3) if cand.detected_at else None,
             "took_s": round(took_s, 3)}
    if stderr_tail:
        entry["stderr_tail"] = stderr_tail[-TAIL_KEPT:]
    return entry


def record_decision(book: ReloadBook, cand: "Candidate", outcome: str, cfg_hash: str | None, causes: list[str], *,
                    took_s: float, live_hash: str, stderr_tail: list[str] | None = None) -> dict[str, Any]:
    """Write one decision to the book (history, and the source's seen marker); the new `reload` record."""
    book.append(history_entry(cand, outcome, cfg_hash, causes, took_s=took_s, live_hash=live_hash,
                              stderr_tail=stderr_tail))
    book.mark_seen(cand.source, cand.origin, cand.seen_key)
    return status_record(book.history(HISTORY_KEEP))


def status_record(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The `reload` section of /status, from the newest history entries."""
    def last(*outcomes: str) -> dict[str, Any] | None:
        return next((h for h in reversed(history) if h.get("outcome") in outcomes), None)

    counts: dict[str, int] = {}
    for h in history:
        counts[str(h.get("outcome"))] = counts.get(str(h.get("outcome")), 0) + 1
    return {"last": history[-1] if history else None, "last_rejection": last("rejected"),
            "last_rollback": last("rolled_back", "failed"), "counts": counts,
            "history": history[-SHOWN:]}


def adopt_last_good(book: ReloadBook, boot: DeployConfig,
                    env: Mapping[str, str]) -> tuple[DeployConfig, str, Origin] | None:
    """(config, text, origin) of the last published config that served, when the boot config is the one
    it replaced; else None (a new image's own config wins over what was published for the old one)."""
    found = book.last_good()
    if found is None:
        return None
    text, meta = found
    if meta.get("base_hash") != boot.hash:
        log.info("the image's config is not the one the last published config replaced: booting the image's")
        return None
    try:
        cfg = parse_config(text, source=f"last good ({meta.get('origin')})", env=env)
    except ConfigError as e:
        log.warning("the last good config no longer parses (%s): booting the image's", e)
        return None
    # What the supervisor reads only at boot is the image's, whatever a published config (saved by an
    # older Kiln, which took [runpod] from it) says.
    cfg = keep_boot_only(cfg, boot)
    origin = Origin(str(meta.get("source") or "boot"), str(meta.get("origin") or ""), meta.get("revision"))
    return cfg, text, origin
