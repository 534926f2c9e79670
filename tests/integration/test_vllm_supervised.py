"""The supervisor running the vLLM engine. vLLM cannot run on these CPU machines; the engine here
is kiln_dev/fake_llama_server.py standing for `vllm serve` (it speaks /health like vLLM and
replays the start-up hang the seed recorded), so what is proven is the supervisor's side: argv,
the API key kept out of argv, and a repeated hang line classified as a stall."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiln_dev.supervised import FAKE, SELFTEST_OFF, Supervised, free_port

pytestmark = pytest.mark.slow


def vllm_config(tmp: Path, model_dir: Path, *, port: int, sport: int) -> str:
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
binary = "{FAKE}"
flag_snapshot = "{Path(__file__).resolve().parents[1] / 'fixtures/engine-logs/vllm-0.27.1-serve-help-all.txt'}"
[ladder]
fall_through = ["oom", "config_rejected", "stalled"]
[[ladder.rungs]]
name = "main"
args = ["--max-model-len", "4096"]
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
                    env={"KILN_FAKE_SCENARIO": "ok", "KILN_API_KEY": "vllm-canary-key"}) as sup:
        st = sup.wait_state("SERVING")
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
