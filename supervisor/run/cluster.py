"""A node of a cluster, as the loop sees it (supervisor/cluster/ is the group itself): built from
RunPod's variables at start, then one hook per effect that a rank changes.

    Prepare (boot)   the node's own checks (cluster/node.py) and the variables (cluster_env.py):
                     a problem is FAILED at once, with its fix
    CheckLaunch, Barrier   the group's launch order (Group.launch_gate) in the task, after the
                     rung's own checks / the reclaim barrier; a rank that never came: node_missing
    Launch           the rank's vLLM flags and interface variables (through the Runtime), the epoch
    WaitHealthy      a headless rank waits for the primary's engine, not for HTTP of its own
    RunSelftest      a headless rank has none: the primary's, through the API, speaks for the group
    a loss           (GroupLost, from the group's watcher) the engine stopped, told to the machine as
                     its death, so the restart policy (backoff, cap, FAILED) acts as for any crash
"""

from __future__ import annotations

import http.client
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import cluster_env
from ..cluster import engine as cluster_engine
from ..cluster import node as node_checks
from ..cluster.group import Group
from ..cluster.protocol import Seal
from ..config import DeployConfig
from ..errors import Problem
from ..failure import Failure, FailureClass
from ..lifecycle import events as E
from .runtime import Runtime
from .tasks import Task

log = logging.getLogger("kiln")

__all__ = ["ClusterNode", "GroupLost"]


@dataclass(frozen=True)
class GroupLost:
    """Internal to the loop: the group lost a rank (cluster/group.py says which and how)."""
    reason: str


