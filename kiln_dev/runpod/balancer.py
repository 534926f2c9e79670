"""The stand-in's load balancer: RunPod serves a load-balancing endpoint at
https://<endpoint id>.api.runpod.ai/<path>; here it is http://127.0.0.1:<port>/<endpoint id>/<path>.

As RunPod's docs describe it (serverless/load-balancing/overview.mdx, worker-affinity.mdx): a
request needs `Authorization: Bearer <RunPod API key>` (401 otherwise); it goes straight to a
worker's own HTTP server on PORT, only to a worker whose health path answers 200, and its answer
streams back as the worker writes it, with X-Runpod-Worker-Id naming the worker. A request that
finds no healthy worker counts as in flight (the scaler starts one) and waits; after
`no_worker_limit_s` (RunPod: 2 minutes, scaled down in tests) it is answered 400
{"error": "no workers available"}; a request still processing after `processing_limit_s`
(RunPod: 5.5 minutes) is cut with 524. No queue, no retry (RunPod's overview: "No built-in retry").

Whether RunPod forwards the client's Authorization header to the worker is not documented. The
stand-in forwards it as it came: the case where a RunPod key reaches a worker, which Kiln's
secret-canary tests then cover.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization",
              "proxy-authenticate", "content-length", "host"}


class Balancer:
    def __init__(self, standin: Any, *, no_worker_limit_s: float = 120.0, processing_limit_s: float = 330.0):
        self.standin = standin
        self.no_worker_limit_s = no_worker_limit_s
        self.processing_limit_s = processing_limit_s
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.routed: list[tuple[str, str, str, int]] = []     # (endpoint id, worker id, path, status)
        self.lock = threading.Lock()
        self.refused: list[tuple[str, str, int]] = []         # (endpoint id, path, status): no worker took it

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        lb = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _go(self) -> None:
                self.close_connection = True
                m = re.fullmatch(r"/([^/?]+)(/[^?]*)?(\?.*)?", self.path)
                if not m:
                    return self._error(404, "no such endpoint")
                eid, rest = m.group(1), (m.group(2) or "/") + (m.group(3) or "")
                token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                if token != lb.standin.api_key:
                    return self._error(401, "unauthorized")
                if eid not in lb.standin.endpoints:
                    return self._error(404, "endpoint not found")
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                path = rest.split("?", 1)[0]
                worker = lb.standin.claim_worker(eid, lb.no_worker_limit_s)
                if worker is None:
                    lb.refused.append((eid, path, 400))
                    return self._error(400, "no workers available")
                with lb.lock:             # recorded before the answer starts (status 0 until it ends)
                    at = len(lb.routed)
                    lb.routed.append((eid, worker.id, path, 0))
                status = 0
                try:
                    status = self._forward(worker, rest, body)
                finally:
                    lb.standin.release_worker(worker)
                    with lb.lock:
                        lb.routed[at] = (eid, worker.id, path, status)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _go

            def _forward(self, worker: Any, rest: str, body: bytes | None) -> int:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", worker.api_port, timeout=lb.processing_limit_s)
                    conn.request(self.command, rest, body=body, headers=headers)
                    r = conn.getresponse()
                except TimeoutError:
                    self._error(524, "a timeout occurred")
                    return 524
                except OSError as e:
                    self._error(502, f"bad gateway: {type(e).__name__}")
                    return 502
                try:
                    self.send_response(r.status)
                    for k, v in r.getheaders():
                        if k.lower() not in HOP_BY_HOP:
                            self.send_header(k, v)
                    self.send_header("X-Runpod-Worker-Id", worker.id)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    deadline = time.monotonic() + lb.processing_limit_s
                    while self.command != "HEAD":
                        chunk = r.read1(65536)      # as the worker writes it: a stream stays a stream
                        if not chunk or time.monotonic() > deadline:
                            break
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:
                    pass                             # the client or the worker went away
                finally:
                    conn.close()
                return r.status

            def _error(self, status: int, text: str) -> None:
                data = json.dumps({"error": text}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
