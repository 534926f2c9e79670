"""What the feeder does about the router's workers, decided from what it saw: pure, no I/O.

    replicas    the configured replicas, each ready or not (its status URL answered 200, or not)
    workers     smg's own list (GET /workers): url, id, status (pending, ready, not_ready, draining)

A ready replica that smg does not list (or lists only as draining, on its way out) is added; a
worker that is not a ready replica (not ready, unreachable, or no longer configured) is removed,
unless it is already draining. smg's own health checks may mark a listed worker not_ready between
two polls: that is its business, not a reason to add it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping


@dataclass(frozen=True)
class Worker:
    url: str
    id: str
    status: str          # smg's word: pending, ready, not_ready, draining, ...


@dataclass(frozen=True)
class Plan:
    add: tuple[str, ...]            # replica URLs
    remove: tuple[Worker, ...]


def norm(url: str) -> str:
    return url.rstrip("/")


def reconcile(ready: Mapping[str, bool], workers: Iterable[Worker]) -> Plan:
    """`ready`: replica URL -> its readiness, for every configured replica."""
    listed: dict[str, list[Worker]] = {}
    for w in workers:
        listed.setdefault(norm(w.url), []).append(w)
    add = tuple(url for url, ok in ready.items()
                if ok and all(w.status == "draining" for w in listed.get(norm(url), [])))
    want = {norm(u) for u, ok in ready.items() if ok}
    remove = tuple(w for url, ws in listed.items() if url not in want for w in ws if w.status != "draining")
    return Plan(add=add, remove=remove)


def routed(ready: Mapping[str, bool], workers: Iterable[Worker]) -> list[str]:
    """The replicas that take traffic now: ready by their own word and ready in smg's list."""
    live = {norm(w.url) for w in workers if w.status == "ready"}
    return [url for url, ok in ready.items() if ok and norm(url) in live]
