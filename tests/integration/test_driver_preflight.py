"""The supervisor refuses a driver too old for its image's CUDA before any engine starts (issue 13):
the real `python -m supervisor run` with the NVML stand-in (tests/support/hw/nvml_shim: one A40,
the driver branch chosen per test, standing for libnvidia-ml) and an engine share holding the
image's measured floor (share/kiln/cuda.json, as images/pins/cudafloor.py writes it at build)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kiln_dev.supervised import REPO_ROOT, Supervised, config, free_port

pytestmark = pytest.mark.llama
SHIM = REPO_ROOT / "tests" / "support" / "hw" / "nvml_shim"


def pod(tmp_path: Path, prefix: Path, tiny: Path, floor: str) -> str:
    share = tmp_path / "share"
    share.mkdir()
    shutil.copy(prefix / "share/kiln/llama-server.help.txt", share / "llama-server.help.txt")
    (share / "cuda.json").write_text(json.dumps({"cuda": floor, "engine": "vllm", "evidence": [
        "torch 2.13.0 requires cuda-toolkit==13.0.3", "_C.abi3.so needs libcudart.so.13"]}))
    return config(binary=str(prefix / "bin/llama-server"), model=str(tiny), port=free_port(),
                  status_port=free_port(), state_dir=tmp_path / "state", snapshot=str(share / "llama-server.help.txt"),
                  rungs='[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "512"]\n')


def test_a_570_driver_is_refused_for_a_cuda_13_image_with_exit_3_before_any_engine_starts(tmp_path, prefix, tiny):
    env = {"PYTHONPATH": f"{SHIM}:{REPO_ROOT}", "KILN_FAKE_NVML_BRANCH": "570"}
    with Supervised(tmp_path, pod(tmp_path, prefix, tiny, "13.0"), env=env, args=("--exit-on-failure",)) as sup:
        assert sup.proc.wait(60) == 3
        log = sup.log()
    assert "failure driver_incompatible" in log
    assert "NVIDIA driver 570.195.03 supports CUDA up to 12.8, but this image's vllm needs CUDA >= 13.0" in log
    assert "a driver >= 580" in log and "minCudaVersion" in log
    assert "LAUNCHING" not in log and "Traceback" not in log


def test_a_580_driver_runs_a_cuda_13_image(tmp_path, prefix, tiny):
    env = {"PYTHONPATH": f"{SHIM}:{REPO_ROOT}", "KILN_FAKE_NVML_BRANCH": "580"}
    with Supervised(tmp_path, pod(tmp_path, prefix, tiny, "13.0"), env=env) as sup:
        st = sup.wait_state("SERVING", timeout=60)
        assert not st["failures"] and "driver" not in " ".join(st["warnings"])
        assert sup.stop() == 0
