"""The saved slots on disk: one `<key>-<tag>-<slot>.bin` (llama-server's own file) and its manifest
`<key>-<tag>-<slot>.json` per kept slot, `tag` the saving supervisor's (its pod or worker, so workers on
one shared volume never write one name). A slot is kept whole or not at all: the engine writes
`<key>.<tag>.<slot>.partial`, which becomes the .bin only once its size is what the engine said it wrote,
and the manifest is written after it; a file without a manifest is never offered. The directory stays
within `max_bytes` and `max_entries`, the oldest entries (any key) deleted first. Only files of these
forms are ever deleted: nothing else in the directory is Kiln's to touch."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .slots import SlotAPI, SlotError

log = logging.getLogger("kiln")
_ENTRY = re.compile(r"(?P<key>[0-9a-f]{24})-(?P<tag>[\w.-]{1,64})-(?P<slot>\d{1,4})\.(bin|json)")
_PARTIAL = re.compile(r"[0-9a-f]{24}\.[\w.-]{1,64}\.\d{1,4}\.partial")


@dataclass
class Report:
    """One save or restore, for /status and /metrics."""
    action: str                          # saved | restored
    slots: int = 0
    tokens: int = 0
    bytes: int = 0
    seconds: float = 0.0
    skipped: list[dict[str, str]] = field(default_factory=list)     # {"file" or "slot", "why"}

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "slots": self.slots, "tokens": self.tokens, "bytes": self.bytes,
                "seconds": round(self.seconds, 3), "skipped": self.skipped[:20],
                "skipped_total": len(self.skipped), "at": round(time.time(), 3)}


@dataclass(frozen=True)
class Entry:
    key: str
    tag: str
    slot: int
    tokens: int
    bytes: int
    saved_at: float
    bin: Path


class Store:
    def __init__(self, root: Path, *, tag: str, max_bytes: int, max_entries: int, min_tokens: int):
        self.root = root
        self.tag = re.sub(r"[^\w.-]", "_", tag)[:64] or "kiln"
        self.max_bytes, self.max_entries, self.min_tokens = max_bytes, max_entries, min_tokens

    # -- what is there --------------------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        out = []
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        for name in names:
            m = _ENTRY.fullmatch(name)
            if not m or not name.endswith(".json"):
                continue
            try:
                meta = json.loads((self.root / name).read_text(encoding="utf-8"))
                b = self.root / name.replace(".json", ".bin")
                if b.stat().st_size != int(meta["bytes"]):
                    continue                       # cut, or replaced since: not whole
                out.append(Entry(m["key"], m["tag"], int(m["slot"]), int(meta["tokens"]), int(meta["bytes"]),
                                 float(meta["saved_at"]), b))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return sorted(out, key=lambda e: e.saved_at, reverse=True)

    def candidates(self, key: str, report: Report) -> list[Entry]:
        """This key's entries, newest first; every other whole entry counted as skipped (another model,
        engine build or computation)."""
        mine = []
        for e in self.entries():
            if e.key == key:
                mine.append(e)
            else:
                report.skipped.append({"file": e.bin.name, "why": "saved by an engine of another model, build or "
                                       "computation (its key differs): never loaded"})
        return mine

    # -- save -------------------------------------------------------------------------------------------
    def save(self, api: SlotAPI, key: str, deadline: float) -> Report:
        report = Report("saved")
        start = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        self._sweep_partials()
        try:
            slots = api.slots()
        except SlotError as e:
            report.skipped.append({"slot": "*", "why": str(e)})
            return report
        for s in slots:
            if time.monotonic() > deadline:
                report.skipped.append({"slot": str(s["id"]), "why": "the save's time ran out"})
                continue
            if s.get("is_processing"):
                report.skipped.append({"slot": str(s["id"]), "why": "busy with a request"})
                continue
            self._save_one(api, key, int(s["id"]), report)
        self._bound()
        report.seconds = time.monotonic() - start
        return report

    def _save_one(self, api: SlotAPI, key: str, slot: int, report: Report) -> None:
        partial = f"{key}.{self.tag}.{slot}.partial"
        path = self.root / partial
        try:
            tokens, written = api.save(slot, partial)
        except SlotError as e:
            report.skipped.append({"slot": str(slot), "why": str(e)})
            path.unlink(missing_ok=True)
            return
        try:
            if tokens < self.min_tokens:
                if tokens:
                    report.skipped.append({"slot": str(slot), "why": f"{tokens} tokens, under min_tokens "
                                           f"{self.min_tokens}"})
                return
            if written > self.max_bytes:
                report.skipped.append({"slot": str(slot), "why": f"{written} bytes, over max_bytes {self.max_bytes}"})
                return
            if path.stat().st_size != written:
                report.skipped.append({"slot": str(slot), "why": "the file is not what the engine said it wrote"})
                return
            name = f"{key}-{self.tag}-{slot}"
            os.replace(path, self.root / f"{name}.bin")
            meta = {"key": key, "tokens": tokens, "bytes": written, "saved_at": time.time(), "slot": slot}
            tmp = self.root / f".{name}.json.tmp"
            tmp.write_text(json.dumps(meta), encoding="utf-8")
            os.replace(tmp, self.root / f"{name}.json")
            report.slots += 1
            report.tokens += tokens
            report.bytes += written
        except OSError as e:
            report.skipped.append({"slot": str(slot), "why": f"cannot keep it: {e.strerror or e}"})
        finally:
            path.unlink(missing_ok=True)

    def _sweep_partials(self) -> None:
        for name in os.listdir(self.root):
            if _PARTIAL.fullmatch(name):
                (self.root / name).unlink(missing_ok=True)

    def _bound(self) -> None:
        """Newest first: keep entries while within max_entries and max_bytes; delete the rest."""
        total, kept = 0, 0
        for e in self.entries():
            if kept < self.max_entries and total + e.bytes <= self.max_bytes:
                total += e.bytes
                kept += 1
                continue
            for p in (e.bin, e.bin.with_suffix(".json")):
                p.unlink(missing_ok=True)

    # -- restore ------------------------------------------------------------------------------------------
    def restore(self, api: SlotAPI, key: str, deadline: float) -> Report:
        report = Report("restored")
        start = time.monotonic()
        entries = self.candidates(key, report)
        if not entries:
            report.seconds = time.monotonic() - start
            return report
        try:
            free = [int(s["id"]) for s in api.slots() if not s.get("is_processing")]
        except SlotError as e:
            report.skipped.append({"file": "*", "why": str(e)})
            return report
        for entry, slot in zip(entries, free):
            if time.monotonic() > deadline:
                report.skipped.append({"file": entry.bin.name, "why": "the restore's time ran out"})
                continue
            try:
                got = api.restore(slot, entry.bin.name)
            except SlotError as e:
                report.skipped.append({"file": entry.bin.name, "why": str(e)})
                continue
            if got != entry.tokens:
                report.skipped.append({"file": entry.bin.name, "why": f"restored {got} tokens of {entry.tokens}"})
                continue
            report.slots += 1
            report.tokens += got
            report.bytes += entry.bytes
        for entry in entries[len(free):]:
            report.skipped.append({"file": entry.bin.name, "why": "more saved slots than this engine has slots"})
        report.seconds = time.monotonic() - start
        return report
