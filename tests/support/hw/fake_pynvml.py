"""Stand-in for the `pynvml` module (nvidia-ml-py), for the NVML path on hosts without a driver.

Only the calls supervisor.host.hardware and supervisor.host.cuda make exist. Install it with
`monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(...))`. It records init/shutdown so tests
can check NVML is always shut down, and `fail_on` makes a named call raise an NVMLError the way
the real binding does (no library -> NVMLError_LibraryNotFound at nvmlInit).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

MIB = 1024 * 1024
# The CUDA version each driver branch reports (nvmlSystemGetCudaDriverVersion; nvidia-smi's header
# "CUDA Version"): R550 is CUDA 12.4, R570 12.8 (the field notes' A40 pods: 570.195.03), R580 13.0 (the
# lent H200: 580.159.04).
CUDA_OF_BRANCH = {"550": 12040, "570": 12080, "580": 13000}
DRIVERS = {"550": "550.163.01", "570": "570.195.03", "580": "580.159.04"}


class NVMLError(Exception):
    def __init__(self, value: int, text: str):
        super().__init__(text)
        self.value = value


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(12, "NVML Shared Library Not Found")


class NVMLError_DriverNotLoaded(NVMLError):
    def __init__(self) -> None:
        super().__init__(9, "Driver Not Loaded")


class NVMLError_FunctionNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(13, "Function Not Found")


class NVMLError_GpuIsLost(NVMLError):
    def __init__(self) -> None:
        super().__init__(15, "GPU is lost")


@dataclass
class Device:
    name: str
    total_mib: int
    used_mib: int
    cc: tuple[int, int] | None
    uuid: str
    reserved_mib: int = 0      # v1 memory info counts it as used, v2 doesn't (as real drivers)


def a40(i: int, used_mib: int = 267) -> Device:
    return Device("NVIDIA A40", 46068, used_mib, (8, 6), f"GPU-6f1c2d3e-8a4b-4c5d-9e6f-{i:012x}", 568)


class FakeNVML:
    nvmlMemory_v2 = 0x02000028

    NVMLError = NVMLError

    def __init__(self, devices: list[Device], driver: str = "570.195.03", *,
                 fail_on: dict[str, type[NVMLError]] | None = None, v2: bool = True,
                 cuda: int | None = None):
        self.devices = devices
        self.driver = driver
        self.cuda = cuda if cuda is not None else CUDA_OF_BRANCH.get(driver.split(".")[0], 12080)
        self.fail_on = fail_on or {}
        self.v2 = v2
        self.inits = 0
        self.shutdowns = 0

    def _maybe_fail(self, call: str) -> None:
        if call in self.fail_on:
            raise self.fail_on[call]()

    def nvmlInit(self) -> None:
        self._maybe_fail("nvmlInit")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._maybe_fail("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._maybe_fail("nvmlSystemGetCudaDriverVersion")
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        self._maybe_fail("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Device:
        self._maybe_fail("nvmlDeviceGetHandleByIndex")
        return self.devices[i]

    def nvmlDeviceGetName(self, h: Device) -> str:
        return h.name

    def nvmlDeviceGetUUID(self, h: Device) -> str:
        return h.uuid

    def nvmlDeviceGetCudaComputeCapability(self, h: Device) -> tuple[int, int]:
        if h.cc is None:
            raise NVMLError_FunctionNotFound()
        return h.cc

    def nvmlDeviceGetMemoryInfo(self, h: Device, version: int | None = None) -> SimpleNamespace:
        self._maybe_fail("nvmlDeviceGetMemoryInfo")
        if version is not None and not self.v2:
            raise NVMLError_FunctionNotFound()
        used = h.used_mib if version else h.used_mib + h.reserved_mib
        free = h.total_mib - h.used_mib - h.reserved_mib
        return SimpleNamespace(total=h.total_mib * MIB, used=used * MIB, free=free * MIB)
