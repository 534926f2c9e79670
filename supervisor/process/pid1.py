"""PID 1 duties: relay signals to the main loop, adopt and reap orphans, exit like the child.

tini-style: a signal handler only records the signal; the main loop acts on it. A typical loop:

    relay = SignalRelay(); relay.install(); become_subreaper()
    while True:
        relay.wakeup.wait(timeout)
        relay.wakeup.clear()           # clear before reading, so no signal is lost
        for sig in relay.pending(): ...
        reap_orphans(REGISTRY.pids())
"""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Collection, Iterable
from types import FrameType

import psutil

__all__ = ["SignalRelay", "become_subreaper", "reap_orphans", "exit_code_for"]

_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


class SignalRelay:
    """Signal handlers only record the signal and wake an event; the main loop acts (tini-style).

    The event is set by a small thread reading signal.set_wakeup_fd, not by the handler:
    Event.set() takes a non-reentrant lock, and a handler runs on the main thread between
    any two bytecodes, possibly inside Event.wait() holding that very lock (deadlock).
    """

    def __init__(self, notify: Callable[[], None] | None = None) -> None:
        self.wakeup = threading.Event()
        self._notify = notify          # also called from the pump thread (a loop's inbox, say)
        self._pending: collections.deque[int] = collections.deque()
        self._installed = False

    def install(self, signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)) -> None:
        """Install handlers (main thread only). SIGCHLD then wakes the loop, to reap orphans."""
        if self._installed:
            raise RuntimeError("SignalRelay already installed")
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("SignalRelay.install() must run on the main thread")
        rfd, wfd = os.pipe()  # both ends close-on-exec: children never inherit them
        os.set_blocking(wfd, False)  # set_wakeup_fd requires it; a full pipe just drops a byte
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)  # replaces any earlier one
        for sig in signals:
            signal.signal(sig, self._record)
        # A Python handler (not SIG_IGN, which would auto-reap and rob Popen of exit statuses)
        # so that the C-level handler writes the wakeup byte on every child exit.
        signal.signal(signal.SIGCHLD, self._child)
        threading.Thread(target=self._pump, args=(rfd,), name="kiln-signal-pump", daemon=True).start()
        self._installed = True

    def pending(self) -> list[int]:
        """Signals received since the last call, oldest first (SIGCHLD only wakes, never listed)."""
        out = []
        while True:
            try:
                out.append(self._pending.popleft())
            except IndexError:
                return out

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self._pending.append(signum)  # deque.append is atomic: nothing else happens here

    def _child(self, signum: int, frame: FrameType | None) -> None:
        pass  # the wakeup fd already carries it; reaping is the main loop's job

    def _pump(self, rfd: int) -> None:
        while os.read(rfd, 512):
            self.wakeup.set()
            if self._notify is not None:
                self._notify()


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to us (PID 1 already gets them). True on success."""
    if os.getpid() == 1:
        return True
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    zero = ctypes.c_ulong(0)
    return libc.prctl(_PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), zero, zero, zero) == 0


def reap_orphans(known_pids: Collection[int]) -> list[tuple[int, int]]:
    """Reap our zombie children that are not managed processes; return [(pid, returncode)].

    returncode follows Popen (-N for death by signal N). Only zombies are waited for, one pid
    at a time, never waitpid(-1): a managed child's status belongs to its Popen, which would
    otherwise report 0. Pass every pid whose status someone else will collect in known_pids
    (ProcessRegistry.pids(), plus any subprocess started outside it).
    """
    known = set(known_pids)
    reaped: list[tuple[int, int]] = []
    # The usual case costs one syscall: waitid(WNOWAIT) peeks at an exited child without reaping it.
    # None exited: nothing to do. An unknown one: reap it and look again. A managed one (its Popen
    # reaps it in a moment): the scan below steps round it. The scan reads every process's
    # /proc/<pid>/stat (psutil's parent map): ~3 ms a call on a host of 120 processes, which once a
    # second was most of a serving supervisor's CPU (P2b, bench/supervisor_cpu.py).
    for _ in range(64):
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped                       # no children at all
        if info is None:
            return reaped                       # none has exited
        if info.si_pid in known:
            break
        try:
            pid, status = os.waitpid(info.si_pid, os.WNOHANG)
        except ChildProcessError:
            continue                            # someone else reaped it in between
        if pid:
            reaped.append((pid, os.waitstatus_to_exitcode(status)))
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return reaped
    for child in children:
        if child.pid in known:
            continue
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                continue
            pid, status = os.waitpid(child.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            continue
        if pid:
            reaped.append((pid, os.waitstatus_to_exitcode(status)))
    return reaped


def exit_code_for(returncode: int | None) -> int:
    """The exit status to leave with: the child's own, or 128+N if signal N killed it. None is a child
    that outlived SIGKILL (uninterruptible, ManagedProcess.stop): 137, the status it dies with."""
    if returncode is None:
        return 128 + signal.SIGKILL
    return returncode if returncode >= 0 else 128 - returncode
