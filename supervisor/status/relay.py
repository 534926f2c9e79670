"""A plain TCP relay from a second port to the engine's port.

RunPod's HTTP proxy sits behind Cloudflare and cuts a request at ~125 s (`error code: 524`):
a cold prefill of a long prompt cannot finish through it. A TCP port is reached directly on the
pod's public IP, without the proxy. RunPod maps a port as HTTP or as TCP, not both, so the engine
keeps its HTTP port for the proxy and this relay gives the same server a TCP port. Bytes are
copied as they are: TLS, keep-alive and streaming pass through untouched, and the engine's own
API key still guards every request.

The relay runs inside PID 1 and every connection costs it two descriptors and two threads before
any key is checked, so (issue 18):
- connections are capped (beyond the cap a client gets a 503 and a close, not a hang);
- a connection nobody uses is closed on both sides: no byte either way for `idle_s` once the
  engine has answered, or the client not closing after the engine closed its side (llama-server
  ends an idle keep-alive after 5 s). A request the engine has not answered is never idle: a cold
  38k prefill took ~230 s with nothing on the wire (field notes
  § "Prefill and the RunPod proxy"), and the engine's own timeouts and
  the supervisor's health checks end one that never will;
- a failed accept() (EMFILE) or a thread that cannot start is logged once per burst, backed
  off, and the relay keeps accepting; both sockets are released on every path;
- status() says whether it is listening and what it holds, for /status.
"""

from __future__ import annotations

import logging
import resource
import socket
import threading
import time
from typing import Any, Callable

from .listen import AcceptErrors

log = logging.getLogger("kiln.relay")

DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_IDLE_S = 600.0
_CHUNK = 1 << 16
_CONNECT_TIMEOUT_S = 10.0
_TICK_S = 0.5  # the accept loop wakes this often: it sweeps idle connections then
_AFTER_ENGINE_CLOSED_S = 10.0  # the client's time to close after the engine closed its side
_STOP_DRAIN_S = 2.0  # stop() waits this long for connection threads to release their sockets
# TCP keep-alive on client sockets: a client that vanished (no FIN, no RST) is found in ~2 min,
# even while the engine still works on its request.
_KEEPALIVE = (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6))
_REFUSAL_BODY = b"kiln relay: too many connections; retry shortly\n"
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_REFUSAL_BODY), _REFUSAL_BODY))


