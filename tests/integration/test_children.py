"""kiln_dev.children against real processes: a child started through it never outlives its parent,
whether the parent is killed (the parent-death signal) or terminated (stop_on_term unwinds and
stops it), and stop() leaves no descendant behind, even one in a session of its own.

The parent is a small Python program (PARENT below) that starts `sleep 300` through kiln_dev and
prints the child's pid; the test signals the parent and waits, with a deadline, for the child to go.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from kiln_dev import children
from kiln_dev.supervised import REPO_ROOT, wait_for

DEADLINE_S = 15.0

PARENT = textwrap.dedent("""
    import signal, sys, threading
    from kiln_dev import children
    if sys.argv[1] == "term":
        children.stop_on_term()
    p = children.spawn(["sleep", "300"], death_signal=int(sys.argv[2]))
    print(p.pid, flush=True)
    try:
        threading.Event().wait()      # until a signal ends us
    finally:
        print("finally ran", flush=True)
""")


def gone(pid: int) -> bool:
    """Exited (a zombie that nobody reaps counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def start_parent(mode: str, death_signal: int) -> tuple[subprocess.Popen[str], int]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode, str(int(death_signal))], cwd=REPO_ROOT,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    line = parent.stdout.readline()
    assert line.strip().isdigit(), f"parent printed {line!r}"
    child = int(line)
    wait_for(lambda: psutil.Process(child).name() == "sleep", DEADLINE_S, "the wrapper to exec sleep")
    return parent, child


def kill_leftover(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)  # only a pid this test caused to exist
    except ProcessLookupError:
        pass


def test_a_child_dies_with_its_parent_when_the_parent_is_killed() -> None:
    parent, child = start_parent("plain", signal.SIGKILL)
    try:
        assert psutil.Process(child).ppid() == parent.pid      # exec'd in place: same pid, our parent
        parent.kill()
        parent.wait(DEADLINE_S)
        wait_for(lambda: gone(child), DEADLINE_S, f"child {child} to die with its killed parent")
    finally:
        kill_leftover(child)


def test_without_a_death_signal_the_killed_parents_child_survives() -> None:
    # The control: what the parent-death signal prevents (0 clears it). Without it the child of a
    # killed parent lives on; this is how bench/serve.py left its llama-server behind.
    parent, child = start_parent("plain", 0)
    try:
        parent.kill()
        parent.wait(DEADLINE_S)
        assert not gone(child)
    finally:
        kill_leftover(child)


def test_a_terminated_parent_unwinds_and_stops_its_child() -> None:
    # death_signal 0: only stop_on_term's unwinding and atexit can stop the child here.
    parent, child = start_parent("term", 0)
    try:
        parent.terminate()
        assert parent.wait(DEADLINE_S) == 128 + signal.SIGTERM
        assert parent.stdout is not None and "finally ran" in parent.stdout.read()
        wait_for(lambda: gone(child), DEADLINE_S, f"child {child} to be stopped by its terminated parent")
    finally:
        kill_leftover(child)


def test_a_parent_gone_before_the_wrapper_ran_starts_nothing(tmp_path: Path) -> None:
    # PARENT_PID is not our pid: as if the real parent had died between fork and prctl.
    marker = tmp_path / "ran"
    r = subprocess.run([sys.executable, "-I", "-S", str(children.WRAPPER), str(int(signal.SIGKILL)), "1", "--",
                        "touch", str(marker)], capture_output=True, text=True, timeout=DEADLINE_S)
    assert r.returncode == 128 + signal.SIGKILL
    assert not marker.exists()


def test_the_wrapped_command_gets_default_sigpipe() -> None:
    # Python ignores SIGPIPE at start-up and an ignored signal survives exec: the wrapper undoes it.
    p = children.spawn(["grep", "^SigIgn", "/proc/self/status"], stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=DEADLINE_S)
    ignored = int(out.split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)), out


def test_a_missing_command_raises_in_the_parent_as_popen_would() -> None:
    with pytest.raises(FileNotFoundError):
        children.spawn(["/nonexistent/llama-server", "--version"])


def test_stop_reaches_a_descendant_in_a_session_of_its_own() -> None:
    # sh starts `setsid sleep`: a grandchild outside the group, like a supervisor's engine.
    p = children.spawn(["sh", "-c", "setsid sleep 300 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    grandchild = int(p.stdout.readline())
    try:
        wait_for(lambda: psutil.Process(grandchild).name() == "sleep", DEADLINE_S, "setsid to exec sleep")
        assert os.getsid(grandchild) != os.getsid(p.pid)
        children.stop(p, grace_s=5)
        assert p.poll() is not None
        wait_for(lambda: gone(grandchild), DEADLINE_S, "the grandchild in its own session to be stopped")
        assert p not in children.tracked()
    finally:
        kill_leftover(grandchild)
