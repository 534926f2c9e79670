"""An engine stand-in for the health wait (supervisor/engines/health.py): optionally chatty for a while
(a line every millisecond), then silent for a while, then it binds its port, says it listens, and
answers /health 200 -- the order llama-server keeps (it says it listens as /health turns 200)."""

from __future__ import annotations

import argparse
import http.server
import time


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
    ap.add_argument("--chatty-ms", type=float, default=0)
    ap.add_argument("--quiet-ms", type=float, default=0)
    a = ap.parse_args()
    end = time.monotonic() + a.chatty_ms / 1000
    n = 0
    while time.monotonic() < end:
        print(f"loading {n}", flush=True)
        n += 1
        time.sleep(0.001)          # the pacing is the scenario: an engine printing progress
    time.sleep(a.quiet_ms / 1000)  # the scenario: a quiet stretch longer than the health wait's fast phase
    server = http.server.HTTPServer(("127.0.0.1", a.port), Health)
    print(f"listening on http://127.0.0.1:{a.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
