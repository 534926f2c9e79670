"""The parts that run beside the loop and only report or relay: the status page, the TCP relay,
the config watcher, the fleet reporter and, for engine = "router", the router's feeder (its replicas
in and out of smg by their readiness; /ready needs one routed). None of them decides anything about
the lifecycle, and none holds the loop: the loop wires them with callbacks (what /status shows, how
to wake the loop, the engine's port, the secrets to mask, the live config, the key) and asks them
for what they found (a published config, a status).

They start once the engine is on its way (the loop calls `start()` the first time it has nothing
else to do), so a boot pays for none of their imports before the engine is launched (P1).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..config import DeployConfig
from ..lifecycle.state import State

log = logging.getLogger("kiln")

# States that are news for the fleet record. The steps of a walk are not: each would cost a commit
# and hold the verdict that follows back by one write interval; the heartbeat shows a long walk.
SETTLED = (State.SERVING, State.FAILED, State.RESTARTING, State.STOPPED)


@dataclass(frozen=True)
class Wiring:
    """What the peripherals are given instead of the loop."""
    snapshot: Callable[[], dict[str, Any]]          # the record /status is built from
    wake: Callable[[], None]                        # the watcher found a candidate: wake the loop
    engine_port: Callable[[], int]                  # the relay follows the engine's port across reloads
    secrets: Callable[[], Sequence[str]]            # masked from every page, record and log line
    seen: Callable[[], dict[str, dict[str, str]]]   # the reload book's last decided revision per source
    warn: Callable[[str], None]                     # a warning on /status and in the log
    env: Mapping[str, str]
    hub_token: str | None = None
    status: bool = True                             # serve the status page (tests may run without)
    probe: Callable[[], dict[str, Any]] | None = None   # /ready's few fields, cheaper than a snapshot
    live: Callable[[], DeployConfig] | None = None  # the config that runs now (the router's replicas)
    api_key: Callable[[], str | None] = lambda: None   # the server's key (the router's and its replicas')
    group: Any = None                               # a cluster's rank: supervisor/cluster/group.py Group


# The states a router goes through only on its way out: a client held at its closed gate would be cut.
LEAVING = (State.STOPPING, State.STOPPED, State.FAILED)


class Peripherals:
    def __init__(self, cfg: DeployConfig, wiring: Wiring):
        self.cfg = cfg                    # the boot config: reloads do not move the ports or the watch
        self.wiring = wiring
        self.started = False
        self.status: Any = None           # supervisor/status/server.py StatusServer
        self.tcp: Any = None              # supervisor/status/relay.py TcpRelay
        self.watcher: Any = None          # supervisor/reload/watch.py Watcher
        self.reporter: Any = None         # supervisor/fleet/reporter.py Reporter, with a [watch] repo that reports
        self.feeder: Any = None           # supervisor/router/feeder.py Feeder, for engine = "router"

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        cfg, w = self.cfg, self.wiring
        if cfg.watch.enabled:       # first: once /status answers, a config published is seen
            self._start_watch()
        if w.status:
            from ..status.server import StatusServer

            health = cfg.serverless.health_path if cfg.serverless.active else None   # RunPod's health check
            # No beat here: the group's beats have a port of their own on the cluster network (cluster/listen.py)
            self.status = StatusServer(cfg.status.host, cfg.status.port, self.snapshot, secrets=w.secrets,
                                       health_path=health, probe=self.probe if w.probe else None)
            self.status.start()
        if cfg.server.tcp_port:
            self._start_tcp_relay(cfg.server.tcp_port)
        if cfg.engine == "router":
            from ..router.control import read_operator_key
            from ..router.feeder import Feeder

            live = w.live or (lambda: cfg)
            self.feeder = Feeder(live, w.api_key,
                                 operator_key=lambda: read_operator_key(live().router.operator_key, w.env))
            self.feeder.router_state(w.snapshot().get("state") == State.SERVING.value)   # later: state_changed
            self.feeder.start()

    def _start_watch(self) -> None:
        from ..model.fetch.layout import cache_dir
        from ..reload.watch import Watcher

        cfg, w = self.cfg, self.wiring
        pod = None
        if cfg.watch.reporting and not w.hub_token:
            log.info("fleet report: off, no Hub token to write with (HF_TOKEN or a secret file); this pod "
                     "reads configs but neither reports nor takes canaries")
        elif cfg.watch.reporting:
            from ..fleet.record import pod_id
            from ..fleet.reporter import Reporter

            pod = pod_id(w.env)
            self.reporter = Reporter(cfg.watch, pod=pod, token=w.hub_token, snapshot=self.snapshot,
                                     secrets=w.secrets)
        self.watcher = Watcher(cfg.watch, cache=cache_dir(cfg), token=w.hub_token, seen=w.seen(), wake=w.wake,
                               secrets=w.secrets, pod=pod)
        self.watcher.start()
        if self.reporter is not None:
            self.reporter.start()

    def _start_tcp_relay(self, port: int) -> None:
        """The TCP port is a convenience beside the HTTP one: a busy port is a warning, not a failure."""
        from ..status.relay import TcpRelay

        host = self.cfg.server.host
        relay = TcpRelay(host, port, host, self.wiring.engine_port)
        try:
            relay.start()
        except OSError as e:
            self.wiring.warn(f"TCP relay not started: port {port}: {e.strerror or e}")
            return
        self.tcp = relay
        log.info("TCP relay: port %d -> the engine's port", port)

    def stop(self) -> None:
        # the reporter's last record: STOPPED
        for part in (self.watcher, self.reporter, self.feeder, self.tcp, self.status):
            if part is not None:
                part.stop()

    # -- what the loop asks and tells ------------------------------------------------------------
    def take_candidate(self) -> Any:
        """A published config the watcher found (supervisor/reload/candidate.py Candidate), or None."""
        return self.watcher.take() if self.watcher is not None else None

    def state_changed(self, state: State) -> None:
        """A settled state is news for the fleet record (the reporter paces the writes); any state is
        news for the router's feeder (a restarted router starts with no workers)."""
        if self.feeder is not None:
            self.feeder.router_state(state == State.SERVING, leaving=state in LEAVING)
        if state in SETTLED:
            self.report()

    def report(self) -> None:
        """Something the fleet record shows changed (a state, a reload verdict)."""
        if self.reporter is not None:
            self.reporter.poke()

    def snapshot(self) -> dict[str, Any]:
        """What /status and the fleet record show: the loop's record and each part's own status."""
        snap = self.wiring.snapshot()
        if self.watcher is not None:
            snap["watch"] = self.watcher.status()
            if self.reporter is not None:
                snap["watch"]["report"] = self.reporter.status()
        if self.tcp is not None:
            snap["tcp_relay"] = self.tcp.status()
        if self.feeder is not None:       # a router serves only while a replica is routed
            snap["router"] = self.feeder.status()
        if self.wiring.group is not None:
            snap["cluster"] = self.wiring.group.view()
        return self._group_gate(self._router_gate(snap))

    def probe(self) -> dict[str, Any]:
        """/ready's few fields (the record's probe), with the router's own condition on top."""
        assert self.wiring.probe is not None
        return self._group_gate(self._router_gate(self.wiring.probe()))

    def _group_gate(self, snap: dict[str, Any]) -> dict[str, Any]:
        """A cluster's primary is ready only with the whole group (cluster/group.py ready_gate)."""
        return snap if self.wiring.group is None else self.wiring.group.ready_gate(snap)

    def _router_gate(self, snap: dict[str, Any]) -> dict[str, Any]:
        if self.feeder is not None and snap.get("ready") is True and not self.feeder.routable():
            snap["ready"] = False
            snap["not_ready"] = "no replica is routed (none says ready, or the router does not answer)"
        return snap
