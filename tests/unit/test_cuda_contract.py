"""The CUDA contract from target to boot: for every rendered target the `io.kiln.cuda` label, the
image's NVIDIA_REQUIRE_CUDA and the floor file the supervisor reads all say the same CUDA, and a
target that declares another CUDA than its engine runs is refused (issue 13)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from images.generate import golden
from images.pins.lock import Pin, load_lock, pins_for
from images.build.render import CudaMismatch, make_context
from images.target import load_target, target_names
from supervisor.host.cuda import load_floor
from tests.support import cuda_elf

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "images" / "pins" / "cudafloor.py"
RENDERED = golden.render_all()


def label(dockerfile: str, key: str) -> str | None:
    m = re.search(rf'^\s+{re.escape(key)}="([^"]*)"', dockerfile, re.M)
    return m.group(1) if m else None


def env_require(dockerfile: str) -> str | None:
    m = re.search(r'^ENV NVIDIA_REQUIRE_CUDA="([^"]*)"$', dockerfile, re.M)
    return m.group(1) if m else None


def floor_step(dockerfile: str) -> list[str] | None:
    """The cuda-floor.py arguments of the build step, continuation lines joined."""
    joined = dockerfile.replace("\\\n", " ")
    m = re.search(r"^RUN /opt/kiln/venv/bin/python3 /opt/kiln/cuda-floor.py (.*)$", joined, re.M)
    return shlex.split(m.group(1)) if m else None       # the words as the build's shell reads them


def arg(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("name", target_names())
def test_label_env_and_the_supervisors_file_agree(name, tmp_path):
    target = load_target(name)
    df = RENDERED[name]
    cuda = label(df, "io.kiln.cuda")
    step = floor_step(df)
    if not target.cuda_version:
        assert cuda == "none" and env_require(df) is None and step is None
        return
    assert cuda == target.cuda_version
    assert env_require(df) == f"cuda>={cuda}"
    assert step is not None and arg(step, "--declared") == cuda and arg(step, "--target") == name
    # Run the step as the build would, over an install of that CUDA, with the image's ENV set:
    # the file it writes is the one the supervisor reads at boot.
    out = tmp_path / "cuda.json"
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}
    env["NVIDIA_REQUIRE_CUDA"] = env_require(df)
    if arg(step, "--engine") == "vllm":
        env["PYTHONPATH"] = str(cuda_elf.fake_vllm_site(tmp_path, toolkit=f"{cuda}.3", cudart_major=int(cuda.split(".")[0])))
        extra = []
    else:
        prefix, libdir = cuda_elf.fake_llama_prefix(tmp_path, runtime=f"{cuda}.90", nvcc=cuda)
        env["LD_LIBRARY_PATH"] = str(libdir)
        extra = ["--prefix", str(prefix)]
    r = subprocess.run([sys.executable, str(SCRIPT), *step, *extra, "--out", str(out)], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    floor = load_floor(out)
    assert floor is not None and floor.cuda == cuda
    assert json.loads(out.read_text())["nvidia_require_cuda"] == env_require(df)


def test_no_vllm_target_claims_12_8_for_a_cuda_13_engine():
    lock = load_lock()
    for name in target_names():
        target = load_target(name)
        if target.engine != "vllm":
            continue
        pin = pins_for(target, lock)["engine.cuda"]
        assert pin.resolved and pin.value == target.cuda_version == "13.0", name
        assert "torch==2.14.0" in pin.source and "cuda-toolkit" in pin.source


def test_a_target_that_declares_12_8_over_a_cuda_13_engine_is_refused_at_render():
    target = load_target("a40-vllm")
    relabelled = dataclasses.replace(target, cuda_version="12.8")
    pins = pins_for(target, load_lock())
    with pytest.raises(CudaMismatch) as e:
        make_context(relabelled, pins, allow_floating=True)
    msg = str(e.value)
    assert '"12.8"' in msg and "CUDA 13.0" in msg and f"vllm=={target.source.version}" in msg
    assert "separate target, not a relabel" in msg


def test_a_llamacpp_target_whose_base_compiles_another_cuda_is_refused():
    target = load_target("a40-llamacpp")
    other = dataclasses.replace(target, bases=dataclasses.replace(
        target.bases, build="nvidia/cuda:13.0.1-devel-ubuntu24.04"))
    pins = dict(pins_for(target, load_lock()))
    pins["base.build"] = Pin("base.build", None, unresolved="test")
    with pytest.raises(CudaMismatch, match=r'"12.8" but the build base nvidia/cuda:13.0.1-devel-ubuntu24.04 compiles with CUDA 13.0'):
        make_context(other, pins, allow_floating=True)
