"""An engine stand-in for the health wait (supervisor/engines/health.py): silent, or printing progress
lines as fast as it can (--chatty), until the test says "go" through a FIFO (--go PATH); then it binds
its port, says it listens, and answers /health 200 -- the order llama-server keeps (it says it
listens as /health turns 200). The test decides when: on a condition, never after a fixed time."""

from __future__ import annotations

import argparse
import http.server
import os


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:   # the requests are not output (they would wake the wait)
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--go", required=True, help="a FIFO: the first byte written to it starts the server")
    ap.add_argument("--chatty", action="store_true", help="print progress lines until then")
    a = ap.parse_args()
    if a.chatty:
        fd = os.open(a.go, os.O_RDONLY | os.O_NONBLOCK)   # no writer yet: reads return b"" until one writes
        n = 0
        while True:
            print(f"loading {n}", flush=True)
            n += 1
            try:
                if os.read(fd, 1):
                    break
            except BlockingIOError:                      # a writer, nothing written yet
                pass
    else:
        with open(a.go, "rb") as f:                      # blocks until the test opens it and writes
            f.read(1)
    server = http.server.HTTPServer(("127.0.0.1", a.port), Health)
    print(f"listening on http://127.0.0.1:{a.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
