"""The router's public port: a gate in front of smg that opens only while a replica is routed.

smg answers `404 model_not_found` ("No worker available for model ...") while it has no workers
(measured on 1.13.0): a new or restarted smg says so to every client until the feeder has given it
replicas, and a client reads a 404 as final. So smg listens on 127.0.0.1:[router] engine_port and
clients reach it through this relay on [server] host:port (issue 37 item 16):

    no replica routed while the router starts, restarts its smg or reloads
        -> the connection is held, its request unread, until a replica is routed (then relayed) or
           HOLD_S passes (then 503): a router that comes back within it fails no request (issue 50
           item 7: a restart failed every request for ~5.5 s)
    no replica routed while it stops, or every replica out of service past HOLD_S
        -> 503 with Retry-After: 1, which clients and load balancers retry, then a close
    a replica routed -> the connection is relayed to smg byte for byte (streams, keep-alive)

The gate is asked once per connection, when its request has arrived (peeked, not read): a keep-alive
connection opened while a replica was routed stays with smg, which answers for itself if every
replica leaves later. A request for `PUT /kiln/router/replicas` is Kiln's, never smg's: the router's
replicas changed in place (control.py), open gate or not. On stop
the gate closes at once (the supervisor leaves SERVING) while smg finishes the requests already on
it; the relay closes what is left only after smg stopped. The relay is status/relay.py's TcpRelay
(its connection cap, idle sweep and descriptor budget) with the gate in front of its admission.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Callable

from ..status.relay import TcpRelay
from . import control

_BODY = json.dumps({"error": {"type": "service_unavailable", "code": "no_replica_routed",
                              "message": "the router has no replica routed yet (starting, restarting or every "
                              "replica out of service): retry shortly"}}).encode()
CLOSED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
          b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BODY), _BODY))


def _answer_closed(client: socket.socket, wait_s: float = 2.0) -> None:
    """CLOSED, after reading the request (a close with the request unread would be a reset)."""
    try:
        client.settimeout(wait_s or None)
        if wait_s:
            client.recv(1 << 16)
        client.sendall(CLOSED)
        client.shutdown(socket.SHUT_WR)
        client.recv(1 << 16)
    except OSError:
        pass
    finally:
        try:
            client.close()
        except OSError:
            pass


def _peek(client: socket.socket, prefix: bytes, wait_s: float = 2.0) -> bytes:
    """The client's first bytes, left unread, as far as they may still be `prefix` (a client that
    sends nothing within `wait_s`: what came)."""
    deadline = time.monotonic() + wait_s
    seen = b""
    try:
        client.settimeout(wait_s)
        while len(seen) < len(prefix) and prefix.startswith(seen) and time.monotonic() < deadline:
            if seen:
                time.sleep(0.005)           # part of it came: poll for the rest (a bounded wait)
            got = client.recv(len(prefix), socket.MSG_PEEK)
            if not got:
                break
            seen = got
    except OSError:
        pass
    finally:
        try:
            client.settimeout(None)
        except OSError:
            pass
    return seen


HOLD_S = 15.0            # how long a client waits at a closed gate that may open (see above)
MAX_HELD = 256           # clients held at once; more get the 503 at once
_LOOK_S = 0.05           # how often a held client's gate is looked at


class Front(TcpRelay):
    """A TcpRelay whose admission asks `gate()` first: closed, the client is held while `hold()` says the
    gate may open (at most HOLD_S), else it gets CLOSED and a close. `control(client)` answers a request
    for control.PATH on the socket."""

    def __init__(self, listen_host: str, listen_port: int, engine_port: int | Callable[[], int],
                 gate: Callable[[], bool], control: Callable[[socket.socket], int] | None = None,
                 hold: Callable[[], bool] = lambda: False, hold_s: float = HOLD_S):
        super().__init__(listen_host, listen_port, "127.0.0.1", engine_port)
        self.gate = gate
        self.control = control
        self.hold = hold
        self.hold_s = hold_s
        self.closed_total = 0
        self.held_total = 0
        self._held = 0
        self._held_lock = threading.Lock()

    def _admit(self, client: socket.socket) -> None:
        try:          # in a thread of its own: a client slow to send its request never holds accept()
            threading.Thread(target=self._sort, args=(client,), name="kiln-router-front", daemon=True).start()
        except RuntimeError:
            _answer_closed(client, wait_s=0.0)

    def _sort(self, client: socket.socket) -> None:
        first = _peek(client, control.PREFIX)
        if self.control is not None and control.is_control(first):
            try:
                self.control(client)
            finally:
                try:
                    client.close()
                except OSError:
                    pass
            return
        if self.gate() or self._wait_open():
            TcpRelay._admit(self, client)
            return
        self.closed_total += 1
        _answer_closed(client)

    def _wait_open(self) -> bool:
        """Hold this client (its request unread) while the gate may still open; whether it did."""
        with self._held_lock:
            if self._held >= MAX_HELD or not self.hold():
                return False
            self._held += 1
            self.held_total += 1
        try:
            deadline = time.monotonic() + self.hold_s
            while time.monotonic() < deadline and self.hold() and not self._stopped.is_set():
                if self.gate():
                    return True
                self._stopped.wait(_LOOK_S)      # the polling interval of a condition wait with a deadline
            return self.gate()
        finally:
            with self._held_lock:
                self._held -= 1

    def status(self) -> dict[str, object]:
        return {**super().status(), "open": self.gate(), "answered_503_total": self.closed_total,
                "held_total": self.held_total}
