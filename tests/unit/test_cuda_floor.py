"""The CUDA floor measured at build time (images/pins/cudafloor.py), on real ELF files and real metadata.

The ELF files are made by gcc and the real linker (tests/support/cuda_elf.py): a library whose
SONAME is libcudart.so.NN stands for CUDA's runtime, which this machine does not have. torch's
Requires-Dist lines are copied from PyPI's metadata of torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl
(PEP 658, read 2026-12-01).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from images.pins import cudafloor
from images.pins.cudafloor import FloorError, Measured, cuda_from_requirements, needed_libraries
from supervisor.host.cuda import load_floor
from tests.support import cuda_elf

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "images" / "pins" / "cudafloor.py"

TORCH_2_13_0_REQUIRES = cuda_elf.TORCH_2_13_0_REQUIRES
# torch 2.8.0's CUDA 12.8 form on PyPI: per-library cu12 wheels, the runtime's version exact.
TORCH_CU128_REQUIRES = ['nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux"',
                        'nvidia-cublas-cu12==12.8.4.1; platform_system == "Linux"']


def test_torch_2_13_0_requires_cuda_13_0():
    m = Measured()
    cuda_from_requirements(TORCH_2_13_0_REQUIRES, "torch 2.13.0", m)
    assert m.floor() == "13.0"
    assert any("cuda-toolkit" in e and "==13.0.3" in e for e in m.evidence)
    assert any("nvidia-*-cu13" in e for e in m.evidence)


def test_cu12_per_library_wheels_give_the_runtime_version():
    m = Measured()
    cuda_from_requirements(TORCH_CU128_REQUIRES, "torch 2.8.0", m)
    assert m.floor() == "12.8"


def test_readings_that_disagree_are_refused_with_every_reading():
    m = Measured()
    m.add(13, 0, "torch requires cuda-toolkit==13.0.3")
    m.add(12, None, "vllm/_C.abi3.so needs libcudart.so.12")
    with pytest.raises(FloorError, match="disagree.*13.0.3.*libcudart.so.12"):
        m.floor()


def test_a_major_alone_is_not_a_floor():
    m = Measured()
    m.add(13, None, "x needs libcudart.so.13")
    with pytest.raises(FloorError, match="minor"):
        m.floor()


@pytest.mark.skipif(shutil.which("readelf") is None, reason="binutils' readelf is the reference")
def test_needed_libraries_reads_what_readelf_reads(tmp_path):
    libdir = tmp_path / "lib"
    cuda_elf.cudart(libdir, "13.0.96")
    ext = cuda_elf.linked(tmp_path / "_C.abi3.so", libdir, 13, shared=True)
    files = [ext, Path(sys.executable).resolve(), libdir / "libcudart.so.13.0.96"]
    for f in files:
        ref = [line.split("[", 1)[1].split("]", 1)[0]
               for line in subprocess.run(["readelf", "-d", str(f)], capture_output=True, text=True).stdout.splitlines()
               if "(NEEDED)" in line]
        assert needed_libraries(f) == ref, f
    assert "libcudart.so.13" in needed_libraries(ext)


def test_not_an_elf_file_needs_nothing(tmp_path):
    f = tmp_path / "script.sh"
    f.write_text("#!/bin/sh\n")
    assert needed_libraries(f) == []


# ---------------------------------------------------------------- the build step, run as the image runs it
def run_floor(*args: str, site: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("NVIDIA_REQUIRE_CUDA", "LD_LIBRARY_PATH")}
    if site:
        e["PYTHONPATH"] = str(site)
    e.update(env or {})
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=e, timeout=60)


def test_vllm_floor_is_measured_written_and_read_by_the_supervisor(tmp_path):
    site = cuda_elf.fake_vllm_site(tmp_path, toolkit="13.0.3", cudart_major=13)
    out = tmp_path / "cuda.json"
    r = run_floor("--engine", "vllm", "--declared", "13.0", "--out", str(out), site=site,
                  env={"NVIDIA_REQUIRE_CUDA": "cuda>=13.0"})
    assert r.returncode == 0, r.stderr
    record = json.loads(out.read_text())
    assert record["cuda"] == "13.0" and record["nvidia_require_cuda"] == "cuda>=13.0"
    assert any("libcudart.so.13" in e for e in record["evidence"])
    assert any("torch.version.cuda = 13.0" in e for e in record["evidence"])
    floor = load_floor(out)
    assert floor is not None and floor.cuda == "13.0" and floor.engine == "vllm"


def test_a_target_declaring_12_8_over_a_cuda_13_engine_is_refused_at_build(tmp_path):
    site = cuda_elf.fake_vllm_site(tmp_path, toolkit="13.0.3", cudart_major=13)
    out = tmp_path / "cuda.json"
    r = run_floor("--engine", "vllm", "--declared", "12.8", "--target", "a40-vllm",
                  "--out", str(out), site=site)
    assert r.returncode == 1
    assert '[cuda] version = "12.8"' in r.stderr and "runs CUDA 13.0" in r.stderr
    assert "cuda-toolkit" in r.stderr and "a40-vllm" in r.stderr
    assert not out.exists()


def test_an_image_env_that_says_another_floor_is_refused(tmp_path):
    site = cuda_elf.fake_vllm_site(tmp_path, toolkit="13.0.3", cudart_major=13)
    r = run_floor("--engine", "vllm", "--declared", "13.0", "--out", str(tmp_path / "c.json"), site=site,
                  env={"NVIDIA_REQUIRE_CUDA": "cuda>=12.8 brand=tesla,driver>=535,driver<536"})
    assert r.returncode == 1 and "NVIDIA_REQUIRE_CUDA" in r.stderr and "cuda>=13.0" in r.stderr


def test_extensions_that_need_another_cudart_than_torch_are_refused(tmp_path):
    site = cuda_elf.fake_vllm_site(tmp_path, toolkit="13.0.3", cudart_major=12)
    r = run_floor("--engine", "vllm", "--declared", "13.0", "--out", str(tmp_path / "c.json"), site=site)
    assert r.returncode == 1 and "disagree" in r.stderr and "libcudart.so.12" in r.stderr


def test_llamacpp_floor_from_the_linked_runtime_and_the_compiler(tmp_path):
    prefix, libdir = cuda_elf.fake_llama_prefix(tmp_path, runtime="12.8.90", nvcc="12.8")
    r = run_floor("--engine", "llamacpp", "--prefix", str(prefix), "--declared", "12.8",
                  env={"LD_LIBRARY_PATH": str(libdir)})
    assert r.returncode == 0, r.stderr
    record = json.loads((prefix / cudafloor.FLOOR_FILE).read_text())
    assert record["cuda"] == "12.8"
    assert any("libcudart.so.12.8.90" in e for e in record["evidence"])
    assert any("nvcc release 12.8" in e for e in record["evidence"])


def test_llamacpp_compiled_with_one_cuda_and_run_on_anothers_runtime_is_refused(tmp_path):
    prefix, libdir = cuda_elf.fake_llama_prefix(tmp_path, runtime="12.4.127", nvcc="12.8")
    r = run_floor("--engine", "llamacpp", "--prefix", str(prefix), "--declared", "12.8",
                  env={"LD_LIBRARY_PATH": str(libdir)})
    assert r.returncode == 1 and "disagree" in r.stderr and "12.4.127" in r.stderr and "12.8" in r.stderr


def test_llamacpp_whose_runtime_library_is_absent_is_refused(tmp_path):
    prefix, libdir = cuda_elf.fake_llama_prefix(tmp_path, runtime="12.8.90", nvcc="12.8")
    shutil.rmtree(libdir)
    r = run_floor("--engine", "llamacpp", "--prefix", str(prefix), "--declared", "12.8",
                  env={"LD_LIBRARY_PATH": str(tmp_path / "empty")})
    assert r.returncode == 1 and "libcudart.so.12" in r.stderr and "does not have" in r.stderr


def test_a_cpu_llama_server_has_no_floor_and_a_cuda_declaration_over_it_is_refused(tmp_path):
    prefix, _ = cuda_elf.fake_llama_prefix(tmp_path, runtime=None, nvcc=None)
    ok = run_floor("--engine", "llamacpp", "--prefix", str(prefix), "--declared", "")
    assert ok.returncode == 0, ok.stderr
    assert json.loads((prefix / cudafloor.FLOOR_FILE).read_text())["cuda"] is None
    assert load_floor(prefix / cudafloor.FLOOR_FILE) is None
    bad = run_floor("--engine", "llamacpp", "--prefix", str(prefix), "--declared", "12.8")
    assert bad.returncode == 1 and "runs no CUDA" in bad.stderr


def test_llamacpp_runtime_found_through_the_binarys_runpath_as_the_loader_finds_it(tmp_path):
    # a CMake build keeps the toolkit's lib dir in the binary's RUNPATH; no LD_LIBRARY_PATH needed
    libdir = tmp_path / "cuda" / "lib64"
    cuda_elf.cudart(libdir, "13.0.96")
    prefix = tmp_path / "engine"
    cuda_elf.linked(prefix / "bin" / "llama-server", libdir, 13, rpath=True)
    assert cudafloor.search_path(prefix / "bin" / "llama-server") == [str(libdir)]
    r = run_floor("--engine", "llamacpp", "--prefix", str(prefix), "--measure-only")
    assert r.returncode == 0, r.stderr
    assert json.loads((prefix / cudafloor.FLOOR_FILE).read_text())["cuda"] == "13.0"
