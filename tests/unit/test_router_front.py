"""The router's gate (supervisor/router/front.py) on real sockets, without smg: a client at a closed gate
is held while the router may still route (starting, restarting smg, reloading), relayed the moment it
does, and answered 503 (retryable) once the hold ends or the router is on its way out (issue 50 item 7)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

from supervisor.router.front import Front


def _backend() -> tuple[socket.socket, int]:
    """A one-shot HTTP server standing in for smg: answers 200 "relayed"."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.recv(65536)
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nrelayed")
            c.close()
    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def _ask(port: int) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", body=b"{}")
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_a_client_is_held_until_the_gate_opens_then_relayed():
    srv, smg = _backend()
    opened = threading.Event()
    front = Front("127.0.0.1", 0, smg, gate=opened.is_set, hold=lambda: True, hold_s=30)
    front.start()
    try:
        threading.Timer(0.3, opened.set).start()
        start = time.monotonic()
        code, body = _ask(front.port)
        assert code == 200 and body == b"relayed" and time.monotonic() - start >= 0.25
        assert front.status()["held_total"] == 1 and front.status()["answered_503_total"] == 0
    finally:
        front.stop()
        srv.close()


def test_a_gate_that_stays_closed_or_a_router_on_its_way_out_answers_503():
    srv, smg = _backend()
    leaving = threading.Event()
    front = Front("127.0.0.1", 0, smg, gate=lambda: False, hold=lambda: not leaving.is_set(), hold_s=0.3)
    front.start()
    try:
        code, body = _ask(front.port)                           # held 0.3 s, then the 503
        assert code == 503 and json.loads(body)["error"]["code"] == "no_replica_routed"
        leaving.set()
        start = time.monotonic()
        assert _ask(front.port)[0] == 503 and time.monotonic() - start < 0.25    # at once: nothing to wait for
        assert front.status()["answered_503_total"] == 2 and front.status()["held_total"] == 1
    finally:
        front.stop()
        srv.close()