class _Conn:
    """One relayed connection: its sockets, and when bytes last moved each way (monotonic)."""

    def __init__(self, client: socket.socket):
        self.client = client
        self.upstream: socket.socket | None = None
        self.to_engine_at = 0.0
        self.to_client_at = time.monotonic()
        self.engine_done_at: float | None = None  # nothing more will reach the client
        self.closing = False

    def idle(self, now: float, idle_s: float) -> str | None:
        """Why the sweep should close this connection now, or None."""
        if self.engine_done_at is not None and now - self.engine_done_at > _AFTER_ENGINE_CLOSED_S:
            return "the engine closed its side and the client did not"
        if self.to_engine_at > self.to_client_at:
            return None  # the engine owes an answer (a long prefill sends nothing for minutes)
        if now - self.to_client_at > idle_s:
            return "idle"
        return None

    def shut(self) -> None:
        """Wake both pump threads; the connection's own thread closes the sockets. Call with the
        relay's lock held, while the connection is still registered."""
        self.closing = True
        for s in (self.client, self.upstream):
            if s is not None:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class TcpRelay:
    def __init__(self, listen_host: str, listen_port: int, target_host: str,
                 target_port: int | Callable[[], int], *, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 idle_s: float = DEFAULT_IDLE_S):
        self.listen = (listen_host, listen_port)
        # A wildcard listen address still reaches the engine on loopback.
        self.target_host = "127.0.0.1" if target_host in ("0.0.0.0", "::", "") else target_host
        # A callable follows the engine's port across config reloads.
        self.target_port = target_port
        self.max_connections = max_connections
        self.idle_s = idle_s
        self._server: socket.socket | None = None
        self._bound_port = listen_port
        self._thread: threading.Thread | None = None
        self._conns: set[_Conn] = set()
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._stopped = threading.Event()
        self._errors = AcceptErrors("TCP relay", log)
        self._connect_errors = AcceptErrors("TCP relay: connecting to the engine", log)
        self._at_cap = False
        self.accepted_total = self.refused_total = self.idle_closed_total = 0

    @property
    def port(self) -> int:
        """The port it listens on (port 0 picks one: read it back here after start())."""
        return self._bound_port

    def start(self) -> None:
        """Bind and accept in a daemon thread; raises OSError when the port cannot be bound."""
        srv = socket.create_server(self.listen, reuse_port=False, backlog=128)
        srv.settimeout(_TICK_S)  # so stop() and the idle sweep need no wake-up connection
        self.max_connections = _within_descriptor_budget(self.max_connections)
        self._server = srv
        self._bound_port = srv.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, args=(srv,), name="kiln-relay", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            self._server = None
            srv.close()
            raise

    def stop(self) -> None:
        """Stop accepting, close every connection on both sides; safe to call twice."""
        self._stopped.set()
        srv, thread = self._server, self._thread
        if srv is not None:
            try:
                srv.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept(); the loop closes it
            except OSError:
                pass
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._lock:
            for conn in self._conns:
                conn.shut()
            self._drained.wait_for(lambda: not self._conns, _STOP_DRAIN_S)

    def status(self) -> dict[str, Any]:
        """The relay's health for /status: a relay that stopped accepting says so here."""
        with self._lock:
            open_now = len(self._conns)
        newest = max((self._errors, self._connect_errors), key=lambda e: e.last_at or 0.0)
        return {
            "listening": bool(self._thread and self._thread.is_alive() and not self._stopped.is_set()),
            "port": self._bound_port,
            "connections": open_now,
            "max_connections": self.max_connections,
            "idle_s": self.idle_s,
            "accepted_total": self.accepted_total,
            "refused_total": self.refused_total,
            "idle_closed_total": self.idle_closed_total,
            "accept_errors": self._errors.total,       # accept() failed or a thread would not start
            "connect_errors": self._connect_errors.total,  # reaching the engine failed (not: refused)
            "last_error": newest.last,
            "last_error_at": newest.last_at,
        }

    # -- accepting -----------------------------------------------------------------------------

    def _accept_loop(self, srv: socket.socket) -> None:
        next_sweep = time.monotonic() + _TICK_S
        try:
            while not self._stopped.is_set():
                now = time.monotonic()
                if now >= next_sweep:
                    self._sweep(now)
                    next_sweep = now + _TICK_S
                try:
                    client, _ = srv.accept()
                except socket.timeout:
                    continue
                except OSError as e:
                    if self._stopped.is_set():
                        break
                    # EMFILE/ENFILE/ENOBUFS: the connection stays queued, so retrying at once spins.
                    self._stopped.wait(self._errors.failed(e))
                    continue
                self._errors.succeeded()
                self._admit(client)
        finally:
            srv.close()

    def _admit(self, client: socket.socket) -> None:
        with self._lock:
            full = len(self._conns) >= self.max_connections
            if not full:
                conn = _Conn(client)
                self._conns.add(conn)
                self._at_cap = False
        if full:
            self._refuse(client)
            return
        _keepalive(client)
        try:
            threading.Thread(target=self._serve, args=(conn,), name="kiln-relay-conn", daemon=True).start()
        except RuntimeError as e:  # can't start new thread: the client is closed, nothing leaks
            self._forget(conn)
            _close(client)
            self._stopped.wait(self._errors.failed(e))
            return
        self.accepted_total += 1

    def _refuse(self, client: socket.socket) -> None:
        """Over the cap: a 503 the client can read, then a close. Never blocks the accept loop."""
        self.refused_total += 1
        if not self._at_cap:
            self._at_cap = True
            log.warning("TCP relay: %d connections open (the cap): refusing new ones with 503 until one "
                        "closes", self.max_connections)
        try:
            client.setblocking(False)
            client.send(_REFUSAL)
            client.shutdown(socket.SHUT_WR)
            client.recv(_CHUNK)  # what the client already sent: unread, the close would be a reset
        except OSError:
            pass
        finally:
            _close(client)

    def _sweep(self, now: float) -> None:
        # shut() under the lock: a connection's thread forgets it (under the lock) before it
        # closes the sockets, so a shutdown never lands on a closed, possibly reused, descriptor.
        with self._lock:
            for conn in self._conns:
                why = None if conn.closing else conn.idle(now, self.idle_s)
                if why:
                    conn.shut()
                    self.idle_closed_total += 1
                    log.info("TCP relay: closing a connection: %s", why if why != "idle" else
                             f"no bytes either way for {self.idle_s:g} s after the engine answered")

    # -- one connection ------------------------------------------------------------------------

    def _serve(self, conn: _Conn) -> None:
        """Runs in the connection's thread, which alone closes its sockets (on every path)."""
        upstream: socket.socket | None = None
        try:
            port = self.target_port() if callable(self.target_port) else self.target_port
            try:
                upstream = socket.create_connection((self.target_host, port), timeout=_CONNECT_TIMEOUT_S)
            except OSError as e:
                if isinstance(e, ConnectionRefusedError):  # the engine is not up (yet): expected
                    log.debug("relay: engine not reachable at %s:%d (%s)", self.target_host, port, e)
                else:  # EMFILE, a timeout: counted and shown (no back-off for one connection)
                    self._connect_errors.failed(e)
                return
            self._connect_errors.succeeded()
            upstream.settimeout(None)
            conn.upstream = upstream
            if conn.closing or self._stopped.is_set():
                return
            back = threading.Thread(target=self._pump, args=(conn, upstream, conn.client, True),
                                    name="kiln-relay-pump", daemon=True)
            try:
                back.start()
            except RuntimeError as e:
                self._errors.failed(e)
                return
            self._pump(conn, conn.client, upstream, False)
            back.join()
        except Exception:
            log.exception("TCP relay: a connection failed")
        finally:
            self._forget(conn)
            _close(conn.client)
            if upstream is not None:
                _close(upstream)

    def _pump(self, conn: _Conn, src: socket.socket, dst: socket.socket, to_client: bool) -> None:
        """Copy until EOF, then pass the half-close on (HTTP/1.0 clients and streaming rely on it)."""
        try:
            while True:
                data = src.recv(_CHUNK)
                now = time.monotonic()
                if to_client:
                    conn.to_client_at = now
                else:
                    conn.to_engine_at = now  # a request (or its end): the engine owes an answer
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        if to_client:
            conn.engine_done_at = time.monotonic()
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _forget(self, conn: _Conn) -> None:
        with self._lock:
            self._conns.discard(conn)
            self._drained.notify_all()


def _within_descriptor_budget(cap: int) -> int:
    """At most half the process's descriptors go to relayed connections (two each), so a flood
    of clients cannot leave PID 1 without descriptors for its own files, pipes and status port."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return cap
    return max(1, min(cap, soft // 4))


def _keepalive(s: socket.socket) -> None:
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in _KEEPALIVE:
            if hasattr(socket, name):
                s.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    except OSError:
        pass


def _close(s: socket.socket) -> None:
    try:
        s.close()
    except OSError:
        pass
