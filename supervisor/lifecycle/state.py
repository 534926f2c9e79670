"""The supervisor's lifecycle states, the transitions allowed between them, and the live config
value. Pure data: the record /status is built from is the shell's (run/record.py), and no decision
reads it back: the machine (lifecycle/machine.py) keeps what it needs in its own fields.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import KilnError

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
