"""Is this host's NVIDIA driver new enough for the CUDA this image's engine runs?

The image build measured the engine's CUDA from what it installed (images/pins/cudafloor.py: torch's
requirements and the libcudart.so.NN vLLM's extensions need, or the libcudart llama-server links
and the nvcc that compiled it) and wrote it to share/kiln/cuda.json under the engine prefix. Before
any engine starts the supervisor reads the driver's CUDA version through NVML
(`nvmlSystemGetCudaDriverVersion`: 12080 is CUDA 12.8) and refuses a driver older than that
floor. Without this, a CUDA 13 vLLM on a 570 driver dies at CUDA init ("The NVIDIA driver on your
system is too old (found version 12080)"), which reads as a crash and is restarted with backoff
while the pod bills. Too old is terminal (`driver_incompatible`): the same pod never gets better.

The floor is the CUDA the engine was built or installed with, compared as NVIDIA_REQUIRE_CUDA's
`cuda>=X.Y` is: a CUDA 12.8 build is refused on a CUDA 12.4 driver even though CUDA's minor-version
compatibility may run some 12.8 code there, because the driver's JIT cannot compile 12.8 PTX (the
A40 build's compute_86 PTX is what an H200 runs) and that failure comes later and is murkier.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..failure import Failure, FailureClass

__all__ = ["FLOOR_FILE", "Floor", "DriverCuda", "load_floor", "driver_cuda", "check", "preflight"]

FLOOR_FILE = Path("/opt/kiln/engine/share/kiln/cuda.json")
# The first driver branch of each CUDA release (NVIDIA's CUDA Toolkit release notes, "CUDA Toolkit
# and Corresponding Driver Versions"): only for the fix text, never for the decision.
FIRST_DRIVER = {(13, 0): "580", (12, 8): "570"}
_VERSION = re.compile(r"(\d+)\.(\d+)")


@dataclass(frozen=True)
class Floor:
    cuda: str                       # "13.0"
    engine: str
    evidence: tuple[str, ...]       # what the build measured it from
    path: str

    @property
    def number(self) -> int:
        return cuda_number(self.cuda)


@dataclass(frozen=True)
class DriverCuda:
    cuda: int | None                # nvmlSystemGetCudaDriverVersion: 12080 = CUDA 12.8; None = unknown
    driver: str | None              # "570.195.03"
    note: str | None = None         # why it is unknown


def cuda_number(text: str) -> int:
    """'13.0' -> 13000, the encoding NVML and cudaDriverGetVersion use (major * 1000 + minor * 10)."""
    m = _VERSION.fullmatch(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a CUDA version like 13.0")
    return int(m.group(1)) * 1000 + int(m.group(2)) * 10


def cuda_text(number: int) -> str:
    """12080 -> '12.8'."""
    return f"{number // 1000}.{(number % 1000) // 10}"


def load_floor(path: Path = FLOOR_FILE) -> Floor | None:
    """The image's floor; None where there is none (a CPU image, a checkout run on a host).

    A file that is there but unreadable raises ValueError: the image is broken, and guessing
    "no floor" would let the engine meet the driver unchecked."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        cuda = data["cuda"]
        if cuda is not None:
            cuda_number(cuda)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"the image's CUDA floor {path} is unreadable ({e}): rebuild the image") from None
    if cuda is None:
        return None
    return Floor(cuda=cuda, engine=str(data.get("engine", "?")),
                 evidence=tuple(str(e) for e in data.get("evidence", ())), path=str(path))


def _text(v: str | bytes) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def driver_cuda(nvml: Any = None) -> DriverCuda:
    """The newest CUDA the host's driver supports, from NVML. Never raises: no NVML is an answer."""
    try:
        if nvml is None:
            import pynvml as nvml  # deferred, as in hardware.py
        nvml.nvmlInit()
    except Exception as e:  # ImportError, NVMLError (no library, no driver)
        return DriverCuda(None, None, f"NVML: {e or type(e).__name__}")
    try:
        try:
            driver: str | None = _text(nvml.nvmlSystemGetDriverVersion())
        except Exception:  # noqa: BLE001 - the CUDA version is what decides
            driver = None
        try:
            return DriverCuda(int(nvml.nvmlSystemGetCudaDriverVersion()), driver)
        except Exception as e:  # noqa: BLE001
            return DriverCuda(None, driver, f"NVML: nvmlSystemGetCudaDriverVersion: {e or type(e).__name__}")
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _fix(floor: Floor) -> str:
    major, minor = (int(x) for x in floor.cuda.split("."))
    first = FIRST_DRIVER.get((major, minor))
    need = f"a driver >= {first}" if first else f"a driver whose CUDA version is >= {floor.cuda}"
    return (f"run on a host with {need} (nvidia-smi shows CUDA Version >= {floor.cuda}): on RunPod set "
            f"gpu.minCudaVersion \"{floor.cuda}\" on the pod, or allowedCudaVersions (\"{floor.cuda}\" and "
            f"newer) on the template; or use an image variant built for this driver's CUDA")


def check(floor: Floor | None, found: DriverCuda) -> tuple[Failure | None, str | None]:
    """(failure, warning): a failure when the driver is older than the floor; a warning when the
    floor cannot be checked (no NVML). Both None when there is nothing to say."""
    if floor is None:
        return None, None
    if found.cuda is None:
        return None, (f"cannot read the driver's CUDA version ({found.note or 'NVML said nothing'}): this "
                      f"image's engine needs CUDA >= {floor.cuda}, unchecked")
    if found.cuda >= floor.number:
        return None, None
    driver = f"NVIDIA driver {found.driver}" if found.driver else "the NVIDIA driver"
    reason = (f"{driver} supports CUDA up to {cuda_text(found.cuda)}, but this image's {floor.engine} needs "
              f"CUDA >= {floor.cuda} (measured at build: {'; '.join(floor.evidence) or floor.path}); it would "
              f"die at CUDA init. Fix: {_fix(floor)}")
    return Failure(FailureClass.DRIVER_INCOMPATIBLE, reason,
                   evidence=f"nvmlSystemGetCudaDriverVersion = {found.cuda}"), None


def preflight(path: Path = FLOOR_FILE, probe: Callable[[], DriverCuda] = driver_cuda
              ) -> tuple[Failure | None, str | None]:
    """The whole check for the lifecycle's PREFLIGHT: read the floor, ask the driver, decide.

    An unreadable floor file is itself a refusal (the image is broken), never a silent pass."""
    try:
        floor = load_floor(path)
    except ValueError as e:
        return Failure(FailureClass.CONFIG_REJECTED, str(e)), None
    if floor is None:
        return None, None
    return check(floor, probe())
