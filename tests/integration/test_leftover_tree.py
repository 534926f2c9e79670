"""Nothing Kiln started, or that what Kiln started started, outlives a killed supervisor (issue 50 item 6).
The parent-death signal reaches only the process Kiln started: vLLM's EngineCore and Worker_TP* processes
lived on after a SIGKILLed supervisor, held torch's rendezvous port, and every relaunch failed EADDRINUSE;
and a child started just before its journal entry was written was recorded nowhere. Every child now
carries its supervisor's run directory in its environment (KILN_CHILD_OF), which what it starts
inherits, and the next supervisor on that state directory ends every process that carries it.

Real processes: tests/support/proc/spawner.py starts grandchild.py and, on SIGUSR1, exits leaving the
grandchild orphaned (as vLLM's API server died with its parent-death signal and left its engine core)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from kiln_dev.supervised import wait_for
from supervisor.process.leftovers import MARK, end_leftovers, mark_of
from supervisor.process.managed import REGISTRY, ManagedProcess

PROC = Path(__file__).resolve().parents[1] / "support" / "proc"
log = logging.getLogger("test")


def _alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def _grandchild_of(pid: int) -> int:
    return wait_for(lambda: next((c.pid for c in psutil.Process(pid).children()), None), 20, "the grandchild")


def test_an_orphaned_grandchild_of_a_recorded_child_is_ended_at_the_next_start(tmp_path):
    run = tmp_path / "run"
    REGISTRY.journal_to(run)
    try:
        child = ManagedProcess.start([sys.executable, str(PROC / "spawner.py")], role="engine", pdeathsig=False)
        grand = _grandchild_of(child.pid)
        assert psutil.Process(grand).environ().get(MARK) == mark_of(run)      # inherited
        os.kill(child.pid, signal.SIGUSR1)    # the recorded child exits: its child is orphaned, unrecorded
        child.wait(20)
        assert _alive(grand)
        ended = end_leftovers(run, log, grace_s=5)
        assert grand in ended
        wait_for(lambda: not _alive(grand), 10, "the orphaned grandchild ended")
    finally:
        REGISTRY.mark = None
        REGISTRY._journal = None


def test_a_child_the_journal_never_named_is_ended_and_a_stranger_is_not(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    mark = {**os.environ, MARK: mark_of(run)}
    other = {**os.environ, MARK: mark_of(tmp_path / "another-run")}
    unrecorded = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=mark,
                                  start_new_session=True)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=other,
                                start_new_session=True)
    try:
        ended = end_leftovers(run, log, grace_s=5)
        assert unrecorded.pid in ended and stranger.pid not in ended
        assert unrecorded.wait(10) is not None and stranger.poll() is None
    finally:
        for p in (unrecorded, stranger):
            p.kill()
            p.wait(10)
