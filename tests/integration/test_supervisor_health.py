"""Health waits with a progress-based deadline, port conflicts and signal forwarding, with the real
supervisor. The stand-in (kiln_dev/fake_llama_server.py) stands for a llama-server that hangs
while loading, or loads slowly but visibly: conditions a healthy CPU build will not produce on cue."""

from __future__ import annotations

import signal
import socket

import pytest

from kiln_dev.supervised import FAKE, Supervised, config, free_port, wait_for

pytestmark = pytest.mark.llama



def start(tmp_path, prefix, tiny, env, *, stall_s, binary=None, port=None, args=("--exit-on-failure",), max_s=0):
    rungs = '[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "512"]\n'
    text = config(binary=binary or str(FAKE), model=str(tiny), port=port or free_port(), status_port=free_port(),
                  state_dir=tmp_path / "state", rungs=rungs, snapshot=str(prefix / "share/kiln/llama-server.help.txt"))
    text = text.replace("stall_s = 20", f"stall_s = {stall_s}\nmax_s = {max_s}")
    return Supervised(tmp_path, text, env=env, args=args)


def test_a_server_that_stops_making_progress_is_stalled_not_waited_out(tmp_path, prefix, tiny):
    with start(tmp_path, prefix, tiny, {"KILN_FAKE_SCENARIO": "hang-loading"}, stall_s=1.5) as sup:
        code = sup.proc.wait(60)
        log = sup.log()
        assert "failure stalled" in log and "no loading progress" in log and "within health.stall_s (1.5 s)" in log
        assert code != 0


def test_a_load_that_reaches_health_max_s_is_reported_as_max_s_not_as_no_progress(tmp_path, prefix, tiny):
    # Was: "no loading progress ... within the stall deadline", naming the wrong setting for a model
    # that was loading visibly all along and ran into health.max_s.
    env = {"KILN_FAKE_SCENARIO": "slow-loading-progress", "KILN_FAKE_LOAD_S": "60", "KILN_FAKE_DOT_S": "0.2"}
    with start(tmp_path, prefix, tiny, env, stall_s=1.5, max_s=2.5) as sup:
        code = sup.proc.wait(60)
        log = sup.log()
        assert "failure stalled" in log and "health.max_s (2.5 s) reached while still loading" in log, log
        assert "no loading progress" not in log
        assert code != 0


def test_a_slow_load_that_keeps_making_progress_is_not_stalled(tmp_path, prefix, tiny):
    # 4 s of visible loading progress against a 1.5 s stall deadline: progress moves the deadline.
    env = {"KILN_FAKE_SCENARIO": "slow-loading-progress", "KILN_FAKE_LOAD_S": "4", "KILN_FAKE_DOT_S": "0.2"}
    with start(tmp_path, prefix, tiny, env, stall_s=1.5, args=()) as sup:
        st = sup.wait_state("SERVING", timeout=60)
        assert st["timings"]["last_load_s"] >= 3.5
        assert sup.stop() == 0


def test_a_load_that_only_busy_spins_a_cpu_is_a_stall_that_says_so(tmp_path, prefix, tiny):
    # Was: CPU time counted as loading progress, so an engine spinning a core without a word (a hung NCCL
    # start-up) was never stalled: with stall_s 1.5 it sat in LOADING for as long as one watched (issue 24).
    with start(tmp_path, prefix, tiny, {"KILN_FAKE_SCENARIO": "spin-loading"}, stall_s=1.5) as sup:
        assert sup.proc.wait(60) != 0
        log = sup.log()
        assert "failure stalled" in log and "kept a CPU busy and printed nothing, read nothing" in log
        assert "health.stall_s = 1.5" in log


def test_a_cpu_phase_shorter_than_the_stall_deadline_still_counts_as_loading(tmp_path, prefix, tiny):
    # CPU alone counts for stall_s after the last output: 4 s of silent CPU against stall_s 3 loads
    # (the deadline would have fired at 3 s if CPU never counted, and fires at 6 s for a spin).
    env = {"KILN_FAKE_SCENARIO": "spin-loading", "KILN_FAKE_SPIN_S": "4"}
    with start(tmp_path, prefix, tiny, env, stall_s=3, args=()) as sup:
        st = sup.wait_state("SERVING", timeout=60)
        assert st["timings"]["last_load_s"] >= 3.5 and not st["failures"]
        assert sup.stop() == 0


def test_a_busy_port_is_port_in_use_before_any_engine_starts_and_terminal(tmp_path, prefix, tiny):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        with start(tmp_path, prefix, tiny, {}, stall_s=10, binary=str(prefix / "bin/llama-server"), port=busy) as sup:
            assert sup.proc.wait(60) == 3                 # nothing ran: the listener is not our engine
            log = sup.log()
            assert "failure port_in_use" in log and "not our engine" in log and "pid" in log


def test_sighup_is_forwarded_to_the_engine(tmp_path, prefix, tiny):
    # the stand-in logs every signal it catches once serving ("ignore-sigterm" logs and survives)
    with start(tmp_path, prefix, tiny, {"KILN_FAKE_SCENARIO": "ignore-sigterm"}, stall_s=10, args=()) as sup:
        sup.wait_state("SERVING")
        sup.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "forwarding to the engine" in sup.log(), 10, "the supervisor to forward SIGHUP")
        # the stand-in has no SIGHUP handler, so the default action ends it: proof it got the signal
        st = wait_for(lambda: (s := sup.status()) and s["last_failure"] and s, 15, "the engine's death by SIGHUP")
        assert "SIGHUP" in st["last_failure"]["reason"]
        assert sup.proc.poll() is None                     # the supervisor itself carries on
        sup.stop(signal.SIGKILL)
