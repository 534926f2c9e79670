"""The replica list pushed in place (control.py), in memory and in `<state_dir>/router-replicas.json`.

It replaces the config's list for as long as the config's own list is the one it replaced: a
published config that names replicas of its own wins, and a supervisor restarted with the same
config (a container restart) keeps the pushed list. A state directory that cannot take the file
(full, read-only) keeps the list in memory only, with a warning; an unreadable file is ignored.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Callable

from ..config import ReplicaSpec, parse_config
from ..errors import ConfigError

log = logging.getLogger("kiln")
FILE = "router-replicas.json"

Replicas = tuple[ReplicaSpec, ...]


def parse(value: str) -> Replicas:
    """A KILN_ROUTER_REPLICAS value, validated as the config's own list is; ValueError names the problem."""
    try:
        new = parse_config('engine = "router"\n', source="the pushed replica list",
                           env={"KILN_ROUTER_REPLICAS": value}).router.replicas
    except ConfigError as e:
        raise ValueError("; ".join(str(p) for p in e.problems) or str(e)) from None
    if not new:
        raise ValueError("no replica: the list needs at least one URL|STATUS_URL entry")
    return new


class Pushed:
    def __init__(self, state_dir: Callable[[], str]):
        self.state_dir = state_dir
        self.current: tuple[Replicas, Replicas, float] | None = None    # (replaced, pushed, when)

    @property
    def path(self) -> Path:
        return Path(self.state_dir()) / FILE

    def replicas(self, own: Replicas) -> Replicas:
        """The list to work with, given the config's own."""
        cur = self.current
        return cur[1] if cur is not None and cur[0] == own else own

    def since(self, own: Replicas) -> float | None:
        """When the list in use was pushed; None while the config's own is in use."""
        cur = self.current
        return cur[2] if cur is not None and cur[0] == own else None

    def push(self, new: Replicas, own: Replicas) -> None:
        self.current = (own, new, time.time())
        data = json.dumps({"replaces": [[r.url, r.status_url] for r in own],
                           "replicas": [[r.url, r.status_url] for r in new]})
        path = self.path
        tmp = path.with_name(path.name + ".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(data, encoding="utf-8")
            os.replace(tmp, path)
        except OSError as e:
            log.warning("router: the new replica list is in use but not kept (%s: %s): a restart goes back to "
                        "the config's", path, e.strerror or e)
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass

    def load(self) -> None:
        path = self.path
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            own = tuple(ReplicaSpec(u, s) for u, s in data["replaces"])
            new = tuple(ReplicaSpec(u, s) for u, s in data["replicas"])
            self.current = (own, new, path.stat().st_mtime)
        except FileNotFoundError:
            self.current = None
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("router: %s is unreadable (%s): the config's replicas are used", path, e)
            self.current = None
