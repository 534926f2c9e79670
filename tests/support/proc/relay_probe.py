"""A tiny PID-1-style main loop on supervisor.process.pid1, printing what it sees.

The relay covers TERM, INT, HUP and USR1. Handlers only record; this loop prints
`got NAME` for each signal and exits 0 on SIGUSR1 (so TERM/INT/HUP must leave it running).
It spawns one child it never waits for; SIGCHLD must wake the loop so that reap_orphans
collects it: `spawned: PID` then `reaped: PID RC`.
"""

import os
import signal
import sys

from supervisor.process.pid1 import SignalRelay, reap_orphans

relay = SignalRelay()
relay.install((signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1))
print(f"ready (pid: {os.getpid()})", flush=True)
child = os.posix_spawn(sys.executable, [sys.executable, "-I", "-S", "-c", "pass"], os.environ)
print(f"spawned: {child}", flush=True)
while True:
    relay.wakeup.wait()
    relay.wakeup.clear()  # before reading, so a signal arriving now wakes the next round
    for sig in relay.pending():
        print(f"got {signal.Signals(sig).name}", flush=True)
        if sig == signal.SIGUSR1:
            sys.exit(0)
    for pid, rc in reap_orphans(()):
        print(f"reaped: {pid} {rc}", flush=True)
