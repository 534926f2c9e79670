"""The feeder: the router's workers are exactly the replicas that say they are ready.

Every `[router] poll_s` (1 s by default) it asks each replica's status URL (a Kiln supervisor's
/ready: 200 only in SERVING, after the selftest; reloading, restarting, failed, stopped or
unreachable is not ready), lists smg's own workers, and reconciles the two (plan.py): a replica that
turned ready is added, one that is not is removed; in-flight requests on a removed one finish. A
router that does not answer (starting, restarting) is asked again next round: its new process starts
empty and gets every ready replica at once.

The replicas are the live config's, unless a new list was pushed on the router's own port
(control.py, `pods up --router` again with other replicas): then that one, for as long as the
config's own list is the one it replaced (pushed.py, which keeps it in the state directory).

A peripheral (run/peripherals.py): given callables for the live config and the key, never the
loop; the loop's /status and /ready read `status()` and `routable()`.
"""

from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ..config import DeployConfig, ReplicaSpec
from . import control, pushed
from .front import Front
from .plan import Worker, reconcile, routed
from .smg import RouterUnavailable, Smg

log = logging.getLogger("kiln")
ADOPT_ROUNDS = 3          # rounds in a row a ready replica is added without smg taking it, before it is said


def probe(status_url: str, timeout_s: float) -> tuple[bool, str]:
    """(ready, what it answered): 200 is ready; anything else, or silence, is not."""
    u = urllib.parse.urlsplit(status_url)
    conn_cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(u.hostname or "127.0.0.1", u.port, timeout=timeout_s)
    try:
        conn.request("GET", (u.path or "/") + (f"?{u.query}" if u.query else ""))
        resp = conn.getresponse()
        text = resp.read(300).decode(errors="replace").strip().splitlines()
        return resp.status == 200, f"{resp.status} {text[0] if text else ''}".strip()
    except (OSError, http.client.HTTPException) as e:
        return False, f"unreachable: {type(e).__name__}"
    finally:
        conn.close()


def api_answers(url: str, timeout_s: float) -> bool:
    """The replica's API address takes a connection. A replica restarted on RunPod keeps its status URL
    (the HTTPS proxy's, by pod id) but its TCP port gets a new public port: ready by its status and
    silent at the address the router has is a moved replica, never one to route to."""
    u = urllib.parse.urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", port), timeout=timeout_s):
            return True
    except OSError:
        return False


MOVED = ("its status says ready but its API address {addr} takes no connection: its port moved (a restarted "
         "pod's TCP port gets a new public port) or the address is wrong. Fix: `python build.py pods up --target "
         "T --replicas N --router` again hands the router the replicas' current addresses")


