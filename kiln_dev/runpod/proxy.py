"""The stand-in's HTTP proxy: RunPod serves a pod's http port N at https://<podId>-N.proxy.runpod.net;
here it is http://127.0.0.1:<port>/<podId>-N/..., forwarded to the port the pod's container
listens on. Only ports the pod exposes as `N/http`, only while the pod is RUNNING (as RunPod's
proxy); anything else answers 404 or 502 in plain text, as a proxy does, not a RunPod problem object.
"""

from __future__ import annotations

import http.client
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization",
              "proxy-authenticate", "content-length", "host"}


class ProxyRouter:
    def __init__(self, standin: Any):
        self.standin = standin
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.forwarded: list[tuple[str, int, str]] = []      # (pod id, port, path)

    @property
    def pattern(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{{pod_id}}-{{port}}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def target(self, pod_id: str, port: int) -> int | None:
        with self.standin.lock:
            pod = self.standin.pods.get(pod_id)
            container = self.standin.containers.get(pod_id)
            if pod is None or container is None or pod["status"] != "RUNNING":
                return None
            if f"{port}/http" not in (pod.get("ports") or []):
                return None
            return container.mapped.get(port)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        router = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _go(self) -> None:
                m = re.fullmatch(r"/([^/]+)-(\d+)(/.*)?", self.path.split("?", 1)[0])
                if not m:
                    return self._plain(404, "no such pod route")
                pod_id, port = m.group(1), int(m.group(2))
                rest = self.path[len(f"/{pod_id}-{port}"):] or "/"
                local = router.target(pod_id, port)
                if local is None:
                    return self._plain(404, f"pod {pod_id} does not serve http port {port}")
                router.forwarded.append((pod_id, port, rest.split("?", 1)[0]))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", local, timeout=120)
                    conn.request(self.command, rest, body=body, headers=headers)
                    r = conn.getresponse()
                    data = r.read()
                    conn.close()
                except OSError as e:
                    return self._plain(502, f"bad gateway: {type(e).__name__}")
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in HOP_BY_HOP:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _go

            def _plain(self, status: int, text: str) -> None:
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
