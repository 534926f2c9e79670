"""A slow link, for tests: a TCP relay on loopback that forwards to a local server and caps the
bytes per second it sends back. Put it between a client and the Hub stand-in (HF_ENDPOINT pointed
at the relay) to give a download a window in which a test can interrupt it, instead of sleeping
and hoping. Stdlib only; every connection is relayed in both directions; `close()` drops them all.

The cap is per connection, as a CDN applies it: N parallel connections get N times the rate, which
is what a segmented downloader is for. Each connection keeps to a schedule (bytes sent so far over
the rate) rather than sleeping after every read, so many connections on a busy CPU still get their
rate; reads are 64 KiB, so dozens of relayed connections cost little CPU.
"""

from __future__ import annotations

import socket
import threading
import time


class Throttle:
    def __init__(self, target_port: int, bytes_per_s: int, chunk: int = 64 * 1024):
        self.target_port = target_port
        self.bytes_per_s = bytes_per_s
        self.chunk = chunk
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)   # a parallel downloader connects dozens of times at once
        self.port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="throttle-accept").start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._socks += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, throttled: bool) -> None:
        start, sent = time.monotonic(), 0
        try:
            while True:
                data = src.recv(self.chunk)
                if not data:
                    break
                dst.sendall(data)
                if throttled:
                    sent += len(data)
                    ahead = start + sent / self.bytes_per_s - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
                    elif ahead < -1.0:          # idle (keep-alive between requests): no burst credit
                        start, sent = time.monotonic(), 0
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def __enter__(self) -> "Throttle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
