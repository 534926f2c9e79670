"""A child process that serves one of PID 1's listeners (the status endpoint or the TCP relay)
and takes commands on stdin, so a test can starve that process of descriptors or threads for
real (the test runner's own process is left alone).

    python -m tests.support.listener_child status
    python -m tests.support.listener_child relay TARGET_PORT [max_connections [idle_s]]

It prints one JSON line {"port": N} once listening, then answers each command with one line:

    nofile N      lower RLIMIT_NOFILE's soft limit to N              -> ok
    exhaust       open /dev/null until EMFILE                        -> exhausted COUNT
    release       close what `exhaust` opened                        -> released
    threads-fail  make every new thread fail to start (RLIMIT_AS)    -> ok
    threads-ok    undo threads-fail                                  -> ok
    relay         the relay's status() as JSON                       -> {...}

End of stdin stops the listener and exits 0. The listener's log goes to stderr.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from supervisor.status.relay import TcpRelay
from supervisor.status.server import StatusServer

_HUGE_STACK = 1 << 30  # no thread gets this much stack under the RLIMIT_AS set by threads-fail
REPO_ROOT = Path(__file__).resolve().parents[2]


class ListenerChild:
    """The test's side: start the child, send commands, read its log once it has stopped."""

    def __init__(self, *argv: str):
        self._err = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.listener_child", *argv],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     text=True, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        self.pid = self.proc.pid
        self.port = json.loads(self._line(30))["port"]

    def _line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while not select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
            if time.monotonic() >= deadline:
                raise AssertionError(f"listener child said nothing for {timeout} s:\n{self.log()}")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"listener child exited {self.proc.wait()}:\n{self.log()}")
        return line.strip()

    def command(self, cmd: str, timeout: float = 30) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._line(timeout)

    def relay_status(self) -> dict:
        return json.loads(self.command("relay"))

    def stop(self) -> str:
        """End stdin, wait for a clean exit, return the child's log."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"listener child did not stop:\n{self.log()}") from None
        return self.log()

    def log(self) -> str:
        self._err.seek(0)
        return self._err.read()

    def __enter__(self) -> "ListenerChild":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._err.close()


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    relay: TcpRelay | None = None
    status: StatusServer | None = None
    if argv[0] == "status":
        snap = {"state": "SERVING", "ready": True,
                "history": [{"t": 1.0, "event": "launch", "detail": "x" * 200}] * 30}
        status = StatusServer("127.0.0.1", 0, lambda: snap)
        status.start()
        port = status.port
    else:
        kwargs = {}
        if len(argv) > 2:
            kwargs["max_connections"] = int(argv[2])
        if len(argv) > 3:
            kwargs["idle_s"] = float(argv[3])
        relay = TcpRelay("127.0.0.1", 0, "127.0.0.1", int(argv[1]), **kwargs)
        relay.start()
        port = relay.port
    print(json.dumps({"port": port}), flush=True)
    held: list[int] = []
    as_limit = resource.getrlimit(resource.RLIMIT_AS)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "nofile":
            resource.setrlimit(resource.RLIMIT_NOFILE, (int(args[0]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
            reply = "ok"
        elif cmd == "exhaust":
            try:
                while True:
                    held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                pass
            reply = f"exhausted {len(held)}"
        elif cmd == "release":
            for fd in held:
                os.close(fd)
            held.clear()
            reply = "released"
        elif cmd == "threads-fail":
            threading.stack_size(_HUGE_STACK)
            resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + _HUGE_STACK // 2, as_limit[1]))
            reply = "ok"
        elif cmd == "threads-ok":
            resource.setrlimit(resource.RLIMIT_AS, as_limit)
            threading.stack_size(0)
            reply = "ok"
        elif cmd == "relay":
            assert relay is not None
            reply = json.dumps(relay.status())
        else:
            reply = f"unknown command {cmd!r}"
        print(reply, flush=True)
    if relay is not None:
        relay.stop()
    if status is not None:
        status.stop()
    return 0


def _vm_bytes() -> int:
    """This process's address space now (VmSize), which RLIMIT_AS counts."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
