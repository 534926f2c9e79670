"""The group as one unit, seen from one rank: who is there, in which epoch, and whether it is lost.

    rank r > 0                                     rank 0 (the primary)
    ──────────                                     ────────────────────
    every 0.5 s: GET /cluster?beat={its beat} ───────▶ answer() on the group's port (listen.py, the
                 (sealed: protocol.Seal)              cluster network only): the seal checked, the beat
               ◀─────────────────────────────────     kept, with when it came; {the primary's own beat},
                                                      sealed too
    launch gate: the primary runs an engine        launch gate: every other rank fresh, at its gate,
      of a newer epoch than the one it joined        with no engine (KILN_CLUSTER_ARRIVE_S, else a
      (else, after ARRIVE_S: never answered)         terminal failure naming the rank)
    headless_up: the primary's engine up in        ready_gate (/ready): every other rank SERVING in
      the epoch it joined                            this epoch, and fresh
    watch: the primary silent for LOST_S, or its   watch: a rank silent for LOST_S (dead or hung),
      engine down or of another epoch -> lost()      its engine down after it joined this epoch (seen
                                                     running, or its beat of this epoch without one),
                                                     or gone -> lost();
                                                     while SERVING, a real 1-token request through its
                                                     own API every PROBE_S, answered within its timeout
                                                     (a hung or dead engine under a live supervisor)

The epoch is the primary's engine launch count; a rank's engine belongs to the epoch it joined. A
loss is reported once per epoch, and only while this rank's own engine runs: the loop stops that
engine and its restart policy (backoff, cap, then FAILED) takes over, so the group restarts in
order through the two gates. vLLM's /health is never asked: it says 200 with a dead rank; while SERVING the primary sends a real
1-token request through its own API instead (a rank's engine hung or dead under a live supervisor).

The primary's `answer` runs on the status server's thread; everything else on the watcher's thread or
a task's. One lock guards the table.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from ..cluster_env import Node
from .listen import GroupListener
from .protocol import GONE, PATH, UP, Beat, Seal

__all__ = ["BEAT_S", "Group"]

log = logging.getLogger("kiln")
BEAT_S = 0.5           # how often a rank beats (and the primary looks)


@dataclass
class _Seen:
    beat: Beat | None = None
    at: float | None = None        # when (monotonic) its last beat came or was answered
    joined: bool = False           # primary: it ran an engine in the current epoch


class Group:
    def __init__(self, node: Node, *, local: Callable[[], tuple[str, bool, str]], lost: Callable[[str], None],
                 seal: Seal, clock: Callable[[], float] = time.monotonic, beat_s: float = BEAT_S,
                 probe: Callable[[], str | None] | None = None):
        self.node = node
        self._local = local                  # (state, an engine of ours runs, last failure class)
        self._lost = lost
        self._seal = seal                    # every beat out is sealed, every beat in opened (protocol.py)
        self._port = node.group_port
        self._listener: GroupListener | None = None
        self.refused = 0                     # beats refused: forged, old or replayed (said on /status)
        self._clock = clock
        self._beat_s = beat_s
        self._lock = threading.Lock()
        self.epoch = 0                       # see the docstring
        self._pending = 0                    # another rank: the epoch its gate saw, made `epoch` at launch
        self._launched_at = clock()
        self._waiting = False
        self._fired: int | None = None       # the epoch a loss was reported for
        self._last_loss = ""
        others = range(1, node.nodes) if node.primary else (0,)
        self._seen: dict[int, _Seen] = {r: _Seen() for r in others}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The primary's real request through its own API while SERVING (cluster_env: KILN_CLUSTER_PROBE_S):
        # a rank whose engine hangs or died under a live supervisor answers no beat differently, and
        # vLLM's /health says 200 while every request fails; None: why the last probe failed, else None.
        self._probe = probe if node.primary else None
        self._probe_at = clock()
        self._probing = False
        self.probe_thread: threading.Thread | None = None    # the last probe's (tests join it)
        self._probe_failed: tuple[int, str, float] | None = None    # (epoch, why, when)

    # -- this rank ----------------------------------------------------------------------------------
    def me(self) -> Beat:
        # The epoch first: the loop counts a new engine before it moves the epoch on, so this order can
        # never say "joined the new epoch, no engine" about a launch landing between the two reads.
        epoch = self.epoch
        state, running, failure = self._local()
        awaiting = "; ".join(self._behind(lambda b: b.waiting and not b.running)) \
            if self.node.primary and self._waiting else ""
        return Beat(rank=self.node.rank, state=state, running=running, epoch=epoch, waiting=self._waiting,
                    failure=failure if state in GONE else "", awaiting=awaiting)

    def launched(self) -> None:
        """This rank's engine was just started: the primary's epoch moves on, another rank joins the
        epoch its gate saw."""
        with self._lock:
            self.epoch = self.epoch + 1 if self.node.primary else self._pending
            self._launched_at = self._clock()
            for s in self._seen.values():
                s.joined = False

    def start(self) -> None:
        """The primary listens for its ranks on the cluster network (OSError: the port or address is not
        this node's to take; the caller says so); then the watcher runs."""
        if self.node.primary:
            self._listener = GroupListener(self.node.node_addr, self._port, self.answer)
            self._listener.start()
        self._thread = threading.Thread(target=self._run, name="kiln-cluster", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.stop()

    # -- the primary's side of the protocol -----------------------------------------------------------
    def answer(self, body: bytes) -> tuple[int, bytes]:
        """GET /cluster?beat=... on this node's status port: (HTTP status, JSON body)."""
        if not self.node.primary:
            return 409, json.dumps({"error": f"this node is rank {self.node.rank}; beat to rank 0"}).encode()
        try:
            beat = self._seal.open(body, self.node.nodes)
        except (ValueError, UnicodeDecodeError) as e:
            self.refused += 1
            if self.refused in (1, 10) or self.refused % 100 == 0:
                log.warning("cluster: a beat refused (%d so far): %s", self.refused, e)
            return 403, json.dumps({"error": f"beat refused: {e}"}).encode()
        if beat.rank == 0:
            return 400, json.dumps({"error": "rank 0 is this node"}).encode()
        with self._lock:
            self._seen[beat.rank] = _Seen(beat, self._clock(), self._seen[beat.rank].joined)
        return 200, self._seal.seal(self.me())

    def forming(self) -> str | None:
        """While this rank waits at its launch gate: who the group waits for, else None."""
        if not self._waiting:
            return None
        if self.node.primary:
            behind = self._behind(lambda b: b.waiting and not b.running)
            return "the group is forming: waiting for " + "; ".join(behind) if behind else None
        with self._lock:
            s = self._seen[0]
        if s.beat is None:
            return f"the group is forming: rank 0 (the primary, {self.node.primary_addr}:{self._port}) never answered"
        return (f"the group is forming: rank 0 (the primary) is {s.beat.state}"
                + (f", waiting for {s.beat.awaiting}" if s.beat.awaiting else ""))

    def ready_gate(self, snap: dict[str, Any]) -> dict[str, Any]:
        """/ready on the primary: ready only with every other rank SERVING in this epoch, and fresh. Any
        rank at its launch gate says who the group waits for (not just its own state)."""
        forming = self.forming()
        if forming and snap.get("ready") is not True:
            return dict(snap, not_ready=forming)
        if not self.node.primary or snap.get("ready") is not True:
            return snap
        behind = self._behind(lambda b: b.state == "SERVING" and b.running and b.epoch == self.epoch)
        if behind:
            snap = dict(snap, ready=False, not_ready="the group is not whole: " + "; ".join(behind))
        return snap

    def _behind(self, ok: Callable[[Beat], bool]) -> list[str]:
        now = self._clock()
        out = []
        with self._lock:
            for r, s in sorted(self._seen.items()):
                if s.beat is None or s.at is None:
                    out.append(f"rank {r} never arrived")
                elif now - s.at > self.node.lost_s:
                    out.append(f"rank {r} silent for {now - s.at:.1f} s")
                elif not ok(s.beat):
                    out.append(f"rank {r} {s.beat.state}{' (engine running)' if s.beat.running else ''}"
                               f"{'' if s.beat.epoch == self.epoch else f' in epoch {s.beat.epoch}'}")
        return out

    # -- the gates (run as tasks: they block) ---------------------------------------------------------
    def launch_gate(self, cancelled: threading.Event) -> str | None:
        """Wait until this rank may launch, in the group's order. None: launch; else why never (the
        rank that did not arrive or come back, named)."""
        start = self._clock()
        self._waiting = True
        try:
            while not cancelled.is_set():
                gone = self._gone()
                if gone:
                    return gone
                if self.node.primary:
                    behind = self._behind(lambda b: b.waiting and not b.running)
                    if not behind:
                        return None
                else:
                    with self._lock:
                        s = self._seen[0]
                        fresh = s.at is not None and self._clock() - s.at <= self.node.lost_s
                        if fresh and s.beat is not None and s.beat.running and s.beat.epoch > self.epoch:
                            self._pending = s.beat.epoch
                            return None
                        behind = ["rank 0 (the primary) never answered" if s.beat is None else
                                  f"rank 0 (the primary) is {s.beat.state} in epoch {s.beat.epoch}"
                                  + (f", waiting for {s.beat.awaiting}" if s.beat.awaiting else "")]
                if self._clock() - start > self.node.arrive_s:
                    return (f"the group did not form within {self.node.arrive_s:g} s (KILN_CLUSTER_ARRIVE_S): "
                            + "; ".join(behind) + self._where())
                cancelled.wait(0.1)
            return None
        finally:
            self._waiting = False

    def _where(self) -> str:
        refused = f"; {self.refused} beat(s) refused: does every node have the same KILN_CLUSTER_SECRET?" \
            if self.refused else ""
        if self.node.primary:
            return (f"; check that every node runs this image and can reach {self.node.primary_addr}:{self._port} "
                    f"(the group's port, KILN_CLUSTER_PORT){refused}")
        return (f"; this node beats to {self.node.primary_addr}:{self._port} (PRIMARY_ADDR, the group's port "
                f"KILN_CLUSTER_PORT){refused}")

    def _gone(self) -> str | None:
        with self._lock:
            for r, s in sorted(self._seen.items()):
                if s.beat is not None and s.beat.state in GONE:
                    return f"rank {r} is {s.beat.state}{f' ({s.beat.failure})' if s.beat.failure else ''}"
        return None

    def headless_up(self, cancelled: threading.Event, alive: Callable[[], bool], max_s: float) -> bool | None:
        """A headless rank has no HTTP of its own: it is up once the primary's engine of the epoch it
        joined is. True: up; False: not within max_s; None: its engine exited or the wait was cancelled."""
        start = self._clock()
        while not cancelled.is_set() and alive():
            with self._lock:
                s = self._seen[0]
                if s.beat is not None and s.at is not None and s.at >= self._launched_at \
                        and s.beat.epoch == self.epoch and s.beat.running and s.beat.state in UP:
                    return True
            if self._clock() - start > max_s:
                return False
            cancelled.wait(0.1)
        return None

    # -- watching -------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.node.primary:
                self._beat()
            try:
                self._check()
            except Exception:  # noqa: BLE001 - the watcher must outlive a bug in one look
                log.exception("cluster: checking the group failed")
            self._stop.wait(self._beat_s if not self.node.primary else self._beat_s / 2)

    def _beat(self) -> None:
        timeout = max(0.2, min(1.0, self.node.lost_s / 3))
        conn = http.client.HTTPConnection(self.node.primary_addr, self._port, timeout=timeout)
        try:
            conn.request("GET", f"{PATH}?{urlencode({'beat': self._seal.seal(self.me()).decode()})}")
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                if resp.status == 403 and self.refused == 0:
                    log.warning("cluster: rank 0 refused this rank's beat: %s", body[:200].decode(errors="replace"))
                self.refused += resp.status == 403
                return
            beat = self._seal.open(body, self.node.nodes)
        except (OSError, ValueError, http.client.HTTPException) as e:
            if isinstance(e, ValueError):    # an answer not sealed by this cluster: not the primary's
                self.refused += 1
            return                           # silence: _check counts it
        finally:
            conn.close()
        with self._lock:
            self._seen[0] = _Seen(beat, self._clock())

    def _check(self) -> None:
        state, running, _ = self._local()
        if not running or self.epoch == 0:
            return
        self._maybe_probe(state)
        reason = self._loss()
        if reason is None or self._fired == self.epoch:
            return
        self._fired, self._last_loss = self.epoch, reason
        log.warning("cluster: %s: stopping this rank's engine (epoch %d) so the group restarts", reason, self.epoch)
        self._lost(reason)

    def _maybe_probe(self, state: str) -> None:
        """While SERVING, every probe_s, one real request in a thread of its own (it may take its timeout)."""
        if self._probe is not None and state != "SERVING" and not self._probing:
            self._probe_at = self._clock()        # the first probe comes PROBE_S into serving, not at once
        if self._probe is None or state != "SERVING" or self._probing \
                or self._clock() - self._probe_at < self.node.probe_s:
            return
        self._probing, epoch = True, self.epoch

        def run() -> None:
            try:
                why = self._probe() if self._probe is not None else None
            except Exception as e:  # noqa: BLE001 - a probe that cannot run says so as its answer
                why = f"the probe could not run: {type(e).__name__}"
            with self._lock:
                if why is not None and epoch == self.epoch:
                    self._probe_failed = (epoch, why, self._clock())
                self._probe_at, self._probing = self._clock(), False

        self.probe_thread = threading.Thread(target=run, name="kiln-cluster-probe", daemon=True)
        self.probe_thread.start()

    def _loss(self) -> str | None:
        now = self._clock()
        with self._lock:
            for r, s in sorted(self._seen.items()):
                since = s.at if s.at is not None and s.at >= self._launched_at else None
                b = s.beat
                if b is not None and b.state in GONE and since is not None:
                    return f"rank {r} is {b.state}{f' ({b.failure})' if b.failure else ''}"
                if self.node.primary:
                    if b is None or s.at is None:
                        continue              # not arrived: the launch gate waited for it, vLLM waits now
                    if now - s.at > self.node.lost_s:
                        return f"rank {r} stopped answering: no beat for {now - s.at:.1f} s (dead or hung)"
                    if b.running and b.epoch == self.epoch:
                        s.joined = True
                    elif s.joined or b.epoch == self.epoch:
                        # joined: seen running in this epoch; or its beat says it launched into this epoch
                        # (a rank's epoch moves only at its launch) and its engine died before a beat showed it
                        return f"rank {r}'s engine went down (rank {r} is {b.state}, with no engine of this epoch)"
                else:
                    quiet = now - (since if since is not None else self._launched_at)
                    if quiet > self.node.lost_s:
                        return f"rank 0 (the primary) stopped answering: nothing for {quiet:.1f} s (dead or hung)"
                    if since is not None and b is not None and not b.running:
                        return f"rank 0's engine went down (rank 0 is {b.state}, with no engine running)"
                    if since is not None and b is not None and b.epoch != self.epoch:
                        return f"rank 0 started another engine (epoch {b.epoch}; this rank joined epoch {self.epoch})"
        failed = self._probe_failed
        # A failed probe counts once the beats had LOST_S to say more (a rank's engine that died says
        # so in its next beat, which names it); then it is the group's own hang or death.
        if failed is not None and failed[0] == self.epoch and now - failed[2] >= self.node.lost_s:
            return failed[1]
        return None

    # -- /status ------------------------------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        now = self._clock()
        with self._lock:
            ranks = {str(r): ({"state": s.beat.state, "running": s.beat.running, "epoch": s.beat.epoch,
                               "waiting": s.beat.waiting, "seen_s_ago": round(now - s.at, 2) if s.at else None}
                              if s.beat else {"state": "never arrived"}) for r, s in sorted(self._seen.items())}
        return {"rank": self.node.rank, "nodes": self.node.nodes, "primary": f"{self.node.primary_addr}",
                "epoch": self.epoch, "waiting": self._waiting, "last_loss": self._last_loss, "others": ranks}
