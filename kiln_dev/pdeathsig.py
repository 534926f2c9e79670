"""Run a command that dies with its parent:  python -I -S pdeathsig.py SIGNUM PARENT_PID -- ARGV...

Sets Linux's parent-death signal (prctl PR_SET_PDEATHSIG) on itself, then execs ARGV: the setting
survives exec, so ARGV gets SIGNUM when the thread that started this process dies, however it
died (SIGKILL included). Run by kiln_dev.children, which says why it is a program of its own
rather than a preexec_fn. Before exec it checks that its parent is still PARENT_PID: a parent that
died before prctl ran would never send the signal, so the command is not started at all.

Stdlib only, and only os, sys, signal and ctypes: it runs in front of every engine a bench or
test helper starts. Elsewhere than Linux it just execs (there is no parent-death signal).
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: pdeathsig.py SIGNUM PARENT_PID -- ARGV...", file=sys.stderr)
        return 2
    sig, parent, cmd = int(argv[0]), int(argv[1]), argv[3:]
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            print(f"pdeathsig: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
            return 126
        if os.getppid() != parent:
            return 128 + sig  # the parent is already gone: it can no longer stop what we would start
    # Python ignores these at start-up, and an ignored signal stays ignored across exec: give the
    # command the defaults it would have had from Popen (restore_signals) directly.
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        print(f"pdeathsig: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
        return 127
    return 127  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
