"""The supervisor refuses a driver older than the image's CUDA floor, before any engine starts
(supervisor/host/cuda.py), and engine stderr that says the same maps to the same failure class.

NVML is the stand-in tests/support/hw/fake_pynvml.py, with the CUDA version each real driver
branch reports (R550: 12040, R570: 12080, R580: 13000). The engine lines are real text; where
each comes from is written beside it.
"""

from __future__ import annotations

import json

import pytest

from supervisor.host import cuda
from supervisor.engines import llamacpp, vllm
from supervisor.failure import FailureClass, classify
from tests.support.hw import fake_pynvml


def floor_file(tmp_path, version: str, engine: str = "vllm", evidence=None):
    p = tmp_path / "cuda.json"
    p.write_text(json.dumps({"schema": 1, "engine": engine, "cuda": version,
                             "nvidia_require_cuda": f"cuda>={version}",
                             "evidence": evidence or [f"torch requires cuda-toolkit=={version}.3"]}))
    return p


def nvml(branch: str) -> fake_pynvml.FakeNVML:
    return fake_pynvml.FakeNVML([fake_pynvml.a40(0)], driver=fake_pynvml.DRIVERS[branch])


@pytest.mark.parametrize("floor,branch,admitted", [
    ("12.8", "550", False), ("12.8", "570", True), ("12.8", "580", True),
    ("13.0", "550", False), ("13.0", "570", False), ("13.0", "580", True),
])
def test_drivers_against_floors(tmp_path, floor, branch, admitted):
    fake = nvml(branch)
    failure, warning = cuda.preflight(floor_file(tmp_path, floor), probe=lambda: cuda.driver_cuda(fake))
    assert warning is None
    assert fake.inits == fake.shutdowns == 1
    if admitted:
        assert failure is None
        return
    assert failure.failure_class == FailureClass.DRIVER_INCOMPATIBLE
    found = cuda.cuda_text(fake_pynvml.CUDA_OF_BRANCH[branch])
    # the driver found, the minimum needed, and the fix
    assert f"NVIDIA driver {fake_pynvml.DRIVERS[branch]} supports CUDA up to {found}" in failure.reason
    assert f"needs CUDA >= {floor}" in failure.reason
    assert "minCudaVersion" in failure.reason and "allowedCudaVersions" in failure.reason
    assert "image variant" in failure.reason


def test_a_570_driver_under_a_cuda_13_image_names_driver_580_and_the_evidence(tmp_path):
    failure, _ = cuda.preflight(floor_file(tmp_path, "13.0", evidence=["torch 2.13.0 requires cuda-toolkit==13.0.3"]),
                                probe=lambda: cuda.driver_cuda(nvml("570")))
    assert "a driver >= 580" in failure.reason
    assert "torch 2.13.0 requires cuda-toolkit==13.0.3" in failure.reason
    assert failure.evidence == "nvmlSystemGetCudaDriverVersion = 12080"


def test_no_floor_file_is_no_check(tmp_path):
    assert cuda.preflight(tmp_path / "absent.json", probe=lambda: pytest.fail("NVML asked")) == (None, None)


def test_a_cpu_image_floor_of_none_is_no_check(tmp_path):
    p = tmp_path / "cuda.json"
    p.write_text(json.dumps({"schema": 1, "engine": "llamacpp", "cuda": None, "evidence": []}))
    assert cuda.preflight(p, probe=lambda: pytest.fail("NVML asked")) == (None, None)


def test_an_unreadable_floor_file_refuses_rather_than_passes(tmp_path):
    p = tmp_path / "cuda.json"
    p.write_text("{not json")
    failure, _ = cuda.preflight(p, probe=lambda: pytest.fail("NVML asked"))
    assert failure is not None and "unreadable" in failure.reason and "rebuild the image" in failure.reason


def test_no_nvml_warns_and_does_not_refuse(tmp_path):
    fake = fake_pynvml.FakeNVML([], fail_on={"nvmlInit": fake_pynvml.NVMLError_LibraryNotFound})
    failure, warning = cuda.preflight(floor_file(tmp_path, "13.0"), probe=lambda: cuda.driver_cuda(fake))
    assert failure is None
    assert "NVML Shared Library Not Found" in warning and "CUDA >= 13.0" in warning


