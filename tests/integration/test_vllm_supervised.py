"""The supervisor running vLLM where only a GPU shows the condition: the engine here is the stand-in
kiln_dev/fake_vllm.py, which replays what vLLM printed on the lent H200 (2026-12-01;
tests/fixtures/engine-logs/vllm-0.26.0-*.log). Everything a CPU can show runs against the real engine
in test_vllm_real.py (the argv, the key, the ladder, reload, restart, the KV-cache refusal); here only:
a forked EngineCore meeting CUDA, the multi-GPU shared-memory hang the field notes met, a real CUDA OOM, and
the stand-in's own faithfulness."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kiln_dev.supervised import FAKE_VLLM, Supervised, free_port, http, wait_for
from kiln_dev.supervised import vllm_config as shared_vllm_config
from supervisor.selftest.metrics import Counters

pytestmark = pytest.mark.slow


HELP = Path(__file__).resolve().parents[1] / "fixtures" / "engine-logs"
ONE_RUNG = '[[ladder.rungs]]\nname = "main"\nargs = ["--max-model-len", "4096"]\n'


def vllm_config(tmp: Path, model_dir: Path, *, port: int, sport: int, rungs: str = ONE_RUNG,
                snapshot: str = "vllm-0.33.0-serve-help-all.txt") -> str:
    return shared_vllm_config(model_dir=model_dir, port=port, status_port=sport, state_dir=tmp / "state",
                              rungs=rungs, snapshot=HELP / snapshot, model_lines='family = "qwen3-coder"\n',
                              ladder_options='fall_through = ["oom", "config_rejected", "stalled"]\n',
                              extra="[health]\nstall_s = 30\n")


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def test_a_fork_that_meets_cuda_is_relaunched_once_with_spawn_and_serves(tmp_path, model_dir):
    # stand-in: only a GPU makes a forked EngineCore meet an initialised CUDA
    port, sport = free_port(), free_port()
    with Supervised(tmp_path, vllm_config(tmp_path, model_dir, port=port, sport=sport),
                    env={"KILN_FAKE_SCENARIO": "vllm-ok", "KILN_FAKE_FORK_UNSAFE": "1"}) as sup:
        st = sup.wait_state("SERVING")
        environ = Path(f"/proc/{st['engine']['pid']}/environ").read_bytes().split(b"\0")
        assert b"VLLM_WORKER_MULTIPROC_METHOD=spawn" in environ
        assert st["last_failure"]["class"] == "fork_unsafe", st["last_failure"]
        relaunch = [e for e in st["history"] if e["event"] == "relaunch"]
        assert relaunch and "VLLM_WORKER_MULTIPROC_METHOD=spawn" in relaunch[0]["detail"], st["history"]
        assert sup.stop() == 0


def test_the_next_boot_starts_the_remembered_winner_with_spawn_instead_of_failing_into_it(tmp_path, model_dir):
    # stand-in: only a GPU makes a forked EngineCore meet an initialised CUDA
    env = {"KILN_FAKE_SCENARIO": "vllm-ok", "KILN_FAKE_FORK_UNSAFE": "1"}
    port, sport = free_port(), free_port()          # one config (its hash keys the memory) for both boots
    for boot, launches in ((1, 2), (2, 1)):        # the second boot: the same volume, one launch
        with Supervised(tmp_path, vllm_config(tmp_path, model_dir, port=port, sport=sport), env=env) as sup:
            st = sup.wait_state("SERVING")
            environ = Path(f"/proc/{st['engine']['pid']}/environ").read_bytes().split(b"\0")
            assert b"VLLM_WORKER_MULTIPROC_METHOD=spawn" in environ, boot
            assert st["launches"] == launches, (boot, st["launches"])
            relaunch = [e["detail"] for e in st["history"] if e["event"] == "relaunch"]
            assert relaunch and ("remembered" in relaunch[0]) is (boot == 2), relaunch
            assert sup.stop() == 0


def test_the_relaunch_with_spawn_happens_once_then_the_walk_fails_with_the_reason(tmp_path, model_dir):
    # stand-in: only a GPU makes a forked EngineCore meet an initialised CUDA
    """A stand-in that fails the same way under spawn too (no real vLLM does: the guard against a
    relaunch loop is what is tested): one relaunch, then FAILED naming fork_unsafe."""
    port, sport = free_port(), free_port()
    with Supervised(tmp_path, vllm_config(tmp_path, model_dir, port=port, sport=sport),
                    env={"KILN_FAKE_SCENARIO": "vllm-ok", "KILN_FAKE_FORK_UNSAFE": "always"}) as sup:
        st = sup.wait_state("FAILED")
        assert st["last_failure"]["class"] == "fork_unsafe"
        assert st["launches"] == 2, st["launches"]


def test_the_seeds_shared_memory_broadcast_hang_is_a_stall_not_progress(tmp_path, model_dir):
    # stand-in: the hang is a multi-GPU tensor-parallel one (the field notes' 2x A40)
    port, sport = free_port(), free_port()
    with Supervised(tmp_path, vllm_config(tmp_path, model_dir, port=port, sport=sport),
                    env={"KILN_FAKE_SCENARIO": "vllm-shm-hang"}, args=("--exit-on-failure",)) as sup:
        sup.proc.wait(30)                      # stall_s is 30 s: only the repeated line can end it sooner
        log = sup.log()
        assert "failure stalled" in log
        assert "shared-memory broadcast hang" in log or "enforce-eager" in log


def rung(name: str, args: list[str], env: dict[str, str]) -> str:
    return (f'[[ladder.rungs]]\nname = "{name}"\nargs = {json.dumps(args)}\n[ladder.rungs.env]\n'
            + "".join(f'{k} = "{v}"\n' for k, v in env.items()))


def test_the_ladder_falls_through_vllms_real_h200_oom_to_a_rung_that_serves(tmp_path, model_dir):
    # stand-in: a CUDA out-of-memory replay (the CPU's KV refusal is in test_vllm_real.py)
    # The device run of 2026-12-01 (docs/research/benchmarks-history.md): rung "too-long" asked vLLM 0.26.0 for a
    # 20M-token context, vLLM died with "torch.AcceleratorError: CUDA error: out of memory" (Kiln called
    # it `crashed` until supervisor/engines/vllm.py learnt the line), rung "fits" served. The stand-in
    # replays that engine's 187 lines for rung 1 and a real boot's start-up for rung 2.
    rungs = (rung("too-long", ["--max-model-len", "20000000", "--enforce-eager"],
                  {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "KILN_FAKE_SCENARIO": "vllm-oom-h200"})
             + rung("fits", ["--max-model-len", "4096", "--gpu-memory-utilization", "0.85"],
                    {"KILN_FAKE_SCENARIO": "vllm-ok"}))
    port, sport = free_port(), free_port()
    with Supervised(tmp_path, vllm_config(tmp_path, model_dir, port=port, sport=sport, rungs=rungs,
                                          snapshot="vllm-0.26.0-serve-help-all-h200.txt")) as sup:
        st = sup.wait_state("SERVING")
        assert st["rung"]["name"] == "fits" and st["launches"] == 2 and st["failures"] == {"oom": 1}
        f = st["last_failure"]
        # what the H200's /status said (docs/research/device-run-2026-12-01/call11/status-A.json)
        assert (f["class"], f["reason"], f["exit_code"], f["rung"]) == ("oom", "CUDA out of memory (torch)", 1, "too-long")
        assert f["evidence"] == ("(EngineCore pid=8054) ERROR 12-01 10:23:47 [core.py:1330] "
                                 "torch.AcceleratorError: CUDA error: out of memory")
        assert f["stderr_tail"][-1].endswith("RuntimeError: Engine core initialization failed. See root cause "
                                             "above. Failed core proc(s): {}")
        events = [h["event"] for h in st["history"]]
        assert events[events.index("failure"):] == ["failure", "reclaim", "LAUNCHING", "LOADING", "HEALTHY", "SERVING"]
        assert http(f"http://127.0.0.1:{port}/health") == (200, b"")
        assert sup.stop() == 0
    memory = json.loads((tmp_path / "state" / "ladder-memory.json").read_text())
    assert [v["rung"] for v in memory.values()] == ["fits"]


def test_the_stand_in_binds_answers_and_counts_as_vllm_0_26_0_does(tmp_path):
    # stand-in: the stand-in's own check, against what the real 0.26.0 did on the H200
    # vLLM binds its port before it builds the engine and listens only once uvicorn runs
    # (entrypoints/openai/api_server.py: setup_server): while "loading", the port is taken and refused.
    port = free_port()
    log = tmp_path / "engine.log"
    env = {**os.environ, "KILN_FAKE_SCENARIO": "vllm-ok", "KILN_FAKE_LOAD_S": "30"}
    with open(log, "w") as out:
        p = subprocess.Popen([sys.executable, str(FAKE_VLLM), "serve", "/models/m", "--host", "127.0.0.1",
                              "--port", str(port), "--served-model-name", "m"], env=env, stdout=out)
    try:
        wait_for(lambda: "Initializing a V1 LLM engine" in log.read_text(), 10, "the engine's first line")
        with socket.socket() as s, pytest.raises(OSError) as taken:
            s.bind(("127.0.0.1", port))
        assert taken.value.errno == errno.EADDRINUSE
        assert http(f"http://127.0.0.1:{port}/health", timeout=2)[0] == 0          # refused: not listening
        assert "Starting vLLM server" not in log.read_text()
    finally:
        p.kill()
        p.wait(10)
    env["KILN_FAKE_LOAD_S"] = "0.01"
    with open(log, "w") as out:
        p = subprocess.Popen([sys.executable, str(FAKE_VLLM), "serve", "/models/m", "--host", "127.0.0.1",
                              "--port", str(port), "--served-model-name", "m"], env=env, stdout=out)
    try:
        wait_for(lambda: http(f"http://127.0.0.1:{port}/health", timeout=1) == (200, b""), 10, "/health 200")
        text = log.read_text()
        assert f"Starting vLLM server on http://127.0.0.1:{port}" in text and "Application startup complete." in text
        code, body = http(f"http://127.0.0.1:{port}/metrics")
        c = Counters.from_text(body.decode())          # the names Kiln's selftest and benches read
        assert code == 200 and (c.decode_tokens, c.decode_seconds, c.prompt_tokens, c.prompt_seconds,
                                c.prompt_tokens_cached) == (0.0, 0.0, 0.0, 0.0, 0.0)
        assert c.spec_drafts is None                    # only a speculating vLLM has those
        assert http(f"http://127.0.0.1:{port}/v2/nothing") == (404, b'{"detail":"Not Found"}')
        assert '"GET /health HTTP/1.1" 200 OK' in log.read_text()
        p.terminate()
        assert p.wait(10) == 0
        text = log.read_text()                          # the real shutdown's lines, then exit 0
        assert "EngineCore: trigger received signal=SIGTERM" in text and "Application shutdown complete." in text
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_a_launch_that_already_ran_with_spawn_is_not_relaunched_into_the_same_failure(tmp_path, model_dir):
    # stand-in: only a GPU makes a forked EngineCore meet an initialised CUDA
    port, sport = free_port(), free_port()
    rungs = ('[[ladder.rungs]]\nname = "main"\nargs = ["--max-model-len", "4096"]\n'
             '[ladder.rungs.env]\nVLLM_WORKER_MULTIPROC_METHOD = "spawn"\n')
    with Supervised(tmp_path, vllm_config(tmp_path, model_dir, port=port, sport=sport, rungs=rungs),
                    env={"KILN_FAKE_SCENARIO": "vllm-ok", "KILN_FAKE_FORK_UNSAFE": "always"}) as sup:
        st = sup.wait_state("FAILED")
        assert st["last_failure"]["class"] == "fork_unsafe" and st["launches"] == 1, st["launches"]
        assert not [e for e in st["history"] if e["event"] == "relaunch"]
