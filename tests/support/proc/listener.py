"""Smallest server stand-in: listen on 127.0.0.1:PORT, print `ready (pid: N)`, die on SIGTERM.

Kept import-light (run with python -I -S) because the leak test starts it a hundred times.
"""

import os
import signal
import socket
import sys

sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen()
print(f"ready (pid: {os.getpid()})", flush=True)
while True:
    signal.pause()
