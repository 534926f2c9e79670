"""Parent that starts grandchild.py (arguments pass through) and prints `ready (pid: N)`.

SIGUSR1 makes it exit 0 at once, leaving the grandchild orphaned; SIGTERM keeps its default
action (dies with the group). The grandchild shares our stdout, so its lines reach the test too.
"""

import os
import signal
import subprocess
import sys

signal.signal(signal.SIGUSR1, lambda signum, frame: os._exit(0))
here = os.path.dirname(os.path.abspath(__file__))
subprocess.Popen([sys.executable, os.path.join(here, "grandchild.py"), *sys.argv[1:]])
print(f"ready (pid: {os.getpid()})", flush=True)
while True:
    signal.pause()