def test_a_driver_without_the_cuda_version_call_warns_and_still_shuts_nvml_down(tmp_path):
    fake = fake_pynvml.FakeNVML([fake_pynvml.a40(0)],
                                fail_on={"nvmlSystemGetCudaDriverVersion": fake_pynvml.NVMLError_FunctionNotFound})
    failure, warning = cuda.preflight(floor_file(tmp_path, "12.8"), probe=lambda: cuda.driver_cuda(fake))
    assert failure is None and "nvmlSystemGetCudaDriverVersion" in warning
    assert fake.shutdowns == 1


def test_cuda_numbers_round_trip():
    assert cuda.cuda_number("13.0") == 13000 and cuda.cuda_number("12.8") == 12080
    assert cuda.cuda_text(12080) == "12.8" and cuda.cuda_text(13000) == "13.0"
    with pytest.raises(ValueError):
        cuda.cuda_number("13")


# ---------------------------------------------------------------- the engine's own words
REAL_LINES = [
    # torch, c10/cuda/CUDAFunctions.cpp (device_count_impl), as torch.cuda warns it on a 570 driver
    "UserWarning: CUDA initialization: The NVIDIA driver on your system is too old (found version 12080). "
    "Please update your GPU driver by downloading and installing a new version from the URL: "
    "http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to install a "
    "PyTorch version that has been compiled with your version of the CUDA driver.",
    # llama.cpp ggml-cuda.cu ggml_cuda_init + cudaGetErrorString(cudaErrorInsufficientDriver)
    "ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient for CUDA runtime version",
    # torch's cudaGetDeviceCount default branch with CUDA error 803 (cudaErrorSystemDriverMismatch)
    "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
    "NumCudaDevices() that might have already set an error? Error 803: system has unsupported display driver / "
    "cuda driver combination",
    # the same branch with CUDA error 804 (cudaErrorCompatNotSupportedOnDevice)
    "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
    "NumCudaDevices() that might have already set an error? Error 804: forward compatibility was attempted on "
    "non supported HW",
    # glibc's dlopen error for vllm._C on an image without the CUDA 13 runtime
    "ImportError: libcudart.so.13: cannot open shared object file: No such file or directory",
    # cudaErrorUnsupportedPtxVersion (222) as ggml's CUDA error reporter prints it
    "CUDA error: the provided PTX was compiled with an unsupported toolchain.",
]


@pytest.mark.parametrize("engine", [vllm, llamacpp], ids=["vllm", "llamacpp"])
@pytest.mark.parametrize("line", REAL_LINES, ids=["torch-too-old", "insufficient", "803", "804", "libcudart", "ptx"])
def test_engine_words_for_an_old_driver_are_driver_incompatible(engine, line):
    f = classify(returncode=1, elapsed_s=3.0, tail=["INFO starting", line], signatures=engine.SIGNATURES)
    assert f.failure_class == FailureClass.DRIVER_INCOMPATIBLE, f
    assert f.evidence == line.strip()


def test_vllm_says_driver_before_the_device_type_and_missing_file_lines_that_follow():
    # what vLLM logs after torch gave up on CUDA: the root cause must win over its consequences
    tail = ["ImportError: libcudart.so.13: cannot open shared object file: No such file or directory",
            "RuntimeError: Failed to infer device type"]
    f = classify(returncode=1, elapsed_s=2.0, tail=tail, signatures=vllm.SIGNATURES)
    assert f.failure_class == FailureClass.DRIVER_INCOMPATIBLE


def test_an_ordinary_missing_model_file_is_still_a_load_error():
    f = classify(returncode=1, elapsed_s=2.0, signatures=vllm.SIGNATURES,
                 tail=["FileNotFoundError: [Errno 2] No such file or directory: '/models/x/config.json'"])
    assert f.failure_class == FailureClass.LOAD_ERROR
