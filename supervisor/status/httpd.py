"""The status endpoint's HTTP server, built so that no client can silence it.

The stdlib's threading server gave each connection a worker and a timeout per read: 32 clients
that sent nothing, or a byte every few seconds, held all 32 workers, and /live and /ready stopped
answering for as long as they stayed (issue 24); a failing /live gets a healthy pod restarted.
Here one thread owns every socket (selectors):

- it accepts, and reads each request without blocking; a connection has ONE deadline for its whole
  request (REQUEST_S from accept, not per read), then it is closed. Waiting costs a descriptor and
  a few bytes, never a thread; past MAX_CONNECTIONS the oldest still reading is closed for the new;
- the answer is made by the owner's `respond(request)`: at once on this thread for the `now` lane
  (what needs no snapshot: /live, 404, 405), else in a small pool per lane (`probe` for /ready,
  `page` for the rest), so a slow render never holds the probes, and no client ever holds a pool
  thread (it only renders; this thread writes);
- it writes the answer without blocking, WRITE_S at most, and closes (HTTP/1.0: one request per
  connection, `Connection: close`);
- HEAD is GET without the body, on every path: same status, same headers, Content-Length included.

A failed accept (EMFILE) is backed off as the TCP relay does (listen.AcceptErrors) and closes the
oldest waiting connection, which frees a descriptor for the probes. Stdlib only.
"""

from __future__ import annotations

import collections
import email.utils
import errno
import logging
import queue
import selectors
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Callable

from .listen import AcceptErrors

__all__ = ["HttpServer", "Request", "Response", "REQUEST_S", "WRITE_S", "MAX_CONNECTIONS"]

REQUEST_S = 10.0          # from accept to the end of the request's head, whatever the pace of its bytes
WRITE_S = 10.0            # from the answer being ready to its last byte accepted by the kernel
MAX_CONNECTIONS = 512     # open at once; the oldest still reading goes first
MAX_HEAD = 16 * 1024      # request line and headers; more is a 431
BACKLOG = 1024            # the stdlib's 5 lost SYNs under 200 clients (issue 18); capped by somaxconn
LANES = {"probe": 1, "page": 2}   # pool threads per lane; "now" answers on the loop thread
_ACCEPT_BURST = 64        # accepts per wake, so reading goes on under a flood of connects
_TICK_S = 0.5             # the loop looks at deadlines at least this often
_RECV = 4096


@dataclass(frozen=True)
class Request:
    method: str               # as sent ("GET", "HEAD", "BREW")
    target: str               # the request target ("/status?pretty=1")
    client: str               # the peer's address, for the log


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


class _Conn:
    __slots__ = ("sock", "client", "started", "deadline", "buf", "out", "request", "phase")

    def __init__(self, sock: socket.socket, client: str, now: float):
        self.sock = sock
        self.client = client
        self.started = now
        self.deadline = now + REQUEST_S
        self.buf = bytearray()
        self.out = memoryview(b"")
        self.request: Request | None = None
        self.phase = "read"           # read -> answer (in a pool) -> write -> closed


