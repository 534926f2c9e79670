"""The plan checks itself after boot (issue 39): a pod booted from a deploy config with the plan's
[plan] predictions shows, once its selftest has run, each prediction beside what it measured on
/status and /metrics — here the real vLLM CPU build's KV cache tokens (predicted by supervisor/plan
from config.json) and the selftest's decode, and on a host with no GPU, memory said to be unmeasured.
The vLLM boot also shows what vLLM printed of its own sizing (issue 52): its KV cache in tokens and
GiB, read from its lines as the supervisor's log has them, and carried into a measured row."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from images.plan import measured, speed
from kiln_dev import vllm_cpu
from kiln_dev.engine import llama_server_binary
from kiln_dev.models import smollm2_gguf
from kiln_dev.supervised import Supervised, config, free_port, http
from supervisor.model.gguf_layout import read_header
from supervisor.plan import memory, shape

KEY = "plan-selfcheck-canary-key"
SELFTEST = ('[selftest]\nprobes = "smollm2"\ndecode_tokens = 16\nprefill_tokens = 128\nrequest_wall_s = 60\n'
            'timeout_s = 300\n')
BOOT_S = 240
REPO = Path(__file__).resolve().parents[2]


def _metric(text: str, name: str, quantity: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f'kiln_{name}{{quantity="{quantity}"}} '):
            return float(line.split()[-1])
    return None


def test_vllm_kv_tokens_and_decode_predicted_beside_measured(tmp_path):
    model = vllm_cpu.require_model("smollm2")
    predicted = memory.vllm_cpu_kv_tokens(shape.from_config(json.loads((model / "config.json").read_text()),
                                                            weights_bytes=0), 1)
    port, sport = free_port(), free_port()
    text = f"""
engine = "vllm"
state_dir = "{tmp_path / 'state'}"
[model]
source = "{model}"
entry = "config.json"
family = "smollm2"
[server]
host = "127.0.0.1"
port = {port}
binary = "{vllm_cpu.require_vllm()}"
flag_snapshot = "{vllm_cpu.snapshot_file()}"
[ladder]
[[ladder.rungs]]
name = "eager"
args = ["--max-model-len", "2048", "--enforce-eager"]
[ladder.rungs.env]
VLLM_CPU_KVCACHE_SPACE = "1"
[health]
stall_s = 180
max_s = 600
{SELFTEST}
[plan]
gpu = "cpu"
cards = 1
kv_tokens = {predicted}
decode_tok_s = 1000.0
basis = "a deliberately high prediction, to be seen against the measurement"
[status]
host = "127.0.0.1"
port = {sport}
"""
    with Supervised(tmp_path, text, env={"KILN_API_KEY": KEY}) as sup:
        st = sup.wait_state("SERVING", "FAILED", timeout=BOOT_S)
        assert st["state"] == "SERVING", sup.log()[-3000:]
        checks = st["plan"]["checks"]
        assert checks["kv_tokens"] == {"predicted": predicted, "measured": 46592, "error_pct": 0.0,
                                       "source": "the engine's own log"}
        decode = checks["decode_tok_s"]
        assert decode["measured"] == st["selftest"]["decode_tok_s"] > 0 and decode["error_pct"] > 0
        code, body = http(sup.url("/metrics"))
        assert code == 200
        metrics = body.decode()
        assert _metric(metrics, "plan_predicted", "kv_tokens") == predicted
        assert _metric(metrics, "plan_measured", "kv_tokens") == 46592
        assert _metric(metrics, "plan_measured", "decode_tok_s") == decode["measured"]

        # What the engine printed of its sizing, as the supervisor's log has its lines (vllm-cpu 0.32.0:
        # cpu_worker.py "Explicitly set (1.0/T) GiB for KV cache on node 0.", kv_cache_utils.py "CPU KV
        # cache size: 46,592 tokens, ..."), on /status and /metrics; no CUDA graphs on a CPU.
        log = sup.log()
        printed_tokens = re.findall(r"CPU KV cache size: ([\d,]+) tokens", log)
        printed_gib = re.findall(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache", log)
        assert len(printed_tokens) == len(printed_gib) == 1, log[-3000:]
        assert checks["kv_tokens"]["measured"] == int(printed_tokens[0].replace(",", ""))
        assert checks["kv_cache_gib"] == {"predicted": None, "measured": float(printed_gib[0]), "error_pct": None,
                                          "source": "the engine's own log"}
        assert "cuda_graph_gib" not in checks and "suggested_kv_cache_gib" not in checks
        assert _metric(metrics, "plan_measured", "kv_cache_gib") == float(printed_gib[0]) == 1.0

        # the measured row carries them
        row = measured.row_from_status(st, match=("smollm2",), where=sup.url("/status"))
        assert (row.engine, row.kv_tokens, row.kv_cache_gib) == ("vllm", 46592, 1.0)


def test_without_a_gpu_memory_is_said_to_be_unmeasured_and_decode_is_checked(tmp_path, monkeypatch):
    port, sport = free_port(), free_port()
    rung = '[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "2048"]\n'
    plan = '[plan]\ngpu = "NVIDIA A40"\ncards = 1\ncard_mib = 400\ndecode_tok_s = 50.0\nbasis = "upper bound"\n'
    text = config(binary=llama_server_binary(), model=smollm2_gguf(), port=port, status_port=sport,
                  state_dir=tmp_path / "state", rungs=rung, selftest=SELFTEST, extra=plan)
    with Supervised(tmp_path, text, env={"KILN_API_KEY": KEY}) as sup:
        st = sup.wait_state("SERVING", "FAILED", timeout=BOOT_S)
        assert st["state"] == "SERVING", sup.log()[-3000:]
        checks = st["plan"]["checks"]
        assert checks["card_mib"]["measured"] is None and "no GPU" in checks["card_mib"]["source"]
        assert checks["decode_tok_s"]["measured"] == st["selftest"]["decode_tok_s"] > 0
        assert "upper bound" in checks["decode_tok_s"]["source"]
        _, body = http(sup.url("/metrics"))
        assert _metric(body.decode(), "plan_predicted", "card_mib") == 400
        assert _metric(body.decode(), "plan_measured", "card_mib") is None

        # bench/ appends the measurement to the rows the planner reads; the planner then prefers it.
        data = tmp_path / "measured.json"
        r = subprocess.run([sys.executable, "bench/plan_record.py", "--status", sup.url("/status"),
                            "--match", "smollm2", "--data", str(data)], cwd=REPO, capture_output=True, text=True,
                           check=False)
        assert r.returncode == 0, r.stderr
        assert "predicted/measured" in r.stdout
    monkeypatch.setattr(measured, "DATA", data)
    s = shape.from_gguf([read_header(smollm2_gguf())])
    got = speed.estimate(s, smollm2_gguf().name, engine="llamacpp", gpu="NVIDIA A40", count=1, resident=True,
                         streams=1)
    assert got.measured and got.decode_1 == st["selftest"]["decode_tok_s"] and "Kiln's measurement" in got.basis
