"""The CUDA a target's engine needs, known before the image is built, and checked against what the
target declares.

A vLLM target installs a pinned wheel whose `torch==X` requirement decides the CUDA (torch 2.13.0
requires `cuda-toolkit==13.0.3`): `build.py lock` reads both packages' metadata from the index
(PEP 691 JSON for the file list, PEP 658 `<file>.metadata` for Requires-Dist, no wheel download)
and records the result as the pin `engine.cuda`. A llama.cpp target compiles with its build base's
toolkit, so its declared CUDA must be the one the `nvidia/cuda:X.Y.Z-...` base carries. Either way
the image build measures again from what it installed (images/pins/cudafloor.py) and fails on a
difference: the lock catches it before a 5 GB build, the build catches what the lock could not see.
"""

from __future__ import annotations

import io
import re
import zipfile

import requests

from supervisor.errors import KilnError

from .cudafloor import Measured, cuda_from_requirements
from ..target import Target

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
# The Python the vLLM images install into (Ubuntu 24.04's python3). torch's CUDA requirements are
# the same on every CPython it ships for; the tag only picks one wheel to read them from.
IMAGE_PYTHON_TAG = "cp312"
_BASE_CUDA = re.compile(r"(?:^|/)cuda:(\d+)\.(\d+)(?:\.\d+)?-")


class CudaUnknown(KilnError):
    """The index did not answer what the engine's CUDA is (no file, no metadata, no torch pin)."""


def index_files(package: str, *, index: str, session: requests.Session) -> list[dict]:
    r = session.get(f"{index}/{package}/", headers={"Accept": SIMPLE_JSON}, timeout=60)
    if r.status_code == 404:
        raise CudaUnknown(f"{index} has no project {package}")
    r.raise_for_status()
    return r.json().get("files", [])


def file_metadata(file: dict, *, session: requests.Session) -> str:
    """A wheel's METADATA without downloading the wheel: PEP 658 (`<url>.metadata`) where the index
    serves it, else the METADATA member read out of the remote zip through HTTP range requests
    (pip's own fallback; the index reached here serves PEP 658 for some files and 404 for others)."""
    r = session.get(file["url"] + ".metadata", timeout=60)
    if r.status_code == 200:
        return r.text
    if not file["filename"].endswith(".whl"):
        raise CudaUnknown(f"the index serves no metadata for {file['filename']} (not a wheel)")
    with zipfile.ZipFile(_RangeFile(file["url"], session)) as z:
        names = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if not names:
            raise CudaUnknown(f"{file['filename']} has no .dist-info/METADATA")
        return z.read(names[0]).decode("utf-8", errors="replace")


class _RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file, fetched in HTTP Range blocks as zipfile reads."""

    BLOCK = 256 * 1024

    def __init__(self, url: str, session: requests.Session):
        self.url, self.session, self.pos = url, session, 0
        head = session.get(url, headers={"Range": "bytes=-1"}, timeout=60)
        if head.status_code != 206 or "/" not in head.headers.get("Content-Range", ""):
            raise CudaUnknown(f"{url} answers no range requests: its metadata cannot be read remotely")
        self.size = int(head.headers["Content-Range"].rsplit("/", 1)[1])
        self.blocks: dict[int, bytes] = {}

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + offset
        return self.pos

    def _block(self, n: int) -> bytes:
        if n not in self.blocks:
            lo = n * self.BLOCK
            r = self.session.get(self.url, headers={"Range": f"bytes={lo}-{min(lo + self.BLOCK, self.size) - 1}"},
                                 timeout=120)
            r.raise_for_status()
            self.blocks[n] = r.content
        return self.blocks[n]

    def read(self, size: int = -1) -> bytes:
        end = self.size if size is None or size < 0 else min(self.size, self.pos + size)
        out = bytearray()
        while self.pos < end:
            block = self._block(self.pos // self.BLOCK)
            start = self.pos % self.BLOCK
            piece = block[start:start + end - self.pos]
            out += piece
            self.pos += len(piece)
        return bytes(out)

    def readinto(self, b) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


def requires_dist(metadata: str) -> list[str]:
    return [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]


def exact_pin(requirements: list[str], name: str) -> str | None:
    """The version of `name==V` in requirements (markers and extras ignored), else None."""
    for req in requirements:
        m = re.match(rf"^{re.escape(name)}\s*(\[[^\]]*\])?\s*==\s*([\w.+!-]+)\s*(;|$)", req, re.I)
        if m:
            return m.group(2)
    return None


def pick_wheel(files: list[dict], package: str, version: str, python_tag: str = IMAGE_PYTHON_TAG) -> dict:
    prefix = f"{package}-{version}-{python_tag}-{python_tag}-"
    for f in files:
        name = f.get("filename", "")
        if name.startswith(prefix) and "manylinux" in name and name.endswith("_x86_64.whl"):
            return f
    raise CudaUnknown(f"no {python_tag} manylinux x86_64 wheel of {package}=={version} on the index")


def engine_cuda(target: Target, *, index: str, session: requests.Session | None = None) -> tuple[str, str]:
    """(CUDA major.minor, where it came from) for a pypi-wheel target, from the index's metadata."""
    s = session or requests.Session()
    src = target.source
    assert src.kind == "pypi-wheel" and src.package and src.filename
    engine_file = next((f for f in index_files(src.package, index=index, session=s)
                        if f.get("filename") == src.filename), None)
    if engine_file is None:
        raise CudaUnknown(f"{index} has no file {src.filename}")
    torch_version = exact_pin(requires_dist(file_metadata(engine_file, session=s)), "torch")
    if torch_version is None:
        raise CudaUnknown(f"{src.filename} pins no torch==VERSION: its CUDA cannot be read from metadata")
    torch_file = pick_wheel(index_files("torch", index=index, session=s), "torch", torch_version)
    measured = Measured()
    cuda_from_requirements(requires_dist(file_metadata(torch_file, session=s)), f"torch {torch_version}", measured)
    floor = measured.floor()
    if floor is None:
        raise CudaUnknown(f"{torch_file['filename']} requires no CUDA packages (a CPU build of torch?)")
    source = (f"PyPI metadata (PEP 658) from {index}: {src.filename} requires torch=={torch_version}; "
              + "; ".join(measured.evidence) + f" (read from {torch_file['filename']})")
    return floor, source


def base_cuda(ref: str) -> str | None:
    """'nvidia/cuda:12.8.1-devel-ubuntu24.04' -> '12.8'; None for a base that is not NVIDIA's CUDA image."""
    m = _BASE_CUDA.search(ref.split("@", 1)[0])
    return f"{m.group(1)}.{m.group(2)}" if m else None


def declared_problems(target: Target, locked: str | None) -> list[str]:
    """Every way a target's [cuda] version disagrees with what its engine will run, one line each."""
    declared = target.cuda_version
    out: list[str] = []
    if target.engine == "vllm" and locked and locked != declared:
        out.append(f"[cuda] version is \"{declared}\" but {target.source.package}=={target.source.version} "
                   f"installs CUDA {locked} (images/lock.toml {target.name}.\"engine.cuda\"): set "
                   f"[cuda] version = \"{locked}\"; a CUDA {declared} build of the engine is a separate "
                   "target, not a relabel")
    if target.engine == "llamacpp" and declared:
        base = base_cuda(target.bases.build)
        if base and base != declared:
            out.append(f"[cuda] version is \"{declared}\" but the build base {target.bases.build} compiles "
                       f"with CUDA {base}: make them agree")
    return out
