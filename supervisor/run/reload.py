"""Published configs through one run of the supervisor: what the loop asks of the reload book.

    boot            boot_live(): the image's config, or the last published one that served
                    when it replaced this very config
    a candidate     check(): validated while the server keeps serving (supervisor/reload/candidate.py);
                    the time it was taken is kept, so its decision says how long it took
    a decision      record(): the book's history and seen marker, /status's `reload` section, the log
    it serves       mark_good(): what a later failure rolls back to, and what a restart boots

The machine (supervisor/lifecycle/machine.py) decides; this only reads and writes the book. It is
given the record and the secrets it writes with, never the loop.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from ..config import DeployConfig
from ..host.hardware import Hardware
from ..lifecycle.events import CandidateChecked, RecordReload
from ..lifecycle.state import Live, Origin
from .record import Record
from ..redact import Secrets
from ..reload.book import HISTORY_KEEP, ReloadBook, adopt_last_good, record_decision, status_record

log = logging.getLogger("kiln")


class ReloadTracker:
    def __init__(self, book: ReloadBook, rec: Record, secrets: Secrets):
        self.book = book
        self.rec = rec
        self.secrets = secrets
        self.base_hash = ""                        # the image's own config: what last-good replaced
        self._taken: dict[int, float] = {}         # id(candidate) -> when the loop took it

    def boot_live(self, cfg: DeployConfig, env: Mapping[str, str]) -> Live:
        """The image's config, or the last published one that served when it replaced this very config."""
        self.base_hash = cfg.hash
        self.rec.update(reload=status_record(self.book.history(HISTORY_KEEP)))
        found = adopt_last_good(self.book, cfg, env) if cfg.watch.enabled else None
        if found is None:
            return Live(cfg, origin=Origin("boot", cfg.source))
        good_cfg, text, origin = found
        self.rec.event("config", f"booting the last good published config {good_cfg.hash[:12]} ({origin.where})")
        return Live(good_cfg, text=text, origin=origin)

    def check(self, cand: Any, running: Live, *, env: Mapping[str, str], hw: Hardware | None) -> CandidateChecked:
        """The event the machine decides on: the candidate validated against the running config."""
        from ..reload.candidate import validate

        self._taken[id(cand)] = time.monotonic()
        check = validate(cand, running=running.cfg, env=env, hw=hw)
        if not check.ok:
            self.book.keep_rejected(cand)
            return CandidateChecked(cand, None, tuple(self.secrets.redact(p) for p in check.problems))
        assert check.cfg is not None
        return CandidateChecked(cand, Live(check.cfg, text=check.text,
                                           origin=Origin(cand.source, cand.origin, cand.revision)))

    def record(self, fx: RecordReload, *, live_hash: str) -> None:
        """One decision on a published config, in the book, on /status and in the log (masked)."""
        cand = fx.candidate
        taken = self._taken.pop(id(cand), time.monotonic())
        causes = [self.secrets.redact(c) for c in fx.causes]
        tail = [self.secrets.redact(line) for line in fx.tail]
        self.rec.update(reload=record_decision(self.book, cand, fx.outcome, fx.config_hash, causes,
                                               took_s=time.monotonic() - taken, live_hash=live_hash,
                                               stderr_tail=tail))
        self.rec.event(f"reload_{fx.outcome}", f"{cand.describe()}" + (f": {causes[0][:300]}" if causes else ""))
        level = logging.INFO if fx.outcome in ("applied", "unchanged") else logging.ERROR
        log.log(level, "reload %s: %s%s", fx.outcome, cand.describe(), "".join(f"\n  - {c}" for c in causes))

    def mark_good(self, live: Live) -> None:
        """The live config serves: it is what a later failure rolls back to, and what a restart boots."""
        if live.text is not None:
            o = live.origin
            self.book.save_good(live.text, {"hash": live.cfg.hash, "base_hash": self.base_hash, "source": o.channel,
                                            "origin": o.where, "revision": o.revision})
        else:
            self.book.forget_good()
