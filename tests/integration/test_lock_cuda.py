"""`build.py lock` learns a vLLM target's CUDA from the index's metadata and says which package
the index is missing, against a loopback index that speaks PEP 691, PEP 658 and HTTP Range
(tests/support/pypi_index.py; stands for pypi.org/simple)."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from images.pins import closure as closure_file
from images.pins.cuda import engine_cuda
from images.pins.lock import dump_lock, load_lock, pins_for, refresh
from images.pins.pyclosure import walk
from images.pins.resolve import default_resolvers
from images.target import load_target
from tests.support.cuda_elf import TORCH_2_13_0_REQUIRES
from tests.support.pypi_index import PackageIndex, Wheel

LINUX = "py3-none-manylinux_2_18_x86_64"


def index_wheels(nccl_versions=("2.27.7", "2.30.7")) -> list[Wheel]:
    plain = [("filelock", "4.3.1"), ("typing-extensions", "4.16.0"), ("setuptools", "80.10.2"),
             ("sympy", "1.14.0"), ("networkx", "3.7"), ("jinja2", "3.1.6"), ("fsspec", "2026.9.0"),
             ("cuda-toolkit", "13.0.3"), ("cuda-bindings", "13.0.3"), ("nvidia-cudnn-cu13", "9.20.0.48"),
             ("nvidia-cusparselt-cu13", "0.8.1"), ("nvidia-nvshmem-cu13", "3.4.5"), ("triton", "3.7.1")]
    return [
        Wheel("vllm", "0.27.1", ["torch==2.13.0", "regex"], tag="cp38-abi3-manylinux_2_28_x86_64"),
        # the index reached from here serves no PEP 658 metadata for some files: read it from the zip
        Wheel("torch", "2.13.0", TORCH_2_13_0_REQUIRES, tag="cp312-cp312-manylinux_2_28_x86_64", metadata=False),
        Wheel("torch", "2.13.0", TORCH_2_13_0_REQUIRES, tag="cp311-cp311-manylinux_2_28_x86_64"),
        Wheel("regex", "2026.11.19", tag="cp312-cp312-manylinux_2_17_x86_64"),
        *[Wheel(n, v) for n, v in plain],
        *[Wheel("nvidia-nccl-cu13", v, tag=LINUX) for v in nccl_versions],
    ]


def loopback_resolvers(index_url: str, closure_files: dict | None = None):
    """The real resolvers, with the registry one replaced: tests talk to loopback only."""
    def no_registry(target, key):
        raise RuntimeError("no registry in this test")
    return {**default_resolvers(pypi_index=index_url, closure_files=closure_files), "base": no_registry}


def vllm_0_27_1():
    """The vLLM target as it was when these index wheels were modelled (vllm 0.27.1, torch 2.13.0)."""
    t = load_target("a40-vllm")
    return dataclasses.replace(t, source=dataclasses.replace(
        t.source, version="0.27.1", filename="vllm-0.27.1-cp38-abi3-manylinux_2_28_x86_64.whl"))


@pytest.fixture
def index():
    idx = PackageIndex(index_wheels())
    yield idx
    idx.close()


def test_engine_cuda_comes_from_torchs_metadata_read_out_of_the_remote_zip(index):
    version, source = engine_cuda(vllm_0_27_1(), index=index.simple)
    assert version == "13.0"
    assert "requires torch==2.13.0" in source and "cuda-toolkit" in source and "==13.0.3" in source
    assert "torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl" in source
    # the cp312 wheel's METADATA came through range requests, never a whole download
    ranged = [r for p, r in index.requests if p.endswith("cp312-cp312-manylinux_2_28_x86_64.whl")]
    assert ranged and all(r.startswith("bytes=") for r in ranged)


def test_the_closure_names_the_missing_exact_pin_its_parent_and_what_the_index_has(index):
    c = walk("vllm==0.27.1", index=index.simple)
    assert c.found["torch"] == "2.13.0" and "regex" in c.found
    assert c.missing == ['nvidia-nccl-cu13==2.29.7; platform_system == "Linux" (required by torch==2.13.0) '
                         f"is not on {index.simple} (it has 2.27.7, 2.30.7)"]


def test_lock_records_the_cuda_and_the_missing_package_and_keeps_both_through_a_round_trip(index, tmp_path):
    target = vllm_0_27_1()
    lock: dict = {}
    report = refresh(target, lock, resolvers=loopback_resolvers(index.simple), today="2026-12-01")
    pins = lock[target.name]
    assert pins["engine.cuda"].value == "13.0"
    closure = pins["engine.closure"]
    assert closure.value is None and "nvidia-nccl-cu13==2.29.7" in closure.unresolved
    assert any(line.startswith("engine.closure: UNRESOLVED") and "2.29.7" in line for line in report)
    path = tmp_path / "lock.toml"
    path.write_text(dump_lock(lock))
    again = load_lock(path)
    assert again[target.name]["engine.cuda"].value == "13.0"
    assert "nvidia-nccl-cu13==2.29.7" in again[target.name]["engine.closure"].unresolved
    # the closure is reported, not required: the target still renders from this lock
    assert "engine.closure" not in pins_for(target, again)


def test_a_complete_closure_is_locked_by_the_sha256_of_its_hashed_requirements(tmp_path):
    idx = PackageIndex(index_wheels(nccl_versions=("2.27.7", "2.29.7")))
    try:
        target = vllm_0_27_1()
        lock: dict = {}
        files: dict = {}
        refresh(target, lock, resolvers=loopback_resolvers(idx.simple, files), today="2026-12-01")
        text = files["vllm-0.27.1-cp312.txt"]
        assert lock[target.name]["engine.closure"].value == closure_file.digest(text)
        pinned = closure_file.pinned(text)
        # every package with the sha256 the index gave for its wheel: what pip --require-hashes checks
        wheel = next(w for w in idx.wheels if w.filename.startswith("torch-2.13.0-cp312"))
        assert pinned["torch"] == ("2.13.0", (hashlib.sha256(wheel.zip_bytes()).hexdigest(),))
        assert pinned["nvidia-nccl-cu13"][0] == "2.29.7" and "regex" in pinned
        assert "# via torch==2.13.0" in text
    finally:
        idx.close()


def test_a_walk_that_took_a_version_a_later_asker_refuses_walks_again_with_both_applied():
    # vllm takes numpy's newest (2.5.5) first; numba, met later, wants numpy<2.5: pip would pick
    # 2.4.1, so must the lock (vllm 0.33.0's real tree has this very shape, mistral-common and numba).
    wheels = [Wheel("vllm", "0.33.0", ["numpy", "numba"], tag="cp38-abi3-manylinux_2_28_x86_64"),
              Wheel("numba", "0.65.0", ["numpy<2.5,>=1.22"]),
              *[Wheel("numpy", v, tag="cp312-cp312-manylinux_2_27_x86_64") for v in ("2.3.5", "2.4.1", "2.5.5")],
              Wheel("numpy", "2.6.0", tag="cp312-cp312-manylinux_2_41_x86_64")]   # too new a glibc for 24.04
    idx = PackageIndex(wheels)
    try:
        c = walk("vllm==0.33.0", index=idx.simple)
        assert c.complete and c.found == {"vllm": "0.33.0", "numpy": "2.4.1", "numba": "0.65.0"}
    finally:
        idx.close()


def test_a_wheel_whose_torch_is_not_pinned_leaves_the_cuda_unresolved_with_why(tmp_path):
    idx = PackageIndex([Wheel("vllm", "0.27.1", ["torch>=2.0"], tag="cp38-abi3-manylinux_2_28_x86_64")])
    try:
        target = vllm_0_27_1()
        lock: dict = {}
        refresh(dataclasses.replace(target), lock, resolvers=loopback_resolvers(idx.simple))
        pin = lock[target.name]["engine.cuda"]
        assert pin.value is None and "pins no torch==VERSION" in pin.unresolved
    finally:
        idx.close()
