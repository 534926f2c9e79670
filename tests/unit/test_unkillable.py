"""An engine that outlives SIGKILL (issue 24, item 12b) is told on /status, and PID 1 still exits with a
status: supervisor/run/launch.py unkillable(), supervisor/process/pid1.py exit_code_for()."""

from pathlib import Path

from supervisor.config import Rung
from supervisor.run import launch
from supervisor.run.runtime import Runtime
from supervisor.run.record import Record
from supervisor.process.pid1 import exit_code_for
from supervisor.redact import Secrets


def test_an_unkillable_engine_is_on_status_with_pid_and_state_and_a_warning(tmp_path: Path):
    rec = Record("test")
    rt = Runtime(env={}, state_dir=tmp_path, rec=rec, secrets=Secrets(), hardware_probe=lambda: None,
                 gpu_used=lambda: None)
    info = {"pid": 4242, "leader_alive": True, "processes": [{"pid": 4242, "state": "disk-sleep"}], "since": 1.0}
    launch.unkillable(rt, Rung(name="full"), info)
    snap = rec.snapshot()
    assert snap["unkillable"] == {"4242": {**info, "rung": "full"}}
    assert any("pid 4242 (disk-sleep)" in w and "did not die after SIGKILL" in w for w in snap["warnings"])
    assert snap["history"][-1]["event"] == "unkillable"


def test_pid1_exits_137_for_an_engine_that_outlived_sigkill():
    assert exit_code_for(None) == 137 and exit_code_for(-9) == 137 and exit_code_for(3) == 3
