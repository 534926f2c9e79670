"""PID 1's side of an engine when descriptors run out: this process starts child.py through
ManagedProcess, then takes commands on stdin (one reply line each):

  exhaust   lower RLIMIT_NOFILE and open /dev/null until EMFILE; wait until the output reader
            has tried a process-tree scan          -> "scan failed" | "reader failed" | "no scan"
  release   close those descriptors                -> "released"
  signal    SIGUSR1 to the child, which prints a line; wait for it to arrive -> "line" | "no line"
  tracked   is the child running and in the tree  -> "tracked" | "untracked"

End of stdin stops the child and prints "stopped RC". The supervisor's log goes to stderr.
"""

import logging
import os
import resource
import signal
import sys
import threading
from pathlib import Path

from supervisor.process.managed import ManagedProcess

DEADLINE_S = 20.0
CHILD = Path(__file__).with_name("child.py")
CHANGED = threading.Condition()        # notified on every engine line and every log record


class Seen(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with CHANGED:
            self.messages.append(record.getMessage())
            CHANGED.notify_all()


def wait(cond, timeout: float = DEADLINE_S) -> bool:
    """Until cond() holds (woken by each line and log record), or the deadline."""
    with CHANGED:
        return CHANGED.wait_for(cond, timeout)


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    seen = Seen()
    logging.getLogger().addHandler(seen)
    lines: list[str] = []

    def on_line(line: str) -> None:
        with CHANGED:
            lines.append(line)
            CHANGED.notify_all()

    p = ManagedProcess.start([sys.executable, str(CHILD)], on_line=on_line)
    if not wait(lambda: any(x.startswith("ready") for x in lines)):
        print("child not ready", flush=True)
        return 1
    print("ready", flush=True)
    held: list[int] = []
    for command in sys.stdin:
        command = command.strip()
        if command == "exhaust":
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
            try:
                while True:
                    held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                pass
            scanned = wait(lambda: any("process tree" in m or "reader failed" in m for m in seen.messages))
            text = " ".join(seen.messages)
            reply = "no scan" if not scanned else "reader failed" if "reader failed" in text else "scan failed"
        elif command == "release":
            for fd in held:
                os.close(fd)
            held.clear()
            reply = "released"
        elif command == "signal":
            before = lines.count("signal: SIGUSR1")
            try:
                os.kill(p.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
            reply = "line" if wait(lambda: lines.count("signal: SIGUSR1") > before, 5) else "no line"
        elif command == "tracked":
            reply = "tracked" if p.poll() is None and p.pid in p.tree_pids() else "untracked"
        else:
            reply = f"unknown command {command!r}"
        print(reply, flush=True)
    print(f"stopped {p.stop(5)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
