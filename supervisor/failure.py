"""Why a server failed, decided from its exit, its timing and its own words.

Exit status alone cannot tell a CUDA OOM from a bad model file (both exit 1);
the stderr can. The field notes' two signatures are the model: a parameter
rejection fails fast with `failed to create llama_context` and no allocator
line; a genuine OOM prints `cudaMalloc failed: out of memory`. Each engine
supplies its signatures; the first class with a matching line wins, in the
order the engine lists them (OOM before the generic "failed to create
context" that follows it in the same log).
"""

from __future__ import annotations

import enum
import re
import signal
from dataclasses import dataclass, field
from typing import Sequence


class FailureClass(str, enum.Enum):
    """Why a server failed, in the words /status, the deploy config's `fall_through` and the
    policies use. A str enum: it compares equal to (and serialises as) its value."""
    # lint, a fast exit with no allocator line (field notes: q8_0 KV), [hardware], or a boot config that does not validate
    CONFIG_REJECTED = "config_rejected"
    OOM = "oom"                                # cudaMalloc / CUDA out of memory
    LOAD_ERROR = "load_error"                  # the model could not be read or fetched
    PORT_IN_USE = "port_in_use"                # something else holds the engine's port
    STALLED = "stalled"                        # no progress within the deadline
    CRASHED = "crashed"                        # a signal, or an exit with no known signature
    SELFTEST_FAILED = "selftest_failed"        # healthy, but the answers or throughput were not honest
    DRIVER_INCOMPATIBLE = "driver_incompatible"  # the host's driver cannot run this image's CUDA
    MODEL_INCOMPATIBLE = "model_incompatible"  # the model file is not one this engine build can load
    ENGINE_MISSING = "engine_missing"          # the engine binary is not in this image
    FORK_UNSAFE = "fork_unsafe"                # vLLM's EngineCore forked after CUDA was initialised: relaunched with spawn
    NODE_MISSING = "node_missing"              # a cluster's rank never arrived or never came back (supervisor/cluster/)

    def __str__(self) -> str:
        return self.value

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(c.value for c in cls)



@dataclass(frozen=True)
class Signature:
    failure_class: FailureClass
    pattern: re.Pattern[str]
    reason: str


def sig(failure_class: FailureClass, pattern: str, reason: str) -> Signature:
    return Signature(failure_class, re.compile(pattern), reason)


# A driver too old for the CUDA the engine runs, in the words every CUDA engine can print. The
# supervisor's preflight (supervisor/host/cuda.py) refuses such a driver before the engine starts; these
# catch what gets past it (an image without a floor file, a driver NVML would not describe).
# Where each string comes from:
_DRIVER = "the host's NVIDIA driver is too old for this image's CUDA"
CUDA_DRIVER_SIGNATURES: tuple[Signature, ...] = (
    # torch, c10/cuda/CUDAFunctions.cpp device_count_impl(), the cudaErrorInsufficientDriver branch:
    # "The NVIDIA driver on your system is too old (found version 12080). Please update ..."
    sig(FailureClass.DRIVER_INCOMPATIBLE, r"The NVIDIA driver on your system is too old", _DRIVER),
    # cudaGetErrorString(cudaErrorInsufficientDriver = 35), the CUDA Runtime API's text; llama.cpp's
    # ggml_cuda_init prints it as "failed to initialize CUDA: <that text>" (ggml-cuda.cu).
    sig(FailureClass.DRIVER_INCOMPATIBLE,
        r"CUDA driver version is insufficient for CUDA runtime version|cudaErrorInsufficientDriver"
        r"|CUDA_ERROR_INSUFFICIENT_DRIVER", _DRIVER),
    # cudaErrorSystemDriverMismatch = 803 and cudaErrorCompatNotSupportedOnDevice = 804 (CUDA Runtime
    # API); torch's cudaGetDeviceCount() default branch prints "Error 803: system has unsupported
    # display driver / cuda driver combination" and "Error 804: forward compatibility was attempted
    # on non supported HW" (both seen verbatim in public reports); CUDA_ERROR_* are the driver API's.
    sig(FailureClass.DRIVER_INCOMPATIBLE,
        r"\bError 80[34]: |system has unsupported display driver / cuda driver combination"
        r"|forward compatibility was attempted on non supported HW|cudaErrorSystemDriverMismatch"
        r"|cudaErrorCompatNotSupportedOnDevice|CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"
        r"|CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        "the driver and the image's CUDA libraries do not match (CUDA error 803/804)"),
    # cudaErrorUnsupportedPtxVersion = 222: the driver's JIT is older than the PTX it was handed
    # (an arch-86 build's compute_86 PTX run on a newer GPU by an old driver).
    sig(FailureClass.DRIVER_INCOMPATIBLE, r"the provided PTX was compiled with an unsupported toolchain",
        "the driver is too old to JIT-compile this build's PTX"),
    # glibc's dlopen() error for a NEEDED library that is not there: vllm._C needs libcudart.so.13,
    # llama-server the libcudart.so.NN it was linked with.
    sig(FailureClass.DRIVER_INCOMPATIBLE, r"libcudart\.so\.\d+: cannot open shared object file",
        "the CUDA runtime library this engine was built for is not in the image"),
)


@dataclass(frozen=True)
class Failure:
    failure_class: FailureClass
    reason: str
    exit_code: int | None = None        # Popen convention: <0 is death by signal
    elapsed_s: float | None = None      # launch to exit
    evidence: str | None = None         # the log line that decided it
    hints: tuple[str, ...] = ()         # other telling lines (an autofit abort, say)
    tail: tuple[str, ...] = field(default=(), repr=False)
    rung: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"class": self.failure_class.value, "reason": self.reason, "exit_code": self.exit_code,
                "elapsed_s": None if self.elapsed_s is None else round(self.elapsed_s, 3),
                "evidence": self.evidence, "hints": list(self.hints), "rung": self.rung,
                "stderr_tail": list(self.tail)}


def classify(*, returncode: int | None, elapsed_s: float | None, tail: Sequence[str],
             signatures: Sequence[Signature], hint_signatures: Sequence[Signature] = (),
             stalled: bool = False, stall_reason: str | None = None, rung: str | None = None) -> Failure:
    """Decide the failure class of a server that exited (or stalled)."""
    tail_t = tuple(tail)
    hints = tuple(f"{h.reason}: {line.strip()}" for h in hint_signatures
                  for line in tail_t if h.pattern.search(line))
    common = dict(exit_code=returncode, elapsed_s=elapsed_s, tail=tail_t, rung=rung, hints=hints)
    if stalled:
        return Failure(FailureClass.STALLED, stall_reason or "no loading progress (output, CPU or disk reads) within the "
                       "stall deadline", **common)
    for s in signatures:
        for line in tail_t:
            if s.pattern.search(line):
                return Failure(s.failure_class, s.reason, evidence=line.strip(), **common)
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        reason = f"killed by {name}"
        if returncode == -signal.SIGKILL:
            reason += " (the host's OOM killer does this too: check container memory)"
        return Failure(FailureClass.CRASHED, reason, **common)
    return Failure(FailureClass.CRASHED, f"exited with status {returncode} and no known failure signature", **common)
