"""A plain TCP relay from a second port to the engine's port.

RunPod's HTTP proxy sits behind Cloudflare and cuts a request at ~125 s (`error code: 524`):
a cold prefill of a long prompt cannot finish through it. A TCP port is reached directly on the
pod's public IP, without the proxy. RunPod maps a port as HTTP or as TCP, not both, so the engine
keeps its HTTP port for the proxy and this relay gives the same server a TCP port. Bytes are
copied as they are: TLS, keep-alive and streaming pass through untouched, and the engine's own
API key still guards every request.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Callable

log = logging.getLogger("kiln.relay")
_CHUNK = 1 << 16


class TcpRelay:
    def __init__(self, listen_host: str, listen_port: int, target_host: str,
                 target_port: int | Callable[[], int]):
        self.listen = (listen_host, listen_port)
        # A wildcard listen address still reaches the engine on loopback.
        self.target_host = "127.0.0.1" if target_host in ("0.0.0.0", "::", "") else target_host
        # A callable follows the engine's port across config reloads.
        self.target_port = target_port
        self._server: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.getsockname()[1]

    def start(self) -> None:
        srv = socket.create_server(self.listen, reuse_port=False)
        srv.settimeout(0.5)              # so stop() is noticed without a wake-up connection
        self._server = srv
        threading.Thread(target=self._accept_loop, name="kiln-relay", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.close()
        with self._lock:
            for s in list(self._conns):
                _close(s)
            self._conns.clear()

    def _accept_loop(self) -> None:
        assert self._server is not None
        while not self._stopped.is_set():
            try:
                client, _ = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return                   # closed by stop()
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        port = self.target_port() if callable(self.target_port) else self.target_port
        try:
            upstream = socket.create_connection((self.target_host, port), timeout=10)
        except OSError as e:
            log.debug("relay: engine not reachable at %s:%d (%s)", self.target_host, port, e)
            _close(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self._conns.update((client, upstream))
        t = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        t.start()
        _pump(client, upstream)
        t.join()
        with self._lock:
            self._conns.difference_update((client, upstream))
        _close(client)
        _close(upstream)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy until EOF, then pass the half-close on (HTTP/1.0 clients and streaming rely on it)."""
    try:
        while True:
            data = src.recv(_CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _close(s: socket.socket) -> None:
    try:
        s.close()
    except OSError:
        pass
