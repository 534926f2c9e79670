"""Real ELF files that link "CUDA", for the CUDA-floor tests on a machine with no CUDA toolkit.

gcc and the real linker make them: a shared library whose SONAME is `libcudart.so.NN` (it stands
for CUDA's runtime library; it exports nothing CUDA has), an executable or extension that NEEDs
it, and the file layout the real toolkit installs (`libcudart.so.12.8.90`, with the soname as a
link to it). What the floor measures — DT_NEEDED entries, SONAME, the resolved file name — is
exactly what these carry; `readelf -d` reads them the same way it reads the real ones.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from images.pins.cudafloor import NVCC_FILE

# torch 2.13.0's Requires-Dist, copied from PyPI's metadata of
# torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl (PEP 658, read 2026-12-01).
TORCH_2_13_0_REQUIRES = [
    "filelock", "typing-extensions>=4.10.0", "setuptools>=77.0.3", "sympy>=1.13.3", "networkx>=2.5.1",
    "jinja2", "fsspec>=0.8.5",
    'cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3; platform_system == "Linux"',
    'cuda-bindings<14,>=13.0.3; platform_system == "Linux" and python_version < "3.15"',
    'nvidia-cudnn-cu13==9.20.0.48; platform_system == "Linux"',
    'nvidia-cusparselt-cu13==0.8.1; platform_system == "Linux"',
    'nvidia-nccl-cu13==2.29.7; platform_system == "Linux"',
    'nvidia-nvshmem-cu13==3.4.5; platform_system == "Linux"',
    'triton==3.7.1; platform_system == "Linux" and python_version < "3.15"',
]


def _gcc() -> str:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler (gcc) to make ELF test files")
    return gcc


def cudart(dirpath: Path, version: str) -> Path:
    """dirpath/libcudart.so.<full version> with SONAME libcudart.so.<major>, and the soname link."""
    major = version.split(".")[0]
    dirpath.mkdir(parents=True, exist_ok=True)
    src = dirpath / "cudart_stub.c"
    src.write_text("int kiln_cudart_stub(void) { return 0; }\n")
    lib = dirpath / f"libcudart.so.{version}"
    subprocess.run([_gcc(), "-shared", "-fPIC", f"-Wl,-soname,libcudart.so.{major}", "-o", str(lib), str(src)],
                   check=True)
    link = dirpath / f"libcudart.so.{major}"
    if not link.exists():
        link.symlink_to(lib.name)
    src.unlink()
    return lib


def linked(out: Path, libdir: Path, major: int | None, *, shared: bool = False, rpath: bool = False) -> Path:
    """An executable (or, shared=True, an extension .so) that NEEDs libcudart.so.<major>; major None
    links nothing CUDA (a CPU build)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent / (out.name + ".c")
    if major is None:
        src.write_text("int main(void) { return 0; }\n")
        args = [_gcc(), "-o", str(out), str(src)]
    else:
        src.write_text("int kiln_cudart_stub(void);\nint main(void) { return kiln_cudart_stub(); }\n")
        args = [_gcc(), *(["-shared", "-fPIC"] if shared else []), "-o", str(out), str(src),
                f"-L{libdir}", f"-l:libcudart.so.{major}", "-Wl,--no-as-needed",
                *([f"-Wl,-rpath,{libdir}", "-Wl,--enable-new-dtags"] if rpath else [])]
    subprocess.run(args, check=True)
    src.unlink()
    return out


def fake_vllm_site(root: Path, *, toolkit: str, cudart_major: int) -> Path:
    """A site-packages with torch's dist-info (its real Requires-Dist form) and version.py, and a vllm
    whose compiled extension NEEDs libcudart.so.<cudart_major>.
    stand-in: the CUDA wheel's headers without its 300 MB (the CPU engine links no CUDA)."""
    site = root / "site"
    torch_info = site / "torch-2.13.0.dist-info"
    torch_info.mkdir(parents=True)
    reqs = [r.replace("==13.0.3", f"=={toolkit}") for r in TORCH_2_13_0_REQUIRES]
    (torch_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0\n"
                                         + "".join(f"Requires-Dist: {r}\n" for r in reqs))
    (torch_info / "RECORD").write_text("torch/version.py,,\n")
    (site / "torch").mkdir()
    major, minor = toolkit.split(".")[:2]
    # the form torch's own generated version.py has
    (site / "torch" / "version.py").write_text(
        "from typing import Optional\n\n__version__ = '2.13.0'\ndebug = False\n"
        f"cuda: Optional[str] = '{major}.{minor}'\nhip: Optional[str] = None\n")
    vinfo = site / "vllm-0.27.1.dist-info"
    vinfo.mkdir()
    (vinfo / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.27.1\n")
    (vinfo / "RECORD").write_text("vllm/__init__.py,,\nvllm/_C.abi3.so,,\n")
    (site / "vllm").mkdir()
    (site / "vllm" / "__init__.py").write_text("")
    libdir = root / "cudalib"
    cudart(libdir, f"{cudart_major}.0.96")
    linked(site / "vllm" / "_C.abi3.so", libdir, cudart_major, shared=True)
    return site


def fake_llama_prefix(root: Path, *, runtime: str | None, nvcc: str | None) -> tuple[Path, Path]:
    prefix = root / "engine"
    libdir = root / "cuda" / "lib64"
    if runtime:
        cudart(libdir, runtime)
    linked(prefix / "bin" / "llama-server", libdir, int(runtime.split(".")[0]) if runtime else None)
    if nvcc:
        (prefix / "share" / "kiln").mkdir(parents=True, exist_ok=True)
        # the last lines of `nvcc --version`, as the compile stage writes them
        (prefix / NVCC_FILE).write_text(
            "nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\n"
            f"Cuda compilation tools, release {nvcc}, V{nvcc}.93\n")
    return prefix, libdir
