"""The Hub stand-in's HTTP layer: a stdlib ThreadingHTTPServer on loopback, keep-alive like the
real Hub, and `HubServer`, the object tests hold, with its knobs (failures, truncations, offline)
and its request log. Routes live in api.py, data in store.py."""

from __future__ import annotations

import socket
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from .api import HOUSEKEEPING, Api, HubError, Request, Response, clean_path, valid_repo_id
from .store import CHUNK, RepoKey, Store

TEST_TOKEN = "hf_kilnStandInTestTokenNotASecret0000"
TEST_USER = "kiln-test"


@dataclass(frozen=True)
class RequestRecord:
    """One request as the server saw it (never the Authorization header)."""

    method: str
    path: str
    route: str
    status: int
    range: str | None


@dataclass
class _Failure:
    remaining: int
    status: int
    path_prefix: str | None


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # so set_offline(False) can listen on the same port again
    request_queue_size = 128  # a parallel downloader opens dozens of connections at once (the default is 5)

    def __init__(self, port: int, hub: HubServer) -> None:
        self.hub = hub
        super().__init__(("127.0.0.1", port), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):   # a client that hung up is no server error
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like the real Hub; every answer has a Content-Length
    server_version = "kiln-hub-standin"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.hub._track(self.connection, True)

    def finish(self) -> None:
        self.server.hub._track(self.connection, False)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # quiet tests, and nothing that could ever include a token

    def do_GET(self) -> None:
        self._handle()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_GET

    def _handle(self) -> None:
        hub = self.server.hub
        body = self._read_body()
        split = urlsplit(self.path)
        raw = split.path.strip("/")
        segs = [unquote(s) for s in raw.split("/")] if raw else []
        req = Request(self.command, unquote(split.path), segs, parse_qs(split.query), self.headers, body)
        route, resp, cut, flip = hub._answer(req)
        try:
            self._send(route, resp, cut, flip)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away mid-answer; nothing to tell it
        hub._answered(req)

    def _read_body(self) -> bytes:
        # Always drain the body, even for answers that ignore it: keep-alive needs the stream aligned.
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes:
        parts = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline().strip():  # trailers
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()

    def _send(self, route: str, resp: Response, cut_after: int | None, flip_at: int | None) -> None:
        self.send_response(resp.status)
        for name, value in resp.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(resp.length if resp.streamed else len(resp.body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if not resp.streamed:
            self.wfile.write(resp.body)
            return
        remaining = resp.length if cut_after is None else min(cut_after, resp.length)
        sent = 0
        for chunk in self._body(resp):
            chunk = chunk[:remaining - sent]
            if not chunk:
                break
            if flip_at is not None and sent <= flip_at < sent + len(chunk):
                i = flip_at - sent   # one wrong byte on the wire: what only a content hash can catch
                chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1:]
            self.wfile.write(chunk)
            sent += len(chunk)
            self.server.hub._served(route, len(chunk))
        if cut_after is not None:
            # Hang up with the body short of its Content-Length: the client sees a broken transfer.
            self.close_connection = True

    @staticmethod
    def _body(resp: Response) -> Iterator[bytes]:
        if resp.chunks is not None:
            yield from resp.chunks()
            return
        assert resp.file is not None
        with resp.file.open("rb") as f:
            f.seek(resp.start)
            left = resp.length
            while left > 0:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    return
                left -= len(chunk)
                yield chunk


class HubServer:
    """The huggingface.co stand-in: ``with HubServer(tmp_path) as hub: ...`` then use ``hub.url``."""

    def __init__(self, root: str | Path | None = None, *, token: str = TEST_TOKEN, user: str = TEST_USER) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if root is None:  # no directory given: a temporary one, removed by stop()
            self._tmp = tempfile.TemporaryDirectory(prefix="hubserver-")
            root = self._tmp.name
        self.root = Path(root)
        self.token = token
        self.user = user
        self.store = Store(self.root)
        self._api = Api(self.store, lambda: self.url, token, user)
        self._lock = threading.Lock()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port = 0
        self._conns: set[socket.socket] = set()
        self._failures: list[_Failure] = []
        self._truncations: list[int] = []
        self._corruptions: list[int] = []
        self._after: list[tuple[str, str, Callable[[], None]]] = []
        self.counts: Counter[str] = Counter()
        self.bytes_served: Counter[str] = Counter()
        self.log: list[RequestRecord] = []

    # -- lifecycle

    @property
    def url(self) -> str:
        if not self._port:
            raise RuntimeError("HubServer is not started")
        return f"http://127.0.0.1:{self._port}"

    @property
    def offline(self) -> bool:
        return self._port != 0 and self._httpd is None

    def start(self) -> HubServer:
        """Listen on 127.0.0.1 (a free port the first time, the same port after set_offline)."""
        if self._httpd is None:
            self._httpd = _HTTPServer(self._port, self)
            self._port = self._httpd.server_address[1]
            # A short poll interval: shutdown() waits up to one interval, on every stop or offline switch.
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="hubserver", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and drop connections; the store stays on disk (a temp one is removed)."""
        self._close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def set_offline(self, offline: bool) -> None:
        """Offline: connections are refused and open ones cut, like a lost network. Online: listen again."""
        if offline:
            self._close()
        else:
            self.start()

    def _close(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # keep-alive connections would otherwise keep serving
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- knobs for tests

    def fail_next(self, n: int = 1, status: int = 503, path_prefix: str | None = None) -> None:
        """Answer the next `n` requests (whose decoded path starts with `path_prefix`) with `status`."""
        with self._lock:
            self._failures.append(_Failure(n, status, path_prefix))

    def truncate_next_download(self, after_bytes: int) -> None:
        """Cut the next file download after `after_bytes` bytes of body, then hang up."""
        with self._lock:
            self._truncations.append(after_bytes)

    def corrupt_next_download(self, at: int = 0) -> None:
        """Flip the byte at offset `at` of the next file body sent (any file route, ranged or not)."""
        with self._lock:
            self._corruptions.append(at)

    @property
    def cdn_ttl_s(self) -> float:
        """How long a CDN URL handed out by resolve stays valid."""
        return self._api.cdn_ttl_s

    @cdn_ttl_s.setter
    def cdn_ttl_s(self, value: float) -> None:
        self._api.cdn_ttl_s = value

    def after_answer(self, method: str, path_prefix: str, callback: Callable[[], None]) -> None:
        """Call `callback` once, in the request's thread, right after the first `method` request whose
        decoded path starts with `path_prefix` was answered: a test acts at an exact point of a client's
        sequence (the Hub goes away just after a commit landed, a pod is killed the moment it could see it)."""
        with self._lock:
            self._after.append((method, path_prefix, callback))

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()
            self.bytes_served.clear()
            self.log.clear()

    # -- direct access, for arranging tests without HTTP

    def seed(
        self,
        repo_id: str,
        files: Mapping[str, bytes],
        *,
        repo_type: str = "model",
        branch: str = "main",
        private: bool = False,
        message: str = "seed",
        storage: str = "regular",
    ) -> str:
        """Create the repo if needed and commit `files` on top of `branch` (made from main if new),
        stored as regular git files, LFS files or Xet files (`storage`)."""
        return self._commit(repo_id, {p: self.store.put_blob(d, storage) for p, d in files.items()},
                            repo_type, branch, private, message)

    def seed_sparse(self, repo_id: str, path: str, size: int, **kw: Any) -> str:
        """Commit a sparse LFS file of `size` zero bytes (any size: it takes no disk). Its sha256 in
        listings is a declared name, not the content's hash: for a test that never downloads it whole."""
        return self._commit(repo_id, {path: self.store.put_sparse(size)}, kw.get("repo_type", "model"),
                            kw.get("branch", "main"), kw.get("private", False), kw.get("message", "seed"))

    def _commit(self, repo_id: str, blobs: Mapping[str, str], repo_type: str, branch: str, private: bool,
                message: str) -> str:
        key = RepoKey(repo_type, repo_id)
        if not valid_repo_id(repo_id):
            raise ValueError(f"invalid repo id {repo_id!r}")
        with self.store.lock:
            self.store.create_repo(key, private)  # no-op if it exists
            branches, _ = self.store.refs(key)
            if branch not in branches:
                self.store.set_ref(key, "branches", branch, branches["main"])
            current = dict(self.store.commit(key, self.store.refs(key)[0][branch])["files"])
            current.update({clean_path(p): sha for p, sha in blobs.items()})
            return self.store.add_commit(key, branch, current, message, "")

    def resolve(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> str | None:
        """Commit id that `revision` names in the repo, or None."""
        return self.store.resolve(RepoKey(repo_type, repo_id), revision)

    # -- called by request threads

    def _track(self, conn: socket.socket, open_: bool) -> None:
        with self._lock:
            (self._conns.add if open_ else self._conns.discard)(conn)

    def _answer(self, req: Request) -> tuple[str, Response, int | None, int | None]:
        route, action = self._api.route(req)
        resp = self._injected_failure(req, route)
        if resp is None:
            try:
                resp = action()
            except HubError as err:
                resp = err.response()
        cut = flip = None
        with self._lock:
            if req.method == "GET" and resp.streamed and self._truncations:
                cut = self._truncations.pop(0)
            if req.method == "GET" and resp.streamed and self._corruptions:
                flip = self._corruptions.pop(0)
            # Recorded before the answer goes out, so a test that got its answer sees the count.
            self.counts[route] += 1
            self.log.append(RequestRecord(req.method, req.path, route, resp.status, req.headers.get("Range")))
        return route, resp, cut, flip

    def _served(self, route: str, n: int) -> None:
        with self._lock:
            self.bytes_served[route] += n

    def _answered(self, req: Request) -> None:
        with self._lock:
            due = [a for a in self._after if req.method == a[0] and req.path.startswith(a[1])]
            self._after = [a for a in self._after if a not in due]
        for _, _, callback in due:
            callback()

    def _injected_failure(self, req: Request, route: str) -> Response | None:
        if route in HOUSEKEEPING:
            return None
        with self._lock:
            for failure in self._failures:
                if failure.remaining > 0 and req.path.startswith(failure.path_prefix or ""):
                    failure.remaining -= 1
                    status = failure.status
                    break
            else:
                return None
        return HubError(status, f"Injected failure ({status}) from the Hub stand-in").response()
