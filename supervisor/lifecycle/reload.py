"""Hot reload: the decision on a published config, and how a failed one is told.

Where a reload is applied: `decide()` says what becomes of a validated candidate — rejected
(the server untouched), unchanged, applied at once, or applied once its model is fetched beside
the serving engine; the machine (supervisor/lifecycle/machine.py) walks the new config's ladder and rolls
back to the last good one when it does not serve. `cause()` and `tail()` say why one failed, for
the book (supervisor/reload/book.py) and the fleet record. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .events import CandidateChecked
    from ..failure import Failure
    from .state import Live


@dataclass(frozen=True)
class Reject:
    causes: tuple[str, ...]
    config_hash: str | None = None


@dataclass(frozen=True)
class Unchanged:
    """Same config (the hash of what would run), newly published: adopt where it came from."""


@dataclass(frozen=True)
class FetchFirst:
    """A new [model] (or a failed server): fetch it while the old server keeps serving."""


@dataclass(frozen=True)
class Apply:
    live: "Live"                     # the new config, with the model it loads


def decide(ev: "CandidateChecked", running: "Live", *, failed: bool) -> Reject | Unchanged | FetchFirst | Apply:
    if ev.live is None or ev.problems:
        return Reject(tuple(ev.problems) or ("(file): rejected",))
    new = ev.live
    if new.cfg.hash == running.cfg.hash and not failed:
        return Unchanged()
    if new.cfg.model == running.cfg.model and running.model_path is not None and not failed:
        return Apply(new.with_model(running.model_path))   # a model update is a new revision there
    return FetchFirst()


def cause(failure: "Failure | None") -> str:
    return f"{failure.failure_class.value}: {failure.reason}" if failure is not None else "unknown"


TAIL_KEPT = 12      # stderr lines of a failed reload kept with its decision


def tail(failure: "Failure | None") -> tuple[str, ...]:
    """The last lines the engine printed before the published config failed."""
    return tuple(failure.tail[-TAIL_KEPT:]) if failure is not None else ()
