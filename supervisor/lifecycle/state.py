"""The supervisor's lifecycle states, the transitions allowed between them, the live config
value, and the record /status is built from. One owner (the lifecycle loop) changes state; the
status server only reads a snapshot under the lock. No decision reads the record back: the
machine (supervisor/lifecycle/machine.py) keeps what it needs in its own fields.
"""

from __future__ import annotations

import collections
import enum
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import KilnError
from ..run.timeline import Timelines

if TYPE_CHECKING:
    from ..config import DeployConfig


class State(str, enum.Enum):
    PREFLIGHT = "PREFLIGHT"
    FETCH = "FETCH"
    LAUNCHING = "LAUNCHING"
    LOADING = "LOADING"
    HEALTHY = "HEALTHY"
    SELFTEST = "SELFTEST"
    SERVING = "SERVING"
    RESTARTING = "RESTARTING"
    RELOADING = "RELOADING"
    ROLLBACK = "ROLLBACK"
    FAILED = "FAILED"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"


@dataclass(frozen=True)
class Origin:
    """Where the live config came from: the image (`boot`), a watched Hub branch (`hub`) or a
    watched directory (`local`); `where` is the file or hf:// location, `revision` the Hub commit."""
    channel: str = "boot"
    where: str = ""
    revision: str | None = None


@dataclass(frozen=True)
class Live:
    """A config as it runs: the config, the model file it loads (None until fetched), its text
    when it was published (None for the image's own), and where it came from."""
    cfg: "DeployConfig"
    model_path: Path | None = None
    text: str | None = None
    origin: Origin = Origin()

    def with_model(self, path: Path | None) -> "Live":
        return replace(self, model_path=path)


S = State
ALLOWED: dict[State, set[State]] = {
    S.PREFLIGHT: {S.FETCH, S.FAILED, S.STOPPING},
    S.FETCH: {S.LAUNCHING, S.FAILED, S.STOPPING},
    # A published config that fails on its way up (launch, load, selftest) rolls back from there.
    S.LAUNCHING: {S.LOADING, S.LAUNCHING, S.FAILED, S.STOPPING, S.ROLLBACK, S.RESTARTING},
    S.LOADING: {S.HEALTHY, S.LAUNCHING, S.RESTARTING, S.FAILED, S.STOPPING, S.ROLLBACK},
    S.HEALTHY: {S.SELFTEST, S.SERVING, S.STOPPING, S.RESTARTING},
    S.SELFTEST: {S.SERVING, S.LAUNCHING, S.FAILED, S.STOPPING, S.RESTARTING, S.ROLLBACK},
    S.SERVING: {S.RESTARTING, S.RELOADING, S.STOPPING},
    S.RESTARTING: {S.LAUNCHING, S.RESTARTING, S.FAILED, S.STOPPING},
    S.RELOADING: {S.LAUNCHING, S.SERVING, S.ROLLBACK, S.FAILED, S.STOPPING},
    S.ROLLBACK: {S.LAUNCHING, S.FAILED, S.STOPPING},
    S.FAILED: {S.STOPPING, S.RELOADING},
    S.STOPPING: {S.STOPPED},
    S.STOPPED: set(),
}


class IllegalTransition(KilnError):
    """A transition the state machine forbids: a bug in the loop, never a user error."""


class Record:
    """What the supervisor knows, guarded by one lock; `snapshot()` is what /status shows."""

    def __init__(self, version: str, *, process_start: float | None = None):
        self.lock = threading.Lock()
        self.state = State.PREFLIGHT
        self.since = time.time()
        self.started = time.time()
        self.boot_monotonic = time.monotonic()
        self.data: dict[str, Any] = {
            "version": version, "config": {}, "rung": None, "engine": None, "restarts": 0,
            "launches": 0, "failures": {}, "last_failure": None, "selftest": None,
            "hardware": None, "timings": {}, "warnings": [],
        }
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
