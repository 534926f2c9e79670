"""`build.py lock` learns a vLLM target's CUDA from the index's metadata and says which package
the index is missing, against a loopback index that speaks PEP 691, PEP 658 and HTTP Range
(tests/support/pypi_index.py; stands for pypi.org/simple)."""

from __future__ import annotations

import dataclasses

import pytest

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


def loopback_resolvers(index_url: str):
    """The real resolvers, with the registry one replaced: tests talk to loopback only."""
    def no_registry(target, key):
        raise RuntimeError("no registry in this test")
    return {**default_resolvers(pypi_index=index_url), "base": no_registry}


@pytest.fixture
def index():
    idx = PackageIndex(index_wheels())
    yield idx
    idx.close()


def test_engine_cuda_comes_from_torchs_metadata_read_out_of_the_remote_zip(index):
    version, source = engine_cuda(load_target("a40-vllm-qwen3-coder"), index=index.simple)
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
    target = load_target("a40-vllm-qwen3-coder")
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


def test_a_complete_closure_is_recorded_as_complete(tmp_path):
    idx = PackageIndex(index_wheels(nccl_versions=("2.27.7", "2.29.7")))
    try:
        target = load_target("a40-vllm-qwen3-coder")
        lock: dict = {}
        refresh(target, lock, resolvers=loopback_resolvers(idx.simple), today="2026-12-01")
        assert lock[target.name]["engine.closure"].value == "complete"
    finally:
        idx.close()


def test_a_wheel_whose_torch_is_not_pinned_leaves_the_cuda_unresolved_with_why(tmp_path):
    idx = PackageIndex([Wheel("vllm", "0.27.1", ["torch>=2.0"], tag="cp38-abi3-manylinux_2_28_x86_64")])
    try:
        target = load_target("a40-vllm-qwen3-coder")
        lock: dict = {}
        refresh(dataclasses.replace(target), lock, resolvers=loopback_resolvers(idx.simple))
        pin = lock[target.name]["engine.cuda"]
        assert pin.value is None and "pins no torch==VERSION" in pin.unresolved
    finally:
        idx.close()
