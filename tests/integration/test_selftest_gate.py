"""The gate (the selftest as a Serverless worker's cold start runs it: supervisor/selftest/runner.py)
against a real llama-server: SmolLM2 passes it as it passes the full selftest, and SmolLM2 damaged
on purpose (kiln_dev/damage.py: tensors overwritten with noise, zeros or their own blocks shuffled,
so the file still loads) is refused by it, blatant or fluent. Through the real supervisor, a worker
serving a damaged model never says healthy."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kiln_dev.damage import damage_gguf
from kiln_dev.llama_server import LlamaServer
from kiln_dev.models import smollm2_gguf
from kiln_dev.supervised import Supervised, config, free_port
from supervisor.config import SelftestSpec
from supervisor.selftest.client import Client
from supervisor.selftest.runner import GATE_DECODE_TOKENS, GATE_PREFILL_TOKENS, run_selftest

pytestmark = [pytest.mark.llama, pytest.mark.slow]
SPEC = SelftestSpec(probes="smollm2", decode_tokens=128, prefill_tokens=1024, request_wall_s=60, timeout_s=600)

# name -> (tensors, how, fraction): each loads, each answers badly in its own way (measured on
# SmolLM2-135M Q4_1, 2026-12-01): dots, dashes, word salad, and fluent English with wrong answers.
DAMAGES = {
    "noise-ffn-down": (r"ffn_down", "noise", 0.05),            # "................"
    "zeros-attn-output": (r"attn_output", "zeros", 1.0),        # "----------------"
    "shuffled-ffn-gate": (r"blk\.([0-9]|1[0-5])\.ffn_gate", "shuffle", 1.0),   # non-words
    "shuffled-two-layers": (r"blk\.(4|5)\.ffn_down", "shuffle", 1.0),          # fluent, and wrong
}


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("damaged")
    out = {}
    for name, (tensors, how, fraction) in DAMAGES.items():
        out[name] = root / f"{name}.gguf"
        assert damage_gguf(smollm2_gguf(), out[name], tensors=tensors, how=how, fraction=fraction, seed=1)
    return out


def test_smollm2_passes_the_gate_as_it_passes_the_full_selftest_and_the_gate_measures_less(prefix):
    with LlamaServer(prefix, smollm2_gguf()) as srv:
        full = run_selftest(Client(srv.url, engine="llamacpp"), SPEC, family="smollm2")
        gate = run_selftest(Client(srv.url, engine="llamacpp"), SPEC, family="smollm2", gate=True)
    assert full.passed and gate.passed, (full.failures, gate.failures)
    assert (full.mode, full.probe_width, gate.mode, gate.probe_width) == ("full", 1, "gate", 4)   # 4 slots: -np auto
    assert [p.probe.name for p in gate.probes] == [p.probe.name for p in full.probes]
    assert full.decode.tokens >= 128 and GATE_DECODE_TOKENS <= gate.decode.tokens < 128
    assert full.prefill.cold.total_tokens >= 1024 and GATE_PREFILL_TOKENS <= gate.prefill.cold.total_tokens < 1024
    assert gate.prefill.warm_skipped and gate.prefill.prefix_cache is True and full.prefill.warm_wall_s is not None
    assert all(s.metrics is None for s in gate.decode.samples)          # llama.cpp's timings count it: no scrape
    assert gate.decode.error_pct is not None and abs(gate.decode.error_pct) < 5


def test_a_decode_floor_is_settled_as_soon_as_the_rate_leaves_no_doubt(prefix):
    spec = SelftestSpec(probes="smollm2", decode_tokens=2000, min_decode_tok_s=0.5, prefill_tokens=0,
                        request_wall_s=60, timeout_s=600)
    with LlamaServer(prefix, smollm2_gguf()) as srv:
        r = run_selftest(Client(srv.url, engine="llamacpp"), spec, family="smollm2", gate=True)
    assert r.passed, r.failures
    assert r.decode.settled and "the floor (0.5)" in r.decode.settled and r.decode.tokens < 2000


@pytest.mark.parametrize("name", list(DAMAGES))
def test_a_damaged_model_loads_and_the_gate_refuses_it(prefix, damaged, name):
    with LlamaServer(prefix, damaged[name]) as srv:                     # healthy: it loaded
        r = run_selftest(Client(srv.url, engine="llamacpp"), SPEC, family="smollm2", gate=True)
        if name == "shuffled-two-layers":                                # the fluent one: the full selftest agrees
            full = run_selftest(Client(srv.url, engine="llamacpp"), SPEC, family="smollm2")
            assert not full.passed and "fatal probe(s) failed: code-add" in full.failures
    assert not r.passed and "fatal probe(s) failed: code-add" in r.failures, r.table()
    assert r.decode is None and r.prefill is None                       # nothing measured on such output
    assert r.probe_width == 4


def test_a_serverless_worker_serving_a_damaged_model_never_says_healthy(tmp_path, prefix, damaged):
    health = free_port()
    text = config(binary=str(prefix / "bin/llama-server"), model=str(damaged["shuffled-two-layers"]), port=free_port(),
                  status_port=health, state_dir=tmp_path / "vol", snapshot=str(prefix / "share/kiln/llama-server.help.txt"),
                  selftest='[selftest]\nprobes = "smollm2"\n',
                  rungs='[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "4096"]\n')
    env = {"PORT": str(free_port()), "PORT_HEALTH": str(health), "KILN_API_KEY": "k-gate-canary",
           "KILN_SERVERLESS_EXIT_GRACE_S": "600"}
    codes: list[int] = []
    done = threading.Event()
    with Supervised(tmp_path, text, env=env) as sup:
        def poll() -> None:
            while not done.is_set():
                try:
                    with urllib.request.urlopen(sup.url("/ping"), timeout=5) as resp:
                        codes.append(resp.status)
                except urllib.error.HTTPError as e:
                    codes.append(e.code)
                except OSError:
                    pass
                done.wait(0.05)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        st = sup.wait_state("FAILED", timeout=300)
        done.set()
        poller.join(10)
        assert st["last_failure"]["class"] == "selftest_failed"
        assert st["selftest"]["mode"] == "gate" and st["selftest"]["probe_width"] == 4
        assert 200 not in codes and codes and set(codes) <= {204, 503}, sorted(set(codes))
        assert sup.stop() == 3