class ClusterNode:
    def __init__(self, node: cluster_env.Node | None, problems: list[Problem], group: Group | None,
                 show: Callable[[dict[str, Any]], None] = lambda _: None):
        self.node, self.problems, self.group = node, problems, group
        self.group_rec = show                # the selftest record, on a headless rank

    @classmethod
    def of(cls, env: Mapping[str, str], cfg: DeployConfig, rt: Runtime, *, running: Callable[[], bool],
           post: Callable[[Any], None]) -> ClusterNode:
        """An inert one (no group, no checks) when this node is not in a cluster (NUM_NODES unset or 1)."""
        problems: list[Problem] = []
        node = cluster_env.read(env, problems)
        group = None
        if node is not None:
            def local() -> tuple[str, bool, str]:
                probe = rt.rec.probe()
                return probe["state"], running(), probe["last_failure"].get("class") or ""

            host = "127.0.0.1" if cfg.server.host in ("0.0.0.0", "::", "") else cfg.server.host
            group = Group(node, local=local, lost=lambda why: post(GroupLost(why)),
                          seal=Seal(node.secret, env.get(cluster_env.CLUSTER_NAME_ENV, "")),
                          probe=lambda: probe(host, cfg.server.port, rt.api_key, node.probe_timeout_s))
            rt.secrets.add(node.secret)
            rt.node_argv, rt.node_env = cluster_engine.argv(node), cluster_engine.env_defaults(node)
            rt.rec.update(cluster={"rank": node.rank, "nodes": node.nodes, "primary": node.primary_addr})
        return cls(node, problems, group, show=lambda r: rt.rec.update(selftest=r))

    @property
    def headless(self) -> bool:
        return self.node is not None and not self.node.primary

    def start(self) -> None:
        if self.group is not None and self.node is not None:
            try:
                self.group.start()
            except OSError as e:       # the group's port taken, or NODE_ADDR not this node's: refused at prepare
                self.problems.append(Problem(
                    "KILN_CLUSTER_PORT (env)", f"rank 0 cannot take its ranks' beats on {self.node.node_addr}:"
                    f"{self.node.group_port}: {e.strerror or e}", self.node.group_port,
                    "a free port on this node's cluster address (NODE_ADDR), the same on every node"))
                return
            log.info("cluster: %s, interface %s", self.node.describe(), self.node.ifname)

    def launched(self) -> None:
        if self.group is not None:
            self.group.launched()

    def no_selftest(self, token: int) -> E.SelftestDone:
        """RunSelftest on a headless rank: nothing to ask (no HTTP); the primary's passed through the API."""
        self.group_rec({"passed": None, "summary": "headless rank: the primary's selftest (through the API) "
                                                   "is the group's"})
        return E.SelftestDone(token, None)

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()

    def refused(self, cfg: DeployConfig) -> Failure | None:
        """Prepare at boot: the variables and the node's own checks; every problem in one failure."""
        if self.node is None and not self.problems:
            return None
        found = [str(p) for p in self.problems]
        if self.node is not None:
            found += node_checks.problems(self.node, cfg.engine, [(r.name, r.args) for r in cfg.ladder.rungs])
        if not found:
            return None
        return Failure(FailureClass.CONFIG_REJECTED, "cluster node refused: " + " | ".join(found))

    def gate(self, answer: Callable[[Failure | None], Any], before: Callable[[Task], Any] | None = None
             ) -> tuple[Callable[[Task], Any], Callable[[BaseException], Any]]:
        """The group's launch order as a task's work (after `before`, the reclaim barrier's), and
        what a crash in it answers."""
        def work(task: Task) -> Any:
            if before is not None:
                before(task)
            assert self.group is not None
            why = self.group.launch_gate(task.cancelled)
            return answer(Failure(FailureClass.NODE_MISSING, why) if why else None)
        return work, lambda e: answer(Failure(FailureClass.NODE_MISSING, f"the group's launch gate failed: {e}"))

    def after(self, work: Callable[[Task], Any], answer: Callable[[Failure | None], Any]) -> Callable[[Task], Any]:
        """Barrier: the reclaim barrier's work, then the group's launch order (`work` itself off a cluster)."""
        return work if self.group is None else self.gate(answer, before=work)[0]

    def health_work(self, proc: Any, max_s: float, token: int) -> Callable[[Task], E.HealthDone | None]:
        """WaitHealthy on a headless rank: up when the primary's engine of its epoch is."""
        def work(task: Task) -> E.HealthDone | None:
            assert self.group is not None
            up = self.group.headless_up(task.cancelled, proc.alive, max_s)
            if up is None:
                return None
            return E.HealthDone(token, True, time.monotonic() - proc.started_at) if up else \
                E.HealthDone(token, False, max_s, f"the primary's engine was not up within {max_s:g} s (health.max_s)")
        return work

    def lost(self, ev: GroupLost, token: int | None, engines: dict[int, Any], grace_s: float) -> E.EngineDown | None:
        """A loss: this rank's engine stopped (its exit is then not news) and told as its death."""
        eng = engines.pop(token, None) if token is not None else None
        if eng is None:
            return None
        eng.stopping = True
        eng.proc.stop(grace_s)
        rung = eng.live.cfg.ladder.rungs[eng.index].name
        return E.EngineDown(token, Failure(FailureClass.CRASHED, f"the group lost a rank: {ev.reason}", rung=rung))


def probe(host: str, port: int, key: str | None, timeout_s: float) -> str | None:
    """One real request through the primary's API, as a client sends it: the served model's id from
    /v1/models, then a 1-token completion at temperature 0. None when both answered 200 within
    timeout_s; else why (never the key)."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    deadline = time.monotonic() + timeout_s
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", "/v1/models", headers=headers)
        resp = conn.getresponse()
        models = json.loads(resp.read() or b"{}") if resp.status == 200 else {}
        if resp.status != 200 or not models.get("data"):
            return f"the group's probe: /v1/models through rank 0's API answered {resp.status}"
        body = json.dumps({"model": models["data"][0]["id"], "prompt": "1", "max_tokens": 1, "temperature": 0})
        conn.timeout = max(0.1, deadline - time.monotonic())
        if conn.sock is not None:
            conn.sock.settimeout(conn.timeout)
        conn.request("POST", "/v1/completions", body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            return (f"the group's probe: a 1-token completion through rank 0's API answered {resp.status} "
                    "(vLLM's /health may still say 200: a rank's engine is dead)")
        return None
    except (OSError, ValueError, KeyError, http.client.HTTPException) as e:
        kind = "no answer within" if isinstance(e, TimeoutError) else f"{type(e).__name__} within"
        return f"the group's probe: a 1-token completion through rank 0's API: {kind} {timeout_s:g} s (a hung rank)"
    finally:
        conn.close()
