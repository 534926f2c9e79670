"""The model prefetch from a real supervisor: with the real llama-server (CPU build, a tiny real
GGUF) every byte of the model is read beside the engine's start and /status says so; with direct
I/O it is skipped and says why, and the engine still serves; the vLLM stand-in's model directory
has its safetensors read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiln_dev.supervised import Supervised, config, free_port, http, vllm_config, wait_for


def served(sup: Supervised) -> dict:
    st = sup.wait_state("SERVING")
    # the last stream reports once it ends; the engine can be up before that on a fast disk
    wait_for(lambda: (sup.status() or {}).get("prefetch", {}).get("state") != "reading", 30, "the prefetch ended")
    return sup.status() or st


@pytest.mark.llama
@pytest.mark.parametrize("args,expect", [(["-t", "1", "-c", "512"], "done"),
                                         (["-t", "1", "-c", "512", "-lm", "dio"], "skipped")])
def test_the_real_llama_server_boots_with_the_model_read_ahead_or_says_why_not(tmp_path, prefix, tiny, args, expect):
    port, sport = free_port(), free_port()
    rungs = f'[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = {args!r}\n'.replace("'", '"')
    text = config(binary=prefix / "bin" / "llama-server", model=tiny, port=port, status_port=sport,
                  state_dir=tmp_path / "state", rungs=rungs, snapshot=prefix / "share/kiln/llama-server.help.txt")
    with Supervised(tmp_path, text) as sup:
        st = served(sup)
        pf = st["prefetch"]
        assert pf["state"] == expect, pf
        if expect == "done":
            size = tiny.stat().st_size
            assert (pf["files"], pf["bytes"], pf["read_bytes"], pf["streams"]) == (1, size, size, 1)
            assert any(h["event"] == "prefetch" for h in st["history"])
            metrics = http(sup.url("/metrics"))[1].decode()
            assert f"kiln_model_prefetch_read_bytes {size}" in metrics and "kiln_model_prefetch_seconds " in metrics
        else:
            assert "direct I/O" in pf["note"]
        assert sup.stop() == 0


@pytest.mark.slow
def test_the_vllm_stand_ins_safetensors_are_read_and_a_switch_turns_it_off(tmp_path):
    # stand-in: Kiln's read ahead is what is tested; the stand-in boots in a second, the real engine in 30
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    shards = [model / f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    for s in shards:
        s.write_bytes(os.urandom(3 << 20))
    for off, state in ((False, "done"), (True, "skipped")):
        port, sport = free_port(), free_port()
        text = vllm_config(model_dir=model, port=port, status_port=sport, state_dir=tmp_path / "state",
                           rungs='[[ladder.rungs]]\nname = "fits"\nargs = ["--max-model-len", "4096"]\n')
        env = {"KILN_FAKE_SCENARIO": "vllm-ok", **({"KILN_STARTUP_PREFETCH": "false"} if off else {})}
        with Supervised(tmp_path, text, env=env) as sup:
            pf = served(sup)["prefetch"]
            assert pf["state"] == state, pf
            if state == "done":
                assert (pf["files"], pf["read_bytes"]) == (2, sum(s.stat().st_size for s in shards))
            else:
                assert pf["note"] == "[startup] prefetch = false"
            assert sup.stop() == 0
