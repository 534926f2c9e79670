"""The record /status is built from: what the supervisor knows, guarded by one lock. One owner (the
loop) writes it; the status server only reads a snapshot under the lock. A transition is checked
against lifecycle/state.py ALLOWED (a forbidden one is a bug in the loop, never a user error).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from ..lifecycle.state import ALLOWED, IllegalTransition, State
from .timeline import Timelines


class Record:
    """What the supervisor knows, guarded by one lock; `snapshot()` is what /status shows."""

    def __init__(self, version: str, *, process_start: float | None = None):
        self.lock = threading.Lock()
        self.state = State.PREFLIGHT
        self.since = time.time()
        self.started = time.time()
        self.boot_monotonic = time.monotonic()
        # The boot's zero: the process's exec when known (where the boot timeline starts, its
        # supervisor_start phase), else when this record was made.
        self.start_monotonic = process_start if process_start is not None and process_start <= self.boot_monotonic \
            else self.boot_monotonic
        self.data: dict[str, Any] = {
            "version": version, "config": {}, "rung": None, "engine": None, "restarts": 0,
            "launches": 0, "failures": {}, "last_failure": None, "selftest": None,
            "hardware": None, "timings": {}, "warnings": [],
        }
        self._standing: dict[str, str] = {}     # key -> the warning now shown for a condition that may end
        self.history: collections.deque[dict[str, Any]] = collections.deque(maxlen=50)
        self.ready = False
        self.boot = Timelines(process_start=process_start)   # /status `boot`: timeline.py

    def phase(self, name: str, *, rung: str | None = None, t: float | None = None) -> None:
        """A boot phase that is not a state (the loop's launch checks, the barrier): timeline.py."""
        self.boot.mark(name, rung=rung, t=t)

    def transition(self, new: State, detail: str = "") -> None:
        with self.lock:
            if new not in ALLOWED[self.state]:
                raise IllegalTransition(f"{self.state.value} -> {new.value} is not allowed")
            self.state = new
            self.since = time.time()
            self.ready = new == State.SERVING
            self.history.append({"t": round(self.since, 3), "event": new.value, "detail": detail})
            self.boot.on_state(new.value, detail)

    def event(self, event: str, detail: str = "") -> None:
        with self.lock:
            self.history.append({"t": round(time.time(), 3), "event": event, "detail": detail})

    def update(self, **kv: Any) -> None:
        with self.lock:
            self.data.update(kv)

    def merge(self, key: str, **kv: Any) -> None:
        """Update the mapping under `key` (timings, say) without replacing its other entries."""
        with self.lock:
            self.data[key] = {**(self.data.get(key) or {}), **kv}

    def bump(self, key: str, sub: str | None = None) -> None:
        with self.lock:
            if sub is None:
                self.data[key] = int(self.data.get(key, 0)) + 1
            else:
                d = self.data.setdefault(key, {})
                d[sub] = int(d.get(sub, 0)) + 1

    def warn(self, message: str) -> None:
        with self.lock:
            if message not in self.data["warnings"]:
                self.data["warnings"].append(message)

    def stand(self, key: str, message: str | None) -> bool:
        """A warning for a condition that may end (a file the full disk keeps from being written): it
        replaces the key's earlier one, and None takes it back. Whether /status changed."""
        with self.lock:
            old = self._standing.get(key)
            if old == message:
                return False
            if old is not None:
                del self._standing[key]
                if old in self.data["warnings"]:
                    self.data["warnings"].remove(old)
            if message is not None:
                self._standing[key] = message
                if message not in self.data["warnings"]:
                    self.data["warnings"].append(message)
            return True

    def probe(self) -> dict[str, Any]:
        """What /ready says, without copying the record: a probe every second costs little (P2b)."""
        with self.lock:
            failure = self.data.get("last_failure") or {}
            return {"ready": self.ready, "state": self.state.value, "last_failure": {"class": failure.get("class")}}

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            out = {k: v for k, v in self.data.items()}
            out.update(state=self.state.value, ready=self.ready, since=round(self.since, 3),
                       uptime_s=round(time.time() - self.started, 3), history=list(self.history),
                       boot=self.boot.to_dict())
            return _copy(out)


def _copy(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_copy(x) for x in v]
    return v
