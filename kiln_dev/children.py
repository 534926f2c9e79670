"""Children that never outlive the bench or test helper that started them (issue 18, item 11).

A bench stopped by `timeout` (SIGTERM, then SIGKILL after its grace) used to leave its
llama-server running: the server had its own session, so the signals never reached it, and
Python's default SIGTERM action dies without running a single `finally`. Two guards, one per way
a parent goes:

* Killed (SIGKILL, the OOM killer, a cancelled CI job): nothing runs in the parent any more, so the
  child must notice by itself. Linux's parent-death signal (prctl PR_SET_PDEATHSIG) does that, but
  it must be set in the child, between fork and exec. Popen's preexec_fn could call prctl there,
  but preexec_fn is unsafe in a process with threads (a lock another thread held at fork stays
  held in the child; STYLE.md), and benches and tests run threads. So the child starts as
  `python -I -S kiln_dev/pdeathsig.py SIG PARENT -- argv...`, a few lines that set the signal,
  check the parent is still there, and exec argv (the setting survives exec). The cost is one bare
  interpreter start, ~10-15 ms here, before the command's own start.
* Terminated (`timeout`'s first signal, a CI cancel): stop_on_term() turns SIGTERM and SIGHUP into
  SystemExit(128+N) in the main thread, the way Python turns SIGINT into KeyboardInterrupt, so every
  `with`/`finally` stops its children gracefully; atexit then stops any tracked child still running.
  (A bench has no event loop to notice a flag, which is why this handler raises instead.)

Children run in their own session (start_new_session: thread-safe), so stop() signals the whole
group, then any descendant that left it. The parent-death signal goes when the *thread* that
started the child ends: start children from a thread that lives as long as they should (the main
thread, in every bench and test here). Which signal: SIGKILL for an engine (nothing to clean up),
SIGTERM for a supervisor (it must stop its own engine, which runs in a session of its own).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

__all__ = ["with_death_signal", "spawn", "stop", "stop_all", "stop_on_term", "tracked"]

WRAPPER = Path(__file__).resolve().with_name("pdeathsig.py")
_KILL_WAIT_S = 10.0  # after SIGKILL only an uninterruptible (D state) process takes longer

_lock = threading.Lock()
_tracked: list[subprocess.Popen[Any]] = []
_atexit_registered = False
_term_installed = False


def with_death_signal(argv: Sequence[str | os.PathLike[str]], sig: int = signal.SIGKILL, *,
                      cwd: str | os.PathLike[str] | None = None, path: str | None = None) -> list[str]:
    """argv behind the pdeathsig wrapper, for starters other than spawn() (ManagedProcess.start).

    The wrapper cannot raise FileNotFoundError the way Popen would, so a missing command is
    refused here, in the parent, with the same exception: looked up as the child will (a relative
    path against `cwd`, a bare name on `path`, the child's PATH)."""
    args = [os.fspath(a) for a in argv]
    if not args:
        raise ValueError("argv is empty")
    exe = args[0]
    if os.sep in exe and cwd is not None:
        exe = os.path.join(os.fspath(cwd), exe)
    if shutil.which(exe, path=None if os.sep in exe else path) is None:
        raise FileNotFoundError(2, "No such file or directory", args[0])
    return [sys.executable, "-I", "-S", str(WRAPPER), str(int(sig)), str(os.getpid()), "--", *args]


def spawn(argv: Sequence[str | os.PathLike[str]], *, death_signal: int = signal.SIGKILL,
          **popen_kwargs: Any) -> subprocess.Popen[Any]:
    """subprocess.Popen(argv, **popen_kwargs) in a session of its own, with a parent-death signal,
    tracked so that stop_all() (at exit, or on SIGTERM after stop_on_term) stops it."""
    if popen_kwargs.get("shell"):
        raise ValueError("no shell: pass an argv list")
    popen_kwargs.setdefault("start_new_session", True)  # own group: stop() signals all of it
    env = popen_kwargs.get("env")
    wrapped = with_death_signal(argv, death_signal, cwd=popen_kwargs.get("cwd"),
                                path=env.get("PATH", os.defpath) if env is not None else None)
    proc = subprocess.Popen(wrapped, **popen_kwargs)
    _track(proc)
    return proc


def _track(proc: subprocess.Popen[Any]) -> None:
    with _lock:
        _tracked[:] = [p for p in _tracked if p.poll() is None]
        _tracked.append(proc)
    _stop_all_at_exit()


def _stop_all_at_exit() -> None:
    global _atexit_registered
    with _lock:
        if not _atexit_registered:
            atexit.register(stop_all)
            _atexit_registered = True


def tracked() -> list[subprocess.Popen[Any]]:
    """Children of spawn() still running."""
    with _lock:
        return [p for p in _tracked if p.poll() is None]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _send(procs: Sequence[psutil.Process], sig: int) -> None:
    for p in procs:
        try:
            p.send_signal(sig)  # psutil refuses a pid that was reused
        except psutil.Error:
            pass


def stop(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> int | None:
    """TERM the child's group, wait up to grace_s (monotonic clock), KILL the group; then the same
    for descendants that left the group and outlived it (a supervisor's engine, in a session of
    its own, when the supervisor could not stop it). Reaps the child. Idempotent; returns its
    return code (Popen convention)."""
    if proc.poll() is not None:
        return proc.returncode
    try:
        leader = psutil.Process(proc.pid)
        tree = leader.children(recursive=True)  # while parent links are intact
    except psutil.Error:
        tree = []
    deadline = time.monotonic() + max(grace_s, 0.0)
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
    try:
        code = proc.wait(_KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"pid {proc.pid} still alive {_KILL_WAIT_S:.0f} s after SIGKILL") from None
    left = [p for p in tree if _alive(p)]
    if left:
        _send(left, signal.SIGTERM)
        left = _wait_gone(left, deadline)
        _send(left, signal.SIGKILL)
        _wait_gone(left, time.monotonic() + _KILL_WAIT_S)
    return code


def _wait_gone(procs: list[psutil.Process], deadline: float) -> list[psutil.Process]:
    """Those of procs still alive at the deadline. Not psutil.wait_procs: a zombie re-parented to
    an init that does not reap never vanishes, and a zombie is gone for our purpose."""
    while True:
        procs = [p for p in procs if _alive(p)]
        if not procs or time.monotonic() >= deadline:
            return procs
        time.sleep(0.02)  # polling interval of a deadline wait


def _signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    # Only a group the child leads (start_new_session): never the caller's own group.
    if proc.poll() is None:
        try:
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, sig)
                return
        except ProcessLookupError:
            return
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


def stop_all(grace_s: float = 5.0) -> None:
    """Stop every child of spawn() still running, one grace for all of them."""
    procs = tracked()
    threads = [threading.Thread(target=stop, args=(p, grace_s), daemon=True) for p in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _on_term(signum: int, frame: FrameType | None) -> None:
    # One-shot: a second TERM must not break off the cleanup the first one started. A no-op
    # handler rather than SIG_IGN, which a child started during the cleanup would inherit.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _ignore)
    raise SystemExit(128 + signum)


def _ignore(signum: int, frame: FrameType | None) -> None:
    pass


def stop_on_term() -> None:
    """In a bench's main thread: SIGTERM/SIGHUP unwind like Ctrl-C (SystemExit(128+N)), and every
    child of spawn() still running is stopped at exit. Idempotent."""
    global _term_installed
    if _term_installed:
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_term)
    _stop_all_at_exit()
    _term_installed = True