class HttpServer:
    """Serve `respond` on `address`. `lane(request)` says where it is answered: "now" (this thread),
    or a pool name of LANES. Bound when constructed (OSError as socket.bind raises it)."""

    def __init__(self, address: tuple[str, int], *, respond: Callable[[Request], Response],
                 lane: Callable[[Request], str], log: logging.Logger, name: str = "status endpoint"):
        self._respond = respond
        self._lane = lane
        self._log = log
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET   # "::" or another IPv6 literal
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as http.server does
            self._listener.bind(address)
            self._listener.listen(BACKLOG)
            self._listener.setblocking(False)
        except BaseException:
            self._listener.close()
            raise
        self.address = self._listener.getsockname()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._listening = True
        self._paused_until = 0.0
        self._conns: collections.OrderedDict[int, _Conn] = collections.OrderedDict()   # by fd, oldest first
        self._answers: queue.SimpleQueue[tuple[_Conn, Response]] = queue.SimpleQueue()
        self._pools = {lane: ThreadPoolExecutor(n, thread_name_prefix=f"kiln-status-{lane}")
                       for lane, n in LANES.items()}
        self._accept_errors = AcceptErrors(name, log)
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self.expired_total = 0       # connections closed at their deadline (for tests and /status)

    # -- the owner's side --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kiln-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Close everything; the listener is closed when this returns."""
        self._closing.set()
        self._wake()
        if self._thread is not None:
            self._thread.join()
        else:
            self._close_all()
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)

    def connections(self) -> int:
        return len(self._conns)

    # -- the loop ------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closing.is_set():
                try:
                    self._once()
                except Exception:       # a bug here must not silence the endpoint: log, go on
                    self._log.exception("status: the server loop failed; it goes on")
                    self._closing.wait(0.05)
        finally:
            self._close_all()

    def _once(self) -> None:
        now = time.monotonic()
        deadlines = [c.deadline for c in self._conns.values()]
        if not self._listening:
            deadlines.append(self._paused_until)
        # Nothing with a deadline: whatever else needs the loop (an answer from a pool, stop) writes to
        # the wake pipe, so it sleeps until a client comes instead of waking twice a second for nothing
        # (on the CPU machine's VM, 2026-12-02, a thread that waits with a timeout is charged ~0.5 % of
        # a CPU however rarely it wakes; one that waits without one, nothing)
        timeout = min(_TICK_S, max(0.0, min(deadlines) - now)) if deadlines else None
        for key, mask in self._sel.select(timeout):
            if key.data == "listen":
                self._accept()
            elif key.data == "wake":
                self._drain_wake()
            else:
                conn: _Conn = key.data
                try:
                    if mask & selectors.EVENT_READ and conn.phase == "read":
                        self._read(conn)
                    if mask & selectors.EVENT_WRITE and conn.phase == "write":
                        self._write(conn)
                except Exception:
                    self._log.exception("status: request from %s failed", conn.client)
                    self._close(conn)
        self._take_answers()
        self._expire(time.monotonic())
        if not self._listening and time.monotonic() >= self._paused_until and not self._closing.is_set():
            self._sel.register(self._listener, selectors.EVENT_READ, "listen")
            self._listening = True

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BURST):
            try:
                sock, addr = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in (errno.ECONNABORTED, errno.EPROTO):   # that client is gone; the next waits
                    continue
                # EMFILE and friends: the connection stays queued, so accepting again at once spins.
                # Pause the listener, and free a descriptor from the oldest client still waiting.
                self._paused_until = time.monotonic() + self._accept_errors.failed(e)
                self._sel.unregister(self._listener)
                self._listening = False
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    self._evict_oldest_reading()
                return
            self._accept_errors.succeeded()
            sock.setblocking(False)
            client = addr[0] if isinstance(addr, tuple) else str(addr)
            if len(self._conns) >= MAX_CONNECTIONS:
                self._evict_oldest_reading()
            conn = _Conn(sock, client, time.monotonic())
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(_RECV)
        except BlockingIOError:
            return
        except OSError as e:
            self._gone(conn, e)
            return
        if not chunk:
            if conn.buf:
                self._log.info("status: client %s went away mid-request (EOF)", conn.client)
            self._close(conn)
            return
        conn.buf += chunk
        end = _head_end(conn.buf)
        if end < 0:
            if len(conn.buf) > MAX_HEAD:
                self._reply_now(conn, Request("?", "?", conn.client),
                                _plain(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large\n"))
            return
        line = bytes(conn.buf[:end]).split(b"\n", 1)[0].rstrip(b"\r").decode("latin-1")
        parts = line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._reply_now(conn, Request("?", line[:200], conn.client), _plain(HTTPStatus.BAD_REQUEST, "bad request\n"))
            return
        conn.request = Request(parts[0], parts[1], conn.client)
        conn.buf = bytearray()
        self._sel.unregister(conn.sock)        # nothing more is read from it
        lane = self._lane(conn.request)
        if lane == "now":
            self._reply_now(conn, conn.request, self._respond(conn.request), registered=False)
            return
        conn.phase = "answer"
        conn.deadline = time.monotonic() + WRITE_S      # the render gets as long as a write
        future = self._pools[lane].submit(self._respond, conn.request)
        future.add_done_callback(lambda f, c=conn: self._answered(c, f))

    def _answered(self, conn: _Conn, future: Future[Response]) -> None:
        # A pool thread: hand the answer to the loop, which owns the socket.
        if future.cancelled():
            return
        exc = future.exception()
        response = _plain(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error\n") if exc else future.result()
        if exc:
            self._log.error("status: answering %s failed: %s", conn.request, type(exc).__name__)
        self._answers.put((conn, response))
        self._wake()

    def _take_answers(self) -> None:
        while True:
            try:
                conn, response = self._answers.get_nowait()
            except queue.Empty:
                return
            if conn.phase == "answer":               # not closed at its deadline meanwhile
                assert conn.request is not None
                self._reply_now(conn, conn.request, response, registered=False)

    def _reply_now(self, conn: _Conn, request: Request, response: Response, *, registered: bool = True) -> None:
        data = _encode(request.method, response)
        self._log.debug("%s \"%s %s\" %d", conn.client, request.method, request.target, response.status)
        conn.out = memoryview(data)
        conn.phase = "write"
        conn.deadline = time.monotonic() + WRITE_S
        if registered:
            self._sel.unregister(conn.sock)
        self._write(conn)
        if conn.phase == "write":                      # the kernel took part of it: wait to write more
            self._sel.register(conn.sock, selectors.EVENT_WRITE, conn)

    def _write(self, conn: _Conn) -> None:
        while conn.out:
            try:
                sent = conn.sock.send(conn.out)
            except BlockingIOError:
                return
            except OSError as e:
                self._gone(conn, e)
                return
            conn.out = conn.out[sent:]
        self._close(conn)

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            self.expired_total += 1
            self._log.debug("status: client %s closed at its deadline (%s)", conn.client, conn.phase)
            self._close(conn)

    def _evict_oldest_reading(self) -> None:
        for conn in self._conns.values():            # oldest first
            if conn.phase == "read":
                self._log.debug("status: client %s closed to make room", conn.client)
                self._close(conn)
                return

    def _gone(self, conn: _Conn, e: OSError) -> None:
        if isinstance(e, (ConnectionError, TimeoutError)):
            self._log.info("status: client %s went away mid-request (%s)", conn.client, type(e).__name__)
        else:
            self._log.warning("status: client %s: %s", conn.client, e)
        self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if conn.phase == "closed":
            return
        if conn.phase in ("read", "write"):
            try:
                self._sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        conn.phase = "closed"
        self._conns.pop(conn.sock.fileno(), None)
        conn.sock.close()

    def _close_all(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn)
        self._sel.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:        # full (a wake is already pending) or closed (stopping): either is fine
            pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass


def _head_end(buf: bytearray) -> int:
    """Index just past the request's head (the blank line), or -1 while it is incomplete."""
    for sep in (b"\r\n\r\n", b"\n\n"):
        i = buf.find(sep)
        if i >= 0:
            return i + len(sep)
    return -1


def _plain(status: HTTPStatus, text: str) -> Response:
    return Response(int(status), "text/plain; charset=utf-8", text.encode("utf-8"))


def _encode(method: str, response: Response) -> bytes:
    try:
        reason = HTTPStatus(response.status).phrase
    except ValueError:
        reason = ""
    # 204 carries no content, so neither its type nor a length (RFC 9110 8.6: MUST NOT send Content-Length)
    content = [] if response.status == 204 else [f"Content-Type: {response.content_type}",
                                                 f"Content-Length: {len(response.body)}"]
    head = [f"HTTP/1.0 {response.status} {reason}", "Server: kiln-supervisor",
            f"Date: {email.utils.formatdate(usegmt=True)}", *content, "Cache-Control: no-store", "Connection: close",
            *(f"{k}: {v}" for k, v in response.headers)]
    data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
    return data if method == "HEAD" or response.status == 204 else data + response.body
