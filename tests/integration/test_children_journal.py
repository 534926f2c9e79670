"""The children journal (supervisor/process/leftovers.py, `<state_dir>/run/children.json`) is written
atomically through a temp file beside it; a clean stop left that temp file behind (issue 50 item 12:
18 of 50 start/stop cycles left `run/.children.json.<pid>.<tid>.tmp`), and the child it had just
ended still recorded. The journal forgot an exited child on the reaper's (daemon) thread after
saying it exited: stop() returned, the supervisor exited, and the interpreter cut that write.

A real supervisor with the CPU llama-server, started and stopped again and again on one state
directory; and a ManagedProcess whose journal write is held, to see the order without a race."""

from __future__ import annotations

import json
import sys
import threading

import pytest

from kiln_dev.supervised import Supervised, config, free_port, wait_for
from supervisor.process import leftovers, managed

CYCLES = 20


def test_a_stop_returns_only_after_the_journal_has_forgotten_the_child(tmp_path, monkeypatch):
    """Deterministic: the journal's write that forgets the child is held until the test lets it go;
    while it is held the process must not count as exited (stop() waits on exactly that), and once
    stop() returns the journal is empty and no temp file is beside it."""
    registry = managed.ProcessRegistry()
    monkeypatch.setattr(managed, "REGISTRY", registry)
    run = tmp_path / "run"
    registry.journal_to(run)
    real = leftovers.write_atomic
    held, release = threading.Event(), threading.Event()
    procs: list[managed.ManagedProcess] = []
    exited_during_write: list[bool] = []

    def write(path, data, *a, **kw):
        if procs and json.loads(data) == []:                   # the write that forgets the child
            exited_during_write.append(procs[0].exited().is_set())
            held.set()
            release.wait(30)
        return real(path, data, *a, **kw)

    monkeypatch.setattr(leftovers, "write_atomic", write)
    p = managed.ManagedProcess.start([sys.executable, "-c", "import time; time.sleep(60)"], pdeathsig=False)
    procs.append(p)
    assert [e["pid"] for e in json.loads((run / "children.json").read_text())] == [p.pid]
    stopped: dict[str, object] = {}
    t = threading.Thread(target=lambda: stopped.update(rc=p.stop(5.0)))
    t.start()
    try:
        wait_for(held.is_set, 30, "the journal's write forgetting the child")
        assert exited_during_write == [False], "exited (so stop() free to return) before the journal forgot it"
        assert "rc" not in stopped
    finally:
        release.set()
        t.join(30)
    assert stopped["rc"] == -15
    assert json.loads((run / "children.json").read_text()) == []
    assert sorted(x.name for x in run.iterdir()) == ["children.json"]


@pytest.mark.llama
def test_clean_stops_leave_no_temp_file_of_the_children_journal(tmp_path, prefix, tiny):
    """Every stop here is clean (exit 0); before the fix some cycles left the temp file, and the
    engine recorded; a temp file a killed supervisor left is removed at the next start."""
    run = tmp_path / "state/run"
    run.mkdir(parents=True)
    (run / ".children.json.4242.140310184236736.tmp").write_text("[{")     # a killed supervisor's
    (run / ".children.json.notes.tmp").write_text("a user's")               # not Kiln's form: kept
    rung = '[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "512"]\n'
    left: list[tuple[int, list[str]]] = []
    journaled: list[tuple[int, list[int]]] = []
    for i in range(CYCLES):
        text = config(binary=str(prefix / "bin/llama-server"), model=str(tiny), port=free_port(),
                      status_port=free_port(), state_dir=tmp_path / "state", rungs=rung,
                      snapshot=str(prefix / "share/kiln/llama-server.help.txt"))
        with Supervised(tmp_path, text) as sup:
            sup.wait_state("SERVING", timeout=120)
            assert sup.stop(timeout=60) == 0, sup.log()[-3000:]
        tmps = sorted(p.name for p in run.glob(".children.json.*.tmp") if p.name != ".children.json.notes.tmp")
        if tmps:
            left.append((i, tmps))
        pids = [e["pid"] for e in json.loads((run / "children.json").read_text())]
        if pids:                                           # every child it started is gone: none recorded
            journaled.append((i, pids))
    assert left == [] and journaled == [], \
        f"after clean stops (cycle, what): temp files left {left}; children still journaled {journaled}"
    assert (run / ".children.json.notes.tmp").read_text() == "a user's"
