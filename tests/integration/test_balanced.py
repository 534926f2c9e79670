"""A balanced rung plans a two-GPU split from the model's layout and free VRAM, and calibrates it
from the engine's shortfall lines, with the real supervisor. Two stand-ins, because a CPU has no
GPUs: tests/support/hw/nvidia-smi (NVIDIA's tool, replaying its CSV: two A40s with 50 MiB free
each) and kiln_dev/fake_llama_server.py's vram-budget scenario (a multi-GPU CUDA build:
allocates weights, KV and the compute/output buffers a planner cannot see, per card, and prints
llama.cpp's own cudaMalloc failure line; when everything fits it execs the real llama-server)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiln_dev.engine import require_prefix
from kiln_dev.models import make_tiny_gguf
from kiln_dev.supervised import FAKE, Supervised, config, free_port

pytestmark = pytest.mark.llama
HW = Path(__file__).resolve().parents[1] / "support" / "hw"


def test_balanced_split_calibrates_from_shortfalls_and_serves_on_both_cards(tmp_path):
    prefix = require_prefix()
    model = make_tiny_gguf(tmp_path / "m.gguf", n_layers=16, width=384)
    rungs = ('[[ladder.rungs]]\nname = "balanced"\nplacement = "balanced"\nargs = ["-t", "1", "-c", "256"]\n'
             'reserve_mib = 0\ncalibration_slack_mib = 1\n')
    text = config(binary=str(FAKE), model=str(model), port=free_port(), status_port=free_port(),
                  state_dir=tmp_path / "state", rungs=rungs, snapshot=str(prefix / "share/kiln/llama-server.help.txt"))
    env = {"PATH": f"{HW}:{os.environ['PATH']}", "KILN_FAKE_SMI": "a40x2", "KILN_FAKE_SMI_USED": "46018,46018",
           "KILN_FAKE_SCENARIO": "vram-budget", "KILN_FAKE_VRAM_MIB": "50,50", "KILN_FAKE_OVERHEAD_MIB": "4,14",
           "KILN_FAKE_REAL_BINARY": str(prefix / "bin/llama-server")}
    with Supervised(tmp_path, text, env=env) as sup:
        st = sup.wait_state("SERVING", timeout=60)
        rounds = st["placement"]["rounds"]
        assert 2 <= len(rounds) <= 4 and st["failures"].get("oom", 0) == len(rounds) - 1
        assert all("shortfall_mib" in r for r in rounds[:-1])
        final = rounds[-1]["split"]
        assert "CUDA0: layers 0-" in final and "CUDA1: layers " in final
        argv = st["engine"]["argv"]
        ot = argv[argv.index("-ot") + 1]
        assert "=CUDA0" in ot and "=CUDA1" in ot and argv[argv.index("-ngl") + 1] == "999"
        assert sup.stop() == 0


def test_a_balanced_rung_that_cannot_fit_is_rejected_without_launching(tmp_path):
    prefix = require_prefix()
    model = make_tiny_gguf(tmp_path / "m.gguf", n_layers=16, width=384)
    rungs = '[[ladder.rungs]]\nname = "balanced"\nplacement = "balanced"\nargs = ["-t", "1", "-c", "256"]\nreserve_mib = 0\n'
    text = config(binary=str(FAKE), model=str(model), port=free_port(), status_port=free_port(),
                  state_dir=tmp_path / "state", rungs=rungs, snapshot=str(prefix / "share/kiln/llama-server.help.txt"))
    env = {"PATH": f"{HW}:{os.environ['PATH']}", "KILN_FAKE_SMI": "a40x2", "KILN_FAKE_SMI_USED": "46048,46048",
           "KILN_FAKE_SCENARIO": "vram-budget", "KILN_FAKE_REAL_BINARY": str(prefix / "bin/llama-server")}
    with Supervised(tmp_path, text, env=env, args=("--exit-on-failure",)) as sup:
        assert sup.proc.wait(60) == 3
        log = sup.log()
        assert "failure config_rejected" in log and "balanced placement: layers need" in log
        assert "state LAUNCHING" in log and "state LOADING" not in log
