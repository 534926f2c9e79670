"""A real llama-server for tests that talk to an engine directly (no supervisor in between):
started with the supervisor's own ManagedProcess (behind kiln_dev.children's parent-death
signal, so it dies with its parent), ready when /health answers 200, stopped and reaped on exit. `-t 1` by default (TESTING-HERE.md: with -t 2 and other load on the two
cores, one request ranged from 0.4 s to 63 s)."""

from __future__ import annotations

import time
from pathlib import Path

from supervisor.engines.health import wait_healthy
from supervisor.process.managed import ManagedProcess

from .children import with_death_signal
from .supervised import free_port


class LlamaServer:
    def __init__(self, prefix: Path, model: Path, *args: str, api_key: str | None = None, ctx: int = 4096):
        self.port = free_port()
        self.api_key = api_key
        self.argv = [str(prefix / "bin" / "llama-server"), "--model", str(model), "--host", "127.0.0.1",
                     "--port", str(self.port), "-t", "1", "-c", str(ctx), "--metrics", *args]
        if api_key:
            self.argv += ["--api-key", api_key]
        self.proc: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "LlamaServer":
        self.proc = ManagedProcess.start(with_death_signal(self.argv))
        out = wait_healthy(self.proc, "127.0.0.1", self.port, stall_s=30, max_s=120, poll_s=0.02,
                           should_stop=lambda: False, sleep=time.sleep)
        if not out.ready:
            tail = "\n".join(self.proc.tail()[-20:])
            self.proc.stop(5)
            raise RuntimeError(f"llama-server did not become healthy:\n{tail}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.stop(5)
