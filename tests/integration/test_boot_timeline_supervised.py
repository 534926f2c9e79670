"""The boot timeline on /status, /metrics and the page, from a real supervisor: with the real
llama-server (CPU build, a tiny real GGUF) and with the vLLM stand-in replaying vLLM 0.26.0's
recorded H200 boot (kiln_dev/fake_vllm.py). Each phase is there, in order, adding up to the boot; a
restart starts a new timeline and keeps the boot before it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from kiln_dev.supervised import Supervised, config, free_port, http, vllm_config, wait_for
from supervisor.engines import llamacpp, vllm

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "engine-logs"
SUPERVISOR = ["supervisor_start", "preflight", "fetch", "launch", "engine_exec"]


def phases(boot: dict) -> list[str]:
    return [p["phase"] for p in boot["phases"]]


def engine_phases_in(names: list[str], before: list[str]) -> bool:
    """`before`, then llama.cpp's phases in order; the last ("health", its "listening on" line) may
    be missing: /health passes before llama.cpp prints it (engines/llamacpp.py PHASES)."""
    every = before + [name for name, _ in llamacpp.PHASES]
    return names in (every, every[:-1])


def adds_up(boot: dict) -> None:
    ps = boot["phases"]
    for a, b in zip(ps, ps[1:]):
        assert b["start_s"] == pytest.approx(a["start_s"] + a["seconds"], abs=0.002)
    assert sum(p["seconds"] for p in ps) == pytest.approx(boot["seconds"], abs=0.002 * len(ps))


@pytest.mark.llama
def test_a_real_llama_server_boot_shows_every_phase_and_a_restart_starts_a_new_timeline(tmp_path, prefix, tiny):
    port, sport = free_port(), free_port()
    rungs = '[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "512"]\n'
    text = config(binary=prefix / "bin" / "llama-server", model=tiny, port=port, status_port=sport,
                  state_dir=tmp_path / "state", rungs=rungs, snapshot=prefix / "share/kiln/llama-server.help.txt",
                  extra="[restart]\nbackoff_initial_s = 0.1\n")
    with Supervised(tmp_path, text) as sup:
        st = sup.wait_state("SERVING")
        boot = st["boot"]
        assert engine_phases_in(phases(boot), SUPERVISOR)
        assert (boot["n"], boot["cause"], boot["outcome"]) == (1, "boot", "ready")
        assert boot["phases"][0]["start_s"] == 0.0 and boot["phases"][1]["start_s"] > 0   # the interpreter, the imports
        weights = next(p for p in boot["phases"] if p["phase"] == "weights")
        assert weights["rung"] == "cpu" and "load_model: loading model" in weights["line"]
        adds_up(boot)
        # ready: the boot's seconds are the supervisor's start to SERVING, the timings' figure plus the imports
        assert boot["seconds"] >= st["timings"]["boot_to_ready_s"]

        metrics = http(sup.url("/metrics"))[1].decode()
        for name in phases(boot):
            assert f'kiln_boot_phase_seconds{{boot="current",phase="{name}"}} ' in metrics
        assert 'kiln_boot_seconds{boot="current",cause="boot",outcome="ready"} ' in metrics
        page = http(sup.url("/"))[1].decode()
        assert "Boot 1 (boot): ready" in page and "<td>weights</td>" in page

        os.kill(st["engine"]["pid"], signal.SIGKILL)          # a crash while serving: the restart's own timeline
        wait_for(lambda: (s := sup.status()) and s["state"] == "SERVING" and s["boot"]["n"] == 2, 60,
                 "the restart served")
        again = sup.status()["boot"]
        assert again["cause"] == "restart" and again["outcome"] == "ready"
        assert engine_phases_in(phases(again), ["restart_backoff", "reclaim", "launch", "engine_exec"])
        assert again["previous"]["n"] == 1 and phases(again["previous"]) == phases(boot)
        adds_up(again)
        assert sup.stop() == 0


@pytest.mark.slow
def test_the_vllm_stand_ins_recorded_boot_shows_vllms_own_phases(tmp_path):
    # stand-in: CUDA graph capture and the GPU warm-up happen on a GPU only (the CPU boot: test_vllm_real.py)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    port, sport = free_port(), free_port()
    text = vllm_config(model_dir=model, port=port, status_port=sport, state_dir=tmp_path / "state",
                       snapshot=LOGS / "vllm-0.26.0-serve-help-all-h200.txt",
                       rungs='[[ladder.rungs]]\nname = "fits"\nargs = ["--max-model-len", "4096"]\n')
    with Supervised(tmp_path, text, env={"KILN_FAKE_SCENARIO": "vllm-ok", "KILN_FAKE_LOAD_S": "0.3"}) as sup:
        boot = sup.wait_state("SERVING")["boot"]
        assert phases(boot) == SUPERVISOR + [name for name, _ in vllm.PHASES]
        engine_core = next(p for p in boot["phases"] if p["phase"] == "engine_core")
        # the stand-in's 0.3 s "building the engine" pause lands in this phase (its bounds are the times
        # the supervisor read the lines around it, so a little of it can fall outside)
        assert engine_core["seconds"] >= 0.2
        assert engine_core["line"].startswith("(EngineCore pid=8801) INFO 12-01 10:25:37 [core.py:116] Initializing")
        adds_up(boot)
        metrics = http(sup.url("/metrics"))[1].decode()
        assert 'kiln_boot_phase_seconds{boot="current",phase="cuda_graphs"} ' in metrics
        assert json.loads(http(sup.url("/status"))[1])["boot"]["previous"] is None
        assert sup.stop() == 0
