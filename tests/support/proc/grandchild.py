"""Grandchild: prints `grandchild ready (pid: N, pgid: G)` once set up, and reports SIGTERM.

  --setsid        leave the parent's session and process group first (escape killpg)
  --ignore-term   report SIGTERM but keep running
  --code N        exit status on SIGUSR1 (default 7)
"""

import os
import signal
import sys

argv = sys.argv[1:]
if "--setsid" in argv:
    os.setsid()
code = int(argv[argv.index("--code") + 1]) if "--code" in argv else 7


def on_term(signum: int, frame: object) -> None:
    print(f"grandchild signal: SIGTERM (pid: {os.getpid()})", flush=True)
    if "--ignore-term" not in argv:
        os._exit(0)


signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGUSR1, lambda signum, frame: os._exit(code))
print(f"grandchild ready (pid: {os.getpid()}, pgid: {os.getpgid(0)})", flush=True)
while True:
    signal.pause()
