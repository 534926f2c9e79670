"""The guard counts the GPUs the engine can use: CUDA_VISIBLE_DEVICES filters what NVML lists.
(nvidia-smi here is tests/support/hw/nvidia-smi, a stand-in replaying the real CSV format.)"""

import os
from pathlib import Path

from supervisor.config import HardwareSpec
from supervisor.host.hardware import GPU, check, probe, visible_gpus

HW = Path(__file__).resolve().parents[1] / "support" / "hw"
GPUS = [GPU(0, "NVIDIA H200", 143771, 143000, 771, "9.0", "GPU-f49d0000"),
        GPU(1, "NVIDIA H200", 143771, 143000, 771, "9.0", "GPU-aa110000")]


def test_visible_devices_by_index_uuid_and_cuda_stop_rule():
    assert [g.index for g in visible_gpus(GPUS, "1")] == [1]
    assert [g.index for g in visible_gpus(GPUS, "GPU-aa11,0")] == [1, 0]
    assert visible_gpus(GPUS, "") == []                       # empty: CUDA sees no device
    assert [g.index for g in visible_gpus(GPUS, "0,5,1")] == [0]   # CUDA stops at the first unknown


def test_two_gpu_config_on_one_visible_gpu_and_one_gpu_config_on_two(monkeypatch):
    monkeypatch.setenv("PATH", f"{HW}:{os.environ['PATH']}")
    monkeypatch.setenv("KILN_FAKE_SMI", "a40x2")
    one = probe(use_nvml=False, visible="0")
    assert len(one.gpus) == 1 and "1 of 2 GPUs visible" in one.note
    assert any("expected exactly 2 GPUs, found 1" in m for m in check(HardwareSpec(gpu_count=2), one))
    two = probe(use_nvml=False, visible=None if "CUDA_VISIBLE_DEVICES" not in os.environ else "0,1")
    assert len(two.gpus) == 2
    assert any("expected exactly 1 GPU" in m and "found 2" in m for m in check(HardwareSpec(gpu_count=1), two))