class Feeder:
    def __init__(self, live: Callable[[], DeployConfig], key: Callable[[], str | None],
                 operator_key: Callable[[], str | None] = lambda: None):
        self.live = live
        self.key = key
        self.operator_key = operator_key      # the one key that may change the replicas (control.py)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="kiln-router-probe")
        self._status: dict[str, Any] = {"router_up": False, "routed": 0, "replicas": [], "checked_at": None}
        self._checked_mono: float | None = None
        self._was: dict[str, bool] = {}          # replica -> routed at the last round (for the log)
        self.front: Front | None = None
        self.front_error: str | None = None
        self._serving = False                    # the supervisor's word: the router process is SERVING
        self._leaving = False                    # ... and it is on its way out (stopping, stopped, failed)
        self._draining = False                   # stopping from SERVING: smg takes requests while it accepts
        self._pushed = pushed.Pushed(lambda: self.live().state_dir)
        self._adds: dict[str, int] = {}          # replica -> rounds in a row smg was told to add it
        self._unadopted: dict[str, str] = {}     # replica -> why smg has not taken it, after ADOPT_ROUNDS

    def start(self) -> None:
        self._pushed.load()
        self._open_front()
        self._thread = threading.Thread(target=self._run, name="kiln-router-feeder", daemon=True)
        self._thread.start()

    def _open_front(self) -> None:
        """Clients' port: the gate in front of smg (front.py), open while a replica is routed."""
        cfg = self.live()
        front = Front(cfg.server.host, cfg.server.port, lambda: self.live().router.engine_port, self.routable,
                      control=lambda client: control.serve(client, self.key(), self.push,
                                                           operator=self.operator_key()),
                      hold=self.worth_holding)
        try:
            front.start()
        except OSError as e:
            self.front_error = f"the router's port {cfg.server.port} cannot be opened: {e.strerror or e}"
            log.error("router: %s; clients cannot reach it", self.front_error)
            return
        self.front = front

    def stop(self) -> None:
        """After the engine stopped (the loop stops it first): what smg did not finish is closed now."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.front is not None:
            self.front.stop()

    def router_state(self, serving: bool, leaving: bool = False) -> None:
        """The router process changed state (the loop's news): out of SERVING, what the feeder saw of
        the old process no longer holds (a new smg starts with no workers); into SERVING, a round now,
        so the replicas are back in the new process within one round instead of one poll."""
        # Stopping from SERVING: smg finishes what it has and, for load balancers, keeps taking requests
        # for a few seconds after TERM; while it still accepts, new clients go to it too (issue 50 item 7:
        # the gate answered 503 from the first moment of a stop, ~5 s of failed requests a restart).
        self._draining = leaving and (self._serving or self._draining) and self.routable()
        self._serving = serving
        self._leaving = leaving
        if not serving:
            with self._lock:
                self._status = {**self._status, "routed": 0,
                                "replicas": [{**r, "routed": False} for r in self._status["replicas"]]}
        self._wake.set()

    # -- the replicas: the config's, or a list pushed in place (pushed.py) ---------------------------
    def replicas(self) -> tuple[ReplicaSpec, ...]:
        return self._pushed.replicas(self.live().router.replicas)

    def push(self, value: str) -> list[dict[str, str]]:
        """A new replica list (KILN_ROUTER_REPLICAS' form) in place of the config's, from control.py:
        ValueError names what is wrong with it."""
        new = pushed.parse(value)
        self._pushed.push(new, self.live().router.replicas)
        self._wake.set()
        return [{"url": r.url, "status_url": r.status_url} for r in new]

    # -- what the loop's pages read -------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        with self._lock:
            out = {**self._status, "replicas": [dict(r) for r in self._status["replicas"]]}
        if self.front_error:
            out["error"] = self.front_error
        if self.front is not None:
            st = self.front.status()
            out["front"] = {k: st[k] for k in ("port", "open", "connections", "answered_503_total", "held_total")}
        since = self._pushed.since(self.live().router.replicas)
        out["replicas_from"] = "config" if since is None else \
            f"pushed at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(since))}"
        return out

    def worth_holding(self) -> bool:
        """A client at the closed gate may wait for it to open (front.py): the router is starting,
        restarting its smg or reloading, not on its way out."""
        return not (self._leaving or self._stop.is_set())

    def routable(self) -> bool:
        """The router SERVING (not starting, reloading or stopping), at least one replica routed, seen
        recently (a feeder that stopped looking knows nothing), and the clients' port open."""
        if self.front_error:
            return False
        if self._draining:
            return self._smg_accepts()
        if not self._serving:
            return False
        cfg = self.live().router
        with self._lock:
            fresh = self._checked_mono is not None and \
                time.monotonic() - self._checked_mono <= 3 * cfg.poll_s + 2 * cfg.probe_timeout_s + 2.0
            return fresh and self._status["routed"] > 0

    def _smg_accepts(self) -> bool:
        """smg's own port still takes a connection (it holds its listener a while after TERM)."""
        try:
            with socket.create_connection(("127.0.0.1", self.live().router.engine_port), timeout=0.2):
                return True
        except OSError:
            return False

    # -- the rounds -----------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.round()
            except Exception as e:  # noqa: BLE001 - a bad round is logged; the next one tries again
                log.warning("router feeder: %s: %s", type(e).__name__, e)
            cfg = self.live().router
            self._wake.wait(max(0.0, cfg.poll_s - (time.monotonic() - started)))
            self._wake.clear()

    def round(self) -> None:
        cfg = self.live()
        spec, key, replicas = cfg.router, self.key(), self.replicas()
        answers = list(self._pool.map(lambda r: self._probe(r, spec.probe_timeout_s), replicas))
        ready = {r.url: ok for r, (ok, _) in zip(replicas, answers)}
        smg = Smg("127.0.0.1", spec.engine_port, key, timeout_s=spec.probe_timeout_s)
        error = None
        try:
            workers = smg.workers()
            plan = reconcile(ready, workers)
            self._apply(smg, plan, key)
            if plan.add or plan.remove:
                workers = self._settled(smg, plan.add)
        except RouterUnavailable as e:
            workers, error = None, str(e)
        if not replicas and error is None:
            error = "no replicas configured: [[router.replicas]] in the deploy config, or KILN_ROUTER_REPLICAS"
        self._record(replicas, answers, ready, workers, error)

    @staticmethod
    def _probe(r: ReplicaSpec, timeout_s: float) -> tuple[bool, str]:
        ok, said = probe(r.status_url, timeout_s)
        if ok and r.url != r.status_url and not api_answers(r.url, timeout_s):
            u = urllib.parse.urlsplit(r.url)
            return False, MOVED.format(addr=f"{u.hostname}:{u.port}")
        return ok, said

    def _settled(self, smg: Smg, added: tuple[str, ...]) -> list[Worker]:
        """smg's list once this round's adds are ready (~50 ms, measured), so a replica is routed in the
        round that saw it ready; at most one second, then the next round looks again."""
        deadline = time.monotonic() + 1.0
        while True:
            workers = smg.workers()
            ready = {w.url.rstrip("/") for w in workers if w.status == "ready"}
            if all(u.rstrip("/") in ready for u in added) or time.monotonic() > deadline:
                return workers
            self._stop.wait(0.02)

    def _apply(self, smg: Smg, plan: Any, key: str | None) -> None:
        for w in plan.remove:
            ok, said = smg.remove(w.id)
            log.info("router: %s is not a ready replica: removed (%s)", w.url, said if not ok else "draining")
        for url in set(self._adds) - set(plan.add):
            self._adds.pop(url, None)              # taken (or no longer ready): counted afresh next time
            self._unadopted.pop(url, None)
        for url in plan.add:
            ok, said = smg.add(url, key)
            n = self._adds[url] = self._adds.get(url, 0) + 1
            if n == 1:
                log.info("router: replica %s is ready: added", url) if ok else \
                    log.warning("router: adding replica %s failed: %s", url, said)
            elif n == ADOPT_ROUNDS:                # said once, on /status too, not at every poll
                why = (f"smg was told to add it {n} rounds in a row and has not taken it (its last answer: "
                       f"{said if not ok else 'accepted'}): check that the replica's API answers at {url} with "
                       "the router's key, and that it serves the model the others do")
                self._unadopted[url] = why
                log.warning("router: replica %s is ready but not routed: %s", url, why)

    def _record(self, replicas: tuple[ReplicaSpec, ...], answers: list[tuple[bool, str]], ready: dict[str, bool],
                workers: list[Worker] | None, error: str | None) -> None:
        live = set(routed(ready, workers or []))
        by_url = {w.url.rstrip("/"): w.status for w in workers or []}
        rows = [{"url": r.url, "status_url": r.status_url, "ready": ok, "answer": said, "routed": r.url in live,
                 "worker": by_url.get(r.url), **({"not_taken": self._unadopted[r.url]} if r.url in self._unadopted
                                                 and r.url not in live else {})}
                for r, (ok, said) in zip(replicas, answers)]
        if error is None and any("not_taken" in row for row in rows):
            error = "; ".join(f"replica {row['url']}: {row['not_taken']}" for row in rows if "not_taken" in row)
        for row in rows:
            if self._was.get(row["url"], False) != row["routed"]:
                log.info("router: replica %s %s (%s)", row["url"], "routed" if row["routed"] else "not routed",
                         row["answer"])
                self._was[row["url"]] = row["routed"]
        with self._lock:
            self._status = {"router_up": workers is not None, "routed": len(live), "replicas": rows,
                            "checked_at": round(time.time(), 3), "error": error}
            self._checked_mono = time.monotonic()
