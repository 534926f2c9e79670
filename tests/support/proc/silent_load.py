"""Stand-in for an engine's silent load phases: it prints `ready (pid: N)` and then nothing.

  silent_load.py mmap FILE DIR   on each DIR/go-N, read the next 64 MiB of FILE through mmap (one byte
                                 per page, as a loader touches weights), then create DIR/done-N
  silent_load.py spin            keep a core busy (a hung NCCL start-up): no output, reads or memory
"""

import mmap
import os
import signal
import sys
import time

CHUNK = 64 << 20
POLL_S = 0.01      # how often it looks for the test's go-N file (a condition, polled)


def main() -> None:
    print(f"ready (pid: {os.getpid()})", flush=True)
    if sys.argv[1] == "spin":
        n = 0
        while True:
            n = (n + 1) & 0xFFFF
    path, control = sys.argv[2], sys.argv[3]
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        for n in range(len(m) // CHUNK):
            while not os.path.exists(os.path.join(control, f"go-{n}")):
                time.sleep(POLL_S)
            sum(m[i] for i in range(n * CHUNK, (n + 1) * CHUNK, mmap.PAGESIZE))
            open(os.path.join(control, f"done-{n}"), "w").close()
        while True:                    # loaded: silent until it is stopped
            signal.pause()


if __name__ == "__main__":
    main()
