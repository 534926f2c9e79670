"""The router's public port: a gate in front of smg that opens only while a replica is routed.

smg answers `404 model_not_found` ("No worker available for model ...") while it has no workers
(measured on 1.13.0): a new or restarted smg says so to every client until the feeder has given it
replicas, and a client reads a 404 as final. So smg listens on 127.0.0.1:[router] engine_port and
clients reach it through this relay on [server] host:port (issue 37 item 16):

    no replica routed (starting, restarting, stopping, every replica out)
        -> 503 with Retry-After: 1, which clients and load balancers retry, then a close
    a replica routed -> the connection is relayed to smg byte for byte (streams, keep-alive)

The gate is asked once per connection, when it is accepted: a keep-alive connection opened while a
replica was routed stays with smg, which answers for itself if every replica leaves later. On stop
the gate closes at once (the supervisor leaves SERVING) while smg finishes the requests already on
it; the relay closes what is left only after smg stopped. The relay is status/relay.py's TcpRelay
(its connection cap, idle sweep and descriptor budget) with the gate in front of its admission.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Callable

from ..status.relay import TcpRelay

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


class Front(TcpRelay):
    """A TcpRelay whose admission asks `gate()` first: closed, the client gets CLOSED and a close."""

    def __init__(self, listen_host: str, listen_port: int, engine_port: int | Callable[[], int],
                 gate: Callable[[], bool]):
        super().__init__(listen_host, listen_port, "127.0.0.1", engine_port)
        self.gate = gate
        self.closed_total = 0

    def _admit(self, client: socket.socket) -> None:
        if self.gate():
            super()._admit(client)
            return
        self.closed_total += 1
        try:          # in a thread of its own: a client slow to send its request never holds accept()
            threading.Thread(target=_answer_closed, args=(client,), name="kiln-router-503", daemon=True).start()
        except RuntimeError:
            _answer_closed(client, wait_s=0.0)

    def status(self) -> dict[str, object]:
        return {**super().status(), "open": self.gate(), "answered_503_total": self.closed_total}
