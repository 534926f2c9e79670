"""The supervisor running the vLLM engine. vLLM cannot run on these CPU machines; the engine here
is kiln_dev/fake_vllm.py standing for `vllm serve` 0.26.0 as it ran on the lent H200 (2026-12-01):
it prints what the real one printed (tests/fixtures/engine-logs/vllm-0.26.0-*.log), binds and
answers /health as vLLM does, and replays the real CUDA OOM of a rung that cannot fit and the
start-up hang the seed recorded. What is proven is the supervisor's side: argv, the API key kept out
of argv, the real OOM classified and fallen through to a rung that serves, a repeated hang line
classified as a stall."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiln_dev.supervised import FAKE_VLLM, SELFTEST_OFF, Supervised, free_port, http

pytestmark = pytest.mark.slow


HELP = Path(__file__).resolve().parents[1] / "fixtures" / "engine-logs"
ONE_RUNG = '[[ladder.rungs]]\nname = "main"\nargs = ["--max-model-len", "4096"]\n'


def vllm_config(tmp: Path, model_dir: Path, *, port: int, sport: int, rungs: str = ONE_RUNG,
                snapshot: str = "vllm-0.27.1-serve-help-all.txt") -> str:
    return f"""
engine = "vllm"
state_dir = "{tmp / 'state'}"
[model]
source = "{model_dir}"
entry = "config.json"
family = "qwen3-coder"
[server]
host = "127.0.0.1"
port = {port}
binary = "{FAKE_VLLM}"
flag_snapshot = "{HELP / snapshot}"
[ladder]
fall_through = ["oom", "config_rejected", "stalled"]
{rungs}
[health]
stall_s = 30
{SELFTEST_OFF}
[status]
host = "127.0.0.1"
port = {sport}
"""


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def test_vllm_serves_with_the_key_in_its_environment_not_its_argv(tmp_path, model_dir):
    port, sport = free_port(), free_port()
    with Supervised(tmp_path, vllm_config(tmp_path, model_dir, port=port, sport=sport),
                    env={"KILN_FAKE_SCENARIO": "vllm-ok", "KILN_API_KEY": "vllm-canary-key"}) as sup:
        st = sup.wait_state("SERVING")
        assert http(f"http://127.0.0.1:{port}/health") == (200, b"")          # vLLM's: an empty 200
        argv = st["engine"]["argv"]
        assert argv[1:3] == ["serve", str(model_dir)] and "--api-key" not in argv
        assert argv[argv.index("--served-model-name") + 1] == "model"
        environ = Path(f"/proc/{st['engine']['pid']}/environ").read_bytes().split(b"\0")
        assert b"VLLM_API_KEY=vllm-canary-key" in environ
        assert "vllm-canary-key" not in json.dumps(st)
        assert sup.stop() == 0


def test_the_seeds_shared_memory_broadcast_hang_is_a_stall_not_progress(tmp_path, model_dir):
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
    # The device run of 2026-12-01 (docs/benchmarks.md): rung "too-long" asked vLLM 0.26.0 for a
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
