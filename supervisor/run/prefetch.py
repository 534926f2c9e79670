"""The walk's model prefetch (the Prepare and CheckLaunch effects): the weights read into the page
cache from the moment the model is local, beside preflight and the engine's start (model/prefetch.py
reads; this decides which read runs and what /status `prefetch` shows).

    ensure(live)   read this config's model unless the same files are being read (or were, in this
                   walk); an early read (`[startup] prefetch_at = "start"`) is adopted when it planned
                   the same files, stopped when it did not
    spent()        the engine is healthy, or nothing will load it: a restart or reload reads anew

The read in force is `rt.prefetch`, where the launch asks whether one reads (boot_args). Nothing here
raises into the loop: a prefetch only makes a boot faster, and PID 1 must not end over it.
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import KilnError
from ..host import hardware
from ..lifecycle.state import Live
from .record import Record
from .runtime import Runtime


class WalkPrefetch:
    def __init__(self, rt: Runtime, rec: Record, *, process_start: float | None, early: Any = None):
        self.rt, self.rec = rt, rec
        self.process_start = process_start
        self.shown: Any = None        # the one /status shows: its end is the news, even after the walk
        if early is not None:         # begun before the loop was built: kept if preflight plans the same files
            self.rt.prefetch = self.shown = early
            self.rec.update(prefetch=self._shown(early))
            early.adopt(self._done)

    def ensure(self, live: Live) -> None:
        """Start reading the model's weights, unless the same files are being read already; what it
        did, or why not, is /status `prefetch`. Never raises."""
        try:
            self._start(live)
        except Exception as e:        # a file gone between listing and opening, no thread left
            self._drop()
            self.rec.update(prefetch={"state": "skipped", "note": f"could not start: {type(e).__name__}: {e}"})

    def spent(self) -> None:
        """The weights are loaded, or nothing will load them: the read stops and is forgotten."""
        if self.rt.prefetch is not None:
            self.rt.prefetch.stop()
            self.rt.prefetch = None

    def _start(self, live: Live) -> None:
        from ..model import prefetch, resolve

        path = live.model_path
        if path is None:
            try:
                path = resolve.resolve(live.cfg)       # None for hf://: the fetch finds it, CheckLaunch starts it
            except KilnError:                          # the fetch step names what is wrong with the source
                path = None
        if path is None:
            self._drop()                               # an early read of another model must not compete with the fetch
            return
        try:
            planned, why = prefetch.plan(live.cfg, live.cfg.engine, path, hardware.ram_available_bytes(), self.rt.env)
        except OSError as e:                           # a file vanished between the listing and its size
            planned, why = [], f"could not list the weights: {e.strerror or e}"
        files = [p for p, _ in planned]
        running = self.rt.prefetch
        if running is not None and running.files == files and running.useful:
            return                                     # the same files, being read or read whole in this walk
        self._drop()
        if why:
            self.rec.update(prefetch={"state": "skipped", "note": why})
            return
        p = prefetch.Prefetch(files, sizes=[n for _, n in planned], streams=live.cfg.startup.prefetch_streams,
                              on_done=self._done)
        self.rt.prefetch = self.shown = p
        self.rec.update(prefetch=self._shown(p))       # before start(): its end's update comes after
        p.start()

    def _drop(self) -> None:
        """Stop the read of files this boot does not plan (the early one of a config replaced since)."""
        if self.rt.prefetch is not None:
            self.rt.prefetch.stop()
            self.rt.prefetch = self.shown = None
            self.rec.update(prefetch=None)

    def _shown(self, p: Any) -> dict[str, Any]:
        """/status `prefetch`: what it read, and `start_s`, when it began after the process's exec
        (the boot timeline's zero): the earlier, the more of the read is done when the engine needs it."""
        d = p.to_dict()
        zero = self.process_start if self.process_start is not None else self.rec.boot_monotonic
        d["start_s"] = round((p.started if p.started is not None else time.monotonic()) - zero, 3)
        return d

    def _done(self, p: Any) -> None:
        if self.shown is not p:                        # replaced: its late end is not the news
            return
        d = self._shown(p)
        self.rec.update(prefetch=d)
        self.rec.event("prefetch", f"{p.state}: {p.read / 2**30:.2f} of {p.total / 2**30:.2f} GiB "
                                   f"in {d['seconds']} s ({p.streams} streams)")
