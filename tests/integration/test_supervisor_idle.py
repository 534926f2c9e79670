"""The status page comes up once the loop is idle, whatever woke it last.

The peripherals (status page, relay, watcher, reporter) start at the loop's first idle moment. A
wake-up (a SIGCHLD from the hardware probe's nvidia-smi, say) that lands in the inbox right behind
the machine's last answer used to take that moment: the loop skipped the start after the step
(the inbox was not empty), then skipped it again for the wake-up itself, and a supervisor FAILED
at PREFLIGHT waited on an empty inbox forever with no /status to say why. Here the wake-up is put
behind PREFLIGHT's answer on purpose, in the real supervisor, run as PID 1 would run it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from kiln_dev import children
from kiln_dev.models import make_tiny_gguf
from kiln_dev.supervised import SELFTEST_OFF, config, free_port, http, wait_for

REPO = Path(__file__).resolve().parents[2]
WAKE_BEHIND_PREPARED = """
import sys
from supervisor.config import load_config
from supervisor.run import logs, loop

answer = loop.Supervisor._do_Prepare

def prepare_then_wake(self, fx):
    answer(self, fx)
    self.inbox.put(loop._Wake())       # a signal's wake-up, right behind PREFLIGHT's answer

loop.Supervisor._do_Prepare = prepare_then_wake
logs.setup_logging()
sys.exit(loop.run(load_config(sys.argv[1])))
"""


def test_a_wake_up_behind_the_last_answer_does_not_keep_the_status_page_down(tmp_path):
    status_port = free_port()
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(config(binary=str(tmp_path / "no-such-llama-server"), model=make_tiny_gguf(tmp_path / "m.gguf"),
                          port=free_port(), status_port=status_port, state_dir=tmp_path / "state",
                          rungs='[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\n', selftest=SELFTEST_OFF))
    log = open(tmp_path / "supervisor.log", "w")
    proc = children.spawn([sys.executable, "-c", WAKE_BEHIND_PREPARED, str(cfg)], death_signal=signal.SIGTERM,
                          stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    try:
        def failed_on_status() -> bool:
            assert proc.poll() is None, (tmp_path / "supervisor.log").read_text()
            code, body = http(f"http://127.0.0.1:{status_port}/status", timeout=2)
            return code == 200 and b'"FAILED"' in body
        wait_for(failed_on_status, 30, "FAILED on /status")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 3
    finally:
        children.stop(proc, grace_s=0)
        log.close()
