"""supervisor.host.hardware: the probe reads GPUs, vCPU and RAM as a container sees them, and check()
refuses a machine the config was not made for, saying what, where and how to fix it.

The field notes' case drives the messages: a 5-GPU pod ran the 2-GPU placement before the guard
existed, and 16 vCPU against 41 vCPU made the same placement 1.9x slower. GPU paths run against
stand-ins (tests/support/hw: a fake nvidia-smi executable and a fake pynvml module) because CI
has no driver; the `gpu` test compares the real NVML and nvidia-smi on a machine that has one.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `pytest` without `python -m` doesn't put the repo root on sys.path
    sys.path.insert(0, str(ROOT))

from supervisor.host import hardware  # noqa: E402
from supervisor.config import HardwareSpec  # noqa: E402
from supervisor.host.hardware import GPU, Hardware, check, host_resident_warning, probe  # noqa: E402
from tests.support.hw import NVIDIA_SMI, SYSROOTS  # noqa: E402
from tests.support.hw import fake_pynvml  # noqa: E402

SMI = str(NVIDIA_SMI)


def nvml_works() -> bool:
    import pynvml
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def smi_probe(profile: str, monkeypatch: pytest.MonkeyPatch, **kw: object) -> Hardware:
    monkeypatch.setenv("KILN_FAKE_SMI", profile)
    return probe(nvidia_smi=SMI, use_nvml=False, **kw)  # type: ignore[arg-type]


def a40(i: int, total: int = 46068) -> GPU:
    return GPU(i, "NVIDIA A40", total, total - 835, 267, "8.6")


def machine(gpus: list[GPU] | tuple[GPU, ...] = (), *, vcpus: float = 16, ram: float = 93.1,
            source: str | None = None, driver: str | None = "570.195.03",
            note: str | None = None) -> Hardware:
    if source is None:
        source = "nvml" if gpus else "none"
    return Hardware(gpus=tuple(gpus), driver=driver if source != "none" else None, source=source,
                    vcpus=vcpus, ram_total_gib=ram, ram_available_gib=ram * 0.9, note=note)


CPU_HOST = machine(source="none",
                   note="NVML: NVML Shared Library Not Found; nvidia-smi: nvidia-smi not found")


# --------------------------------------------------------------------------- the real machine
def test_real_probe_on_this_host() -> None:
    hw = probe()
    assert hw.vcpus > 0
    assert hw.ram_total_gib > 0 and 0 < hw.ram_available_gib <= hw.ram_total_gib
    json.dumps(hw.to_dict())
    if shutil.which("nvidia-smi") is None and not nvml_works():
        # The CI/dev box: no driver at all. A CPU host is an answer, not an exception.
        assert hw.source == "none" and hw.gpus == () and hw.driver is None
        assert hw.note is not None and "NVML" in hw.note and "nvidia-smi" in hw.note
        assert hardware.gpu_memory_used_mib() is None
    else:
        assert hw.source in ("nvml", "nvidia-smi") and hw.gpus


@pytest.mark.gpu
def test_nvml_and_nvidia_smi_agree_on_a_real_gpu() -> None:
    if not nvml_works() or shutil.which("nvidia-smi") is None:
        pytest.skip("needs an NVIDIA driver with NVML and nvidia-smi")
    via_nvml = probe()
    via_smi = probe(use_nvml=False)
    assert via_nvml.source == "nvml" and via_smi.source == "nvidia-smi"
    assert via_nvml.driver == via_smi.driver
    assert len(via_nvml.gpus) == len(via_smi.gpus) > 0
    for a, b in zip(via_nvml.gpus, via_smi.gpus):
        assert (a.index, a.name, a.memory_total_mib, a.compute_capability, a.uuid) == \
               (b.index, b.name, b.memory_total_mib, b.compute_capability, b.uuid)
        assert abs(a.memory_used_mib - b.memory_used_mib) < 1024   # same v2 meaning of "used"
    used = hardware.gpu_memory_used_mib()
    assert used is not None and len(used) == len(via_nvml.gpus)
    assert hardware.gpu_memory_used_mib(use_nvml=False) is not None


# --------------------------------------------------------------------------- nvidia-smi
def test_smi_two_a40s(monkeypatch: pytest.MonkeyPatch) -> None:
    hw = smi_probe("a40x2", monkeypatch)
    assert hw.source == "nvidia-smi" and hw.driver == "570.195.03"
    assert hw.gpus == (
        GPU(0, "NVIDIA A40", 46068, 45233, 267, "8.6", "GPU-6f1c2d3e-8a4b-4c5d-9e6f-000000000000"),
        GPU(1, "NVIDIA A40", 46068, 45233, 267, "8.6", "GPU-6f1c2d3e-8a4b-4c5d-9e6f-000000000001"),
    )
    assert hw.note is None          # use_nvml=False: NVML was not asked, so nothing to explain


def test_smi_one_h200(monkeypatch: pytest.MonkeyPatch) -> None:
    hw = smi_probe("h200x1", monkeypatch)
    assert hw.driver == "580.159.04"
    (g,) = hw.gpus
    assert (g.index, g.name, g.memory_total_mib, g.compute_capability) == (0, "NVIDIA H200", 143771, "9.0")
    assert g.memory_used_mib == 0 and g.uuid and g.uuid.startswith("GPU-")


def test_smi_found_on_path_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{NVIDIA_SMI.parent}:/usr/bin:/bin")
    monkeypatch.setenv("KILN_FAKE_SMI", "a40x5")
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.FakeNVML(
        [], fail_on={"nvmlInit": fake_pynvml.NVMLError_LibraryNotFound}))
    hw = probe()
    assert hw.source == "nvidia-smi" and len(hw.gpus) == 5
    assert hw.note == "NVML: NVML Shared Library Not Found"


def test_smi_old_driver_without_compute_cap_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    hw = smi_probe("old", monkeypatch)
    assert hw.source == "nvidia-smi" and hw.driver == "470.256.02"
    (g,) = hw.gpus
    assert g.name == "Tesla K80" and g.compute_capability is None and g.memory_total_mib == 11441


def test_smi_not_available_values_are_none(monkeypatch: pytest.MonkeyPatch) -> None:
    (g,) = smi_probe("na", monkeypatch).gpus
    assert g.compute_capability is None and g.uuid is None and g.memory_total_mib == 46068


def test_smi_skips_noise_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    hw = smi_probe("garbage", monkeypatch)
    assert [g.name for g in hw.gpus] == ["NVIDIA A40"]
    assert hw.note and "infoROM" in hw.note


@pytest.mark.parametrize("profile,said", [
    ("nodevices", "exit 6: No devices were found"),
    ("nodriver", "exit 9: NVIDIA-SMI has failed because it couldn't communicate"),
])
def test_smi_failures_mean_no_gpus(monkeypatch: pytest.MonkeyPatch, profile: str, said: str) -> None:
    hw = smi_probe(profile, monkeypatch)
    assert hw.source == "none" and hw.gpus == () and hw.driver is None
    assert hw.note and said in hw.note


def test_smi_missing_binary(tmp_path: Path) -> None:
    hw = probe(nvidia_smi=str(tmp_path / "nvidia-smi"), use_nvml=False)
    assert hw.source == "none" and hw.gpus == ()
    assert hw.note == f"nvidia-smi: {tmp_path / 'nvidia-smi'} not found"


def test_smi_hang_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "SMI_TIMEOUT_S", 0.5)
    t0 = time.monotonic()
    hw = smi_probe("hang", monkeypatch)
    assert time.monotonic() - t0 < 5
    assert hw.source == "none" and hw.note == "nvidia-smi: no answer within 0.5s"


def test_smi_name_with_comma_is_kept_whole() -> None:
    gpus, driver, skipped = hardware._parse_smi(
        ["0, NVIDIA RTX 6000 Ada Generation, Rev. B, 49140, 3, 48568, 8.9, GPU-x, 570.195.03"],
        hardware.SMI_FIELDS)
    assert skipped == [] and driver == "570.195.03"
    assert gpus[0].name == "NVIDIA RTX 6000 Ada Generation, Rev. B" and gpus[0].memory_total_mib == 49140


def test_gpu_memory_used_via_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KILN_FAKE_SMI", "a40x2")
    monkeypatch.setenv("KILN_FAKE_SMI_USED", "44010,43580")
    assert hardware.gpu_memory_used_mib(use_nvml=False, nvidia_smi=SMI) == [44010, 43580]
    monkeypatch.setenv("KILN_FAKE_SMI", "nodevices")
    assert hardware.gpu_memory_used_mib(use_nvml=False, nvidia_smi=SMI) is None
    assert hardware.gpu_memory_used_mib(use_nvml=False, nvidia_smi=str(tmp_path / "nope")) is None


# --------------------------------------------------------------------------- NVML
def test_nvml_path(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_pynvml.FakeNVML([fake_pynvml.a40(0), fake_pynvml.a40(1, used_mib=44010)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    hw = probe(nvidia_smi="/nonexistent")
    assert hw.source == "nvml" and hw.driver == "570.195.03" and hw.note is None
    assert [(g.index, g.name, g.memory_total_mib, g.memory_used_mib, g.compute_capability)
            for g in hw.gpus] == [(0, "NVIDIA A40", 46068, 267, "8.6"), (1, "NVIDIA A40", 46068, 44010, "8.6")]
    assert hw.gpus[0].memory_free_mib == 46068 - 267 - 568
    assert hardware.gpu_memory_used_mib() == [267, 44010]
    assert fake.inits == fake.shutdowns == 2


def test_nvml_old_driver_without_memory_v2_uses_v1(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_pynvml.FakeNVML([fake_pynvml.a40(0)], v2=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    (g,) = probe(nvidia_smi="/nonexistent").gpus
    assert g.memory_used_mib == 267 + 568   # v1 counts the driver's reservation as used


def test_nvml_error_mid_query_falls_back_to_smi_and_still_shuts_down(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_pynvml.FakeNVML([fake_pynvml.a40(0)],
                                fail_on={"nvmlDeviceGetMemoryInfo": fake_pynvml.NVMLError_GpuIsLost})
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("KILN_FAKE_SMI", "a40x2")
    hw = probe(nvidia_smi=SMI)
    assert hw.source == "nvidia-smi" and len(hw.gpus) == 2
    assert hw.note == "NVML: GPU is lost"
    assert fake.inits == fake.shutdowns == 1


@pytest.mark.parametrize("error", [fake_pynvml.NVMLError_LibraryNotFound,
                                   fake_pynvml.NVMLError_DriverNotLoaded])
def test_no_driver_is_a_cpu_host(monkeypatch: pytest.MonkeyPatch, error: type) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.FakeNVML([], fail_on={"nvmlInit": error}))
    hw = probe(nvidia_smi="/nonexistent")
    assert hw.source == "none" and hw.gpus == ()
    assert hw.note and hw.note.startswith(f"NVML: {error()}; nvidia-smi: ")
    assert hardware.gpu_memory_used_mib(nvidia_smi="/nonexistent") is None


def test_nvml_with_zero_devices_is_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.FakeNVML([]))
    hw = probe(nvidia_smi=SMI)   # not asked: NVML answered, with none
    assert hw.source == "nvml" and hw.gpus == () and hw.driver == "570.195.03"
    assert hardware.gpu_memory_used_mib() is None


# --------------------------------------------------------------------------- cgroups
def test_seed_pod_2xA40_cgroup_v2() -> None:
    hw = probe(sysroot=str(SYSROOTS / "runpod-2xA40-v2"), nvidia_smi="/nonexistent", use_nvml=False)
    assert hw.vcpus == 16.0                 # cpu.max, not the host's 128 CPUs
    assert hw.ram_total_gib == 93.13        # memory.max (100 GB), not the host's ~1 TiB
    assert hw.ram_available_gib == 63.13    # limit - (current - inactive_file)


def test_seed_pod_5xA40_cgroup_v1() -> None:
    hw = probe(sysroot=str(SYSROOTS / "runpod-5xA40-v1"), nvidia_smi="/nonexistent", use_nvml=False)
    assert hw.vcpus == 41.0
    assert hw.ram_total_gib == 217.93       # 234 GB
    assert hw.ram_available_gib == 214.93


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")
    return root


MEMINFO = "MemTotal:       65536000 kB\nMemFree:  1000 kB\nMemAvailable:   32768000 kB"


def sysroot(tmp_path: Path, cpus: str, files: dict[str, str], cgroup: str = "0::/") -> Hardware:
    write(tmp_path, {"proc/meminfo": MEMINFO, "proc/self/cgroup": cgroup,
                     "proc/self/status": f"Cpus_allowed_list:\t{cpus}", **files})
    return probe(sysroot=str(tmp_path), nvidia_smi="/nonexistent", use_nvml=False)


def test_v2_unlimited_uses_affinity_and_meminfo(tmp_path: Path) -> None:
    hw = sysroot(tmp_path, "0-15,32-47", {"sys/fs/cgroup/cgroup.controllers": "cpu memory",
                                          "sys/fs/cgroup/cpu.max": "max 100000",
                                          "sys/fs/cgroup/memory.max": "max"})
    assert hw.vcpus == 32.0
    assert hw.ram_total_gib == 62.5 and hw.ram_available_gib == 31.25


def test_v2_fractional_quota_and_affinity_below_quota(tmp_path: Path) -> None:
    files = {"sys/fs/cgroup/cgroup.controllers": "cpu", "sys/fs/cgroup/cpu.max": "150000 100000"}
    assert sysroot(tmp_path / "a", "0-7", files).vcpus == 1.5
    assert sysroot(tmp_path / "b", "0", {**files, "sys/fs/cgroup/cpu.max": "400000 100000"}).vcpus == 1.0


def test_v1_unlimited_values(tmp_path: Path) -> None:
    hw = sysroot(tmp_path, "0-3", {"sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1",
                                   "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000",
                                   "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712",
                                   "sys/fs/cgroup/memory/memory.usage_in_bytes": "7598080"})
    assert hw.vcpus == 4.0 and hw.ram_total_gib == 62.5


def test_v1_host_hierarchy_takes_the_tightest_ancestor(tmp_path: Path) -> None:
    # Host's hierarchy mounted (no cgroup namespace), as on this dev box: our cgroup's path from
    # /proc/self/cgroup exists under the mount, and a parent holds the memory limit.
    pod = "sys/fs/cgroup/memory/kubepods/pod1"
    hw = sysroot(tmp_path, "0-63", {
        "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1",
        "sys/fs/cgroup/cpu/kubepods/pod1/ctr/cpu.cfs_quota_us": "800000",
        "sys/fs/cgroup/cpu/kubepods/pod1/ctr/cpu.cfs_period_us": "100000",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712",
        f"{pod}/memory.limit_in_bytes": str(16 * 1024 ** 3),
        f"{pod}/memory.usage_in_bytes": str(6 * 1024 ** 3),
        f"{pod}/memory.stat": f"inactive_file 0\ntotal_inactive_file {2 * 1024 ** 3}",
        f"{pod}/ctr/memory.limit_in_bytes": "9223372036854771712",
    }, cgroup="5:memory:/kubepods/pod1/ctr\n3:cpu,cpuacct:/kubepods/pod1/ctr\n0::/")
    assert hw.vcpus == 8.0
    assert hw.ram_total_gib == 16.0 and hw.ram_available_gib == 12.0


def test_hybrid_reads_v1_controllers_and_v2_unified(tmp_path: Path) -> None:
    hw = sysroot(tmp_path, "0-31", {"sys/fs/cgroup/unified/cgroup.controllers": "",
                                    "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "1200000",
                                    "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000"})
    assert hw.vcpus == 12.0 and hw.ram_total_gib == 62.5


def test_no_cgroup_files_at_all(tmp_path: Path) -> None:
    hw = sysroot(tmp_path, "0-5", {})
    assert hw.vcpus == 6.0 and hw.ram_total_gib == 62.5


# --------------------------------------------------------------------------- check()
def test_seed_case_two_gpu_config_on_five() -> None:
    hw = machine([a40(i) for i in range(5)], vcpus=41)
    assert check(HardwareSpec(gpu_count=2), hw) == [
        "gpu_count: expected exactly 2 GPUs, found 5 (NVIDIA A40 x5): this config's placement was "
        "made for 2; set KILN_GPU_COUNT or use a config made for 5"]


def test_two_gpu_config_on_one() -> None:
    (line,) = check(HardwareSpec(gpu_count=2), machine([a40(0)]))
    assert line.startswith("gpu_count: expected exactly 2 GPUs, found 1 (NVIDIA A40 x1): ")
    assert "needs 2" in line and "config made for 1" in line


def test_one_gpu_config_on_two() -> None:
    (line,) = check(HardwareSpec(gpu_count=1), machine([a40(0), a40(1)]))
    assert line.startswith("gpu_count: expected exactly 1 GPU, found 2 (NVIDIA A40 x2): ")
    assert "made for 1; set KILN_GPU_COUNT or use a config made for 2" in line


def test_gpu_config_on_cpu_host() -> None:
    lines = check(HardwareSpec(gpu_count=2, min_vram_mib=46000, min_compute_capability="8.6"), CPU_HOST)
    assert lines == [
        "gpu_count: expected exactly 2 GPUs, found none (no NVIDIA driver: NVML and nvidia-smi "
        "unavailable; NVML: NVML Shared Library Not Found; nvidia-smi: nvidia-smi not found): run "
        "on a pod with 2 GPUs exposed to the container, or use a CPU config (gpu_count = 0)"]


def test_driver_without_devices_is_said_so() -> None:
    (line,) = check(HardwareSpec(gpu_count=1), machine(source="nvml"))
    assert "found none (driver 570.195.03 sees no GPU via nvml" in line


def test_cpu_config_on_gpu_host_is_strict() -> None:
    (line,) = check(HardwareSpec(gpu_count=0), machine([a40(0), a40(1)]))
    assert line.startswith("gpu_count: expected exactly 0 GPUs (CPU only), found 2 (NVIDIA A40 x2)")
    assert check(HardwareSpec(gpu_count=0), CPU_HOST) == []


def test_gpu_count_unset_accepts_any() -> None:
    assert check(HardwareSpec(), machine([a40(i) for i in range(5)])) == []
    assert check(HardwareSpec(), CPU_HOST) == []


def test_mixed_pod_is_summarised() -> None:
    gpus = [a40(i) for i in range(4)] + [GPU(4, "NVIDIA L40S", 46068, 45000, 1, "8.9")]
    (line,) = check(HardwareSpec(gpu_count=2), machine(gpus))
    assert "found 5 (NVIDIA A40 x4, NVIDIA L40S x1)" in line


def test_min_vram_names_the_short_gpu() -> None:
    gpus = [a40(0), GPU(1, "NVIDIA A10", 23028, 22000, 0, "8.6")]
    (line,) = check(HardwareSpec(gpu_count=2, min_vram_mib=46000), machine(gpus))
    assert line == ("min_vram_mib: expected at least 46000 MiB on every GPU, GPU 1 (NVIDIA A10) has "
                    "23028 MiB: run on GPUs with at least 46000 MiB or use a config made for 23028 MiB cards")
    assert check(HardwareSpec(min_vram_mib=46068), machine([a40(0)])) == []   # equal is enough


def test_min_vram_without_count_on_cpu_host() -> None:
    (line,) = check(HardwareSpec(min_vram_mib=46000), CPU_HOST)
    assert line.startswith("min_vram_mib: expected GPUs of at least 46000 MiB, found none (no NVIDIA driver")


def test_min_compute_capability_compares_as_numbers() -> None:
    h200 = machine([GPU(0, "NVIDIA H200", 143771, 143161, 0, "9.0")])
    assert check(HardwareSpec(min_compute_capability="8.6"), h200) == []
    assert check(HardwareSpec(min_compute_capability="9.0"), h200) == []
    # As strings "10.0" < "9.0"; as versions it is newer, so an H200 is short of it.
    (line,) = check(HardwareSpec(min_compute_capability="10.0"), h200)
    assert line == ("min_compute_capability: expected at least 10.0 on every GPU, GPU 0 (NVIDIA H200) "
                    "is 9.0: run on newer GPUs or use a build and config made for these")
    (line,) = check(HardwareSpec(min_compute_capability="8.9"), machine([a40(0)]))
    assert "GPU 0 (NVIDIA A40) is 8.6" in line
    assert check(HardwareSpec(min_compute_capability="8.6"),
                 machine([GPU(0, "NVIDIA B200", 183359, 0, 0, "10.0")])) == []


def test_min_compute_capability_unknown_is_a_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    hw = smi_probe("old", monkeypatch)
    (line,) = check(HardwareSpec(min_compute_capability="8.0"), hw)
    assert "GPU 0 (Tesla K80) did not report one (driver 470.256.02 is too old to say)" in line
    (line,) = check(HardwareSpec(min_compute_capability="sm_86"), hw)
    assert line.startswith("min_compute_capability: 'sm_86' is not a version")


def test_min_vcpu_and_min_ram() -> None:
    hw = machine([a40(0), a40(1)], vcpus=16, ram=93.13)
    lines = check(HardwareSpec(gpu_count=2, min_vcpu=32, min_ram_gib=200), hw)
    assert lines == [
        "min_vcpu: expected at least 32 vCPU, found 16 (cgroup quota and CPU affinity): rent a pod "
        "with more vCPU (RunPod scales vCPU with GPU count) or use a config made for this host",
        "min_ram_gib: expected at least 200 GiB of RAM, found 93.1 GiB (container limit or MemTotal, "
        "whichever is less): rent a pod with more RAM or use a config made for this host"]
    assert check(HardwareSpec(min_vcpu=16, min_ram_gib=93), hw) == []
    (line,) = check(HardwareSpec(min_vcpu=2), machine(vcpus=1.5))
    assert "found 1.5" in line


def test_every_mismatch_at_once_and_the_error_carries_them() -> None:
    hw = machine([GPU(0, "NVIDIA A10", 23028, 22000, 0, "8.6")], vcpus=8, ram=30)
    lines = check(HardwareSpec(gpu_count=2, min_vram_mib=46000, min_compute_capability="8.9",
                               min_vcpu=16, min_ram_gib=64), hw)
    assert [ln.split(":")[0] for ln in lines] == [
        "gpu_count", "min_vram_mib", "min_compute_capability", "min_vcpu", "min_ram_gib"]


# --------------------------------------------------------------------------- host-resident warning
def test_seed_host_warns_and_bigger_host_does_not() -> None:
    spec = HardwareSpec()   # default 0.4 vCPU per host-resident GiB
    warn = host_resident_warning(spec, machine([a40(0), a40(1)], vcpus=16), 80)
    assert warn is not None
    assert "16 vCPU for 80.0 GiB" in warn and "0.20 vCPU/GiB, below 0.4" in warn
    assert "~2.9 tok/s with 16 vCPU and ~5.4 tok/s with 41 vCPU" in warn
    assert "at least 32 vCPU" in warn
    assert host_resident_warning(spec, machine([a40(i) for i in range(5)], vcpus=41), 80) is None


def test_host_resident_warning_edges() -> None:
    spec = HardwareSpec(warn_vcpu_per_host_gib=0.4)
    assert host_resident_warning(spec, machine(vcpus=16), 40) is None          # exactly 0.4
    assert host_resident_warning(spec, machine(vcpus=16), 40.5) is not None
    assert host_resident_warning(spec, machine(vcpus=16), 0) is None           # all in VRAM
    assert host_resident_warning(HardwareSpec(warn_vcpu_per_host_gib=0), machine(vcpus=1), 500) is None


def test_to_dict_is_json() -> None:
    hw = machine([a40(0)])
    d = json.loads(json.dumps(hw.to_dict()))
    assert d["gpu_count"] == 1 and d["gpus"][0]["name"] == "NVIDIA A40" and d["source"] == "nvml"
