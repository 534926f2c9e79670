"""The CUDA an engine really needs, measured from what is installed, not read off a label.

The field notes' vLLM images said CUDA 12.8 while `vllm==0.27.1` pulled `torch==2.13.0`, whose wheel
requires `cuda-toolkit==13.0.3` and `nvidia-*-cu13`: the engine ran CUDA 13, which needs a driver
>= 580, and the base image's `NVIDIA_REQUIRE_CUDA` (what the NVIDIA container runtime checks) said
12.8. So the image build measures, and refuses a target whose `[cuda] version` disagrees:

- vLLM: torch's requirements (`cuda-toolkit==X.Y.Z`, `nvidia-cuda-runtime-cuNN==X.Y.Z`, any
  `nvidia-*-cuNN`), `cuda` in torch/version.py (what `torch.version.cuda` prints), and the
  `libcudart.so.NN` that vLLM's compiled extensions ask for (their ELF DT_NEEDED entries).
- llama.cpp: the `libcudart.so.NN` llama-server links, the library of that name the image
  resolves it to (`libcudart.so.12.8.90` is CUDA 12.8), and the nvcc that compiled it
  (share/kiln/nvcc-version.txt, written by the image's compile stage).

It writes what it measured as share/kiln/cuda.json; the supervisor reads that file before it
starts the engine and refuses a driver older than the floor (supervisor/host/cuda.py).

Standard library only: this file is copied into the build context as kiln/cuda-floor.py and run
by the image's own Python during `docker build`. The lock (images/pins/cuda.py) reuses its rules.

    python3 cuda-floor.py --engine vllm --declared 13.0 --out /opt/kiln/engine/share/kiln/cuda.json
    python3 cuda-floor.py --engine llamacpp --prefix /opt/kiln/engine --declared 12.8 --out ...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

try:
    from supervisor.errors import KilnError
except ImportError:     # inside the image build this file runs alone, before the supervisor is copied in
    KilnError = Exception  # type: ignore[misc,assignment]

SCHEMA = 1
FLOOR_FILE = "share/kiln/cuda.json"          # under the engine prefix (/opt/kiln/engine)
NVCC_FILE = "share/kiln/nvcc-version.txt"   # `nvcc --version` of the compile stage, when there was one

_TOOLKIT = re.compile(r"^cuda-toolkit(\[[^\]]*\])?\s*==\s*(\d+)\.(\d+)")
_RUNTIME = re.compile(r"^nvidia-cuda-runtime(-cu\d+)?\s*==\s*(\d+)\.(\d+)")
_CU_SUFFIX = re.compile(r"^nvidia-[a-z0-9-]+-cu(\d+)\b")
_CUDART = re.compile(r"^libcudart\.so\.(\d+)$")
_CUDART_FILE = re.compile(r"^libcudart\.so\.(\d+)\.(\d+)(\.\d+)*$")
_NVCC = re.compile(r"release (\d+)\.(\d+)")
_TORCH_CUDA = re.compile(r"^cuda\s*(?::\s*[^=]+)?=\s*['\"](\d+)\.(\d+)['\"]", re.M)


class FloorError(KilnError):
    """The CUDA could not be measured, or the measurements disagree with each other or the target."""


def require_cuda(version: str) -> str:
    """NVIDIA_REQUIRE_CUDA for a floor, in the NVIDIA container toolkit's constraint syntax."""
    return f"cuda>={version}"


@dataclass
class Measured:
    """major.minor readings (a reading of the major alone carries minor None), each with its evidence."""
    readings: list[tuple[int, int | None, str]] = field(default_factory=list)

    def add(self, major: int, minor: int | None, evidence: str) -> None:
        self.readings.append((major, minor, evidence))

    @property
    def evidence(self) -> list[str]:
        return [e for _, _, e in self.readings]

    def floor(self) -> str | None:
        """The one CUDA every reading agrees on; FloorError naming the readings when they don't."""
        if not self.readings:
            return None
        majors = {m for m, _, _ in self.readings}
        full = {(m, n) for m, n, _ in self.readings if n is not None}
        if len(majors) > 1 or len(full) > 1:
            raise FloorError("the installed engine's CUDA readings disagree: " + "; ".join(self.evidence))
        if not full:
            raise FloorError("only the CUDA major version could be measured (" + "; ".join(self.evidence)
                             + "): no reading gave the minor version")
        major, minor = full.pop()
        return f"{major}.{minor}"


# --------------------------------------------------------------------------- requirements
def cuda_from_requirements(requirements: list[str], who: str, into: Measured) -> None:
    """Readings from a package's Requires-Dist lines (torch's, say), markers ignored: on Linux x86-64
    torch's CUDA requirements all apply."""
    suffixes: set[int] = set()
    for line in requirements:
        req = line.split(";", 1)[0].strip()
        if m := _TOOLKIT.match(req):
            into.add(int(m.group(2)), int(m.group(3)), f"{who} requires {req}")
        elif m := _RUNTIME.match(req):
            into.add(int(m.group(2)), int(m.group(3)), f"{who} requires {req}")
        elif m := _CU_SUFFIX.match(req):
            suffixes.add(int(m.group(1)))
    for major in sorted(suffixes):
        into.add(major, None, f"{who} requires nvidia-*-cu{major} packages")


def cuda_from_torch_version_py(text: str, who: str, into: Measured) -> None:
    """torch/version.py says `cuda: Optional[str] = '13.0'` (what torch.version.cuda prints)."""
    if m := _TORCH_CUDA.search(text):
        into.add(int(m.group(1)), int(m.group(2)), f"{who}: torch.version.cuda = {m.group(1)}.{m.group(2)}")


# --------------------------------------------------------------------------- ELF
def dynamic_entries(path: Path) -> dict[int, list[str]]:
    """The string-valued dynamic entries of a 64-bit little-endian ELF file, by tag: DT_NEEDED (1),
    DT_RPATH (15), DT_RUNPATH (29) -- what `readelf -d` lists as NEEDED, RPATH and RUNPATH.

    Read from the section headers: the SHT_DYNAMIC section and the string table it links to.
    {} for a file that is not such an ELF file or has no dynamic section (a static binary).
    """
    out: dict[int, list[str]] = {}
    with open(path, "rb") as f:
        ident = f.read(16)
        if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            return out
        f.seek(0x28)
        (shoff,) = struct.unpack("<Q", f.read(8))
        f.seek(0x3A)
        shentsize, shnum, _ = struct.unpack("<HHH", f.read(6))
        if not shoff or not shnum:
            return out
        f.seek(shoff)
        raw = f.read(shentsize * shnum)
        sections = [struct.unpack_from("<IIQQQQIIQQ", raw, i * shentsize) for i in range(shnum)]
        for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
            if sh_type != 6:          # SHT_DYNAMIC
                continue
            strtab = sections[link]
            f.seek(strtab[4])
            strings = f.read(strtab[5])
            f.seek(offset)
            dyn = f.read(size)
            step = entsize or 16
            for i in range(0, len(dyn) - step + 1, step):
                tag, val = struct.unpack_from("<qQ", dyn, i)
                if tag == 0:          # DT_NULL
                    break
                if tag in (1, 15, 29):
                    out.setdefault(tag, []).append(strings[val:strings.index(b"\0", val)].decode())
    return out


def needed_libraries(path: Path) -> list[str]:
    """The DT_NEEDED entries (what `readelf -d` lists as NEEDED); [] for a non-ELF or static file."""
    return dynamic_entries(path).get(1, [])


def search_path(path: Path) -> list[str]:
    """The directories a binary's RUNPATH (else RPATH) asks the loader to search, $ORIGIN expanded."""
    entries = dynamic_entries(path)
    dirs = entries.get(29) or entries.get(15) or []
    origin = str(path.resolve().parent)
    return [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)
            for entry in dirs for d in entry.split(":") if d]


def cudart_major(needed: list[str]) -> int | None:
    for name in needed:
        if m := _CUDART.match(name):
            return int(m.group(1))
    return None


def links_cuda(needed: list[str]) -> bool:
    return any(n.startswith(("libcudart.so", "libcuda.so", "libcublas")) for n in needed)


# --------------------------------------------------------------------------- vLLM
def measure_python_engine(into: Measured, package: str = "vllm") -> None:
    """torch's requirements and version.py, and the libcudart the engine's extensions need, read
    through the running interpreter's importlib.metadata (the image's venv)."""
    from importlib import metadata

    try:
        torch = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        raise FloorError("torch is not installed: cannot tell which CUDA the engine runs") from None
    who = f"torch {torch.version}"
    cuda_from_requirements(torch.requires or [], who, into)
    version_py = Path(str(torch.locate_file("torch/version.py")))
    if version_py.is_file():
        cuda_from_torch_version_py(version_py.read_text(encoding="utf-8"), who, into)
    try:
        engine = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        raise FloorError(f"{package} is not installed") from None
    for rel in sorted(str(p) for p in engine.files or () if str(p).endswith(".so")):
        so = Path(str(engine.locate_file(rel)))
        major = cudart_major(needed_libraries(so)) if so.is_file() else None
        if major is not None:
            into.add(major, None, f"{package} {engine.version} {rel} needs libcudart.so.{major}")


# --------------------------------------------------------------------------- llama.cpp
def _ldconfig_paths() -> dict[str, str]:
    """soname -> path, from `ldconfig -p` (what the dynamic loader of this image would find)."""
    for exe in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=30, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        paths: dict[str, str] = {}
        for line in out.splitlines():
            name, sep, path = line.strip().partition(" => ")
            if sep and "x86-64" in name:
                paths.setdefault(name.split()[0], path.strip())
        return paths
    return {}


def resolve_soname(soname: str, search: list[str] | None = None, runpath: list[str] | None = None) -> Path | None:
    """The file a soname loads from, in the loader's order for a RUNPATH binary: LD_LIBRARY_PATH (or
    the given `search` dirs), the binary's RUNPATH, then ldconfig's cache."""
    for d in [*(search or [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]), *(runpath or [])]:
        cand = Path(d) / soname
        if cand.exists():
            return cand.resolve()
    path = _ldconfig_paths().get(soname)
    return Path(path).resolve() if path else None


def measure_llamacpp(prefix: Path, into: Measured, *, search: list[str] | None = None) -> bool:
    """Readings for a llama-server prefix; False when the binary links no CUDA at all (a CPU build)."""
    binary = prefix / "bin" / "llama-server"
    if not binary.is_file():
        raise FloorError(f"{binary} does not exist")
    needed = needed_libraries(binary)
    nvcc = prefix / NVCC_FILE
    if nvcc.is_file() and (m := _NVCC.search(nvcc.read_text(encoding="utf-8", errors="replace"))):
        into.add(int(m.group(1)), int(m.group(2)), f"compiled by nvcc release {m.group(1)}.{m.group(2)} ({NVCC_FILE})")
    major = cudart_major(needed)
    if major is not None:
        into.add(major, None, f"bin/llama-server needs libcudart.so.{major}")
        lib = resolve_soname(f"libcudart.so.{major}", search, search_path(binary))
        if lib is None:
            raise FloorError(f"bin/llama-server needs libcudart.so.{major}, which this image does not have "
                             "(the runtime base must carry that CUDA runtime)")
        if m := _CUDART_FILE.match(lib.name):
            into.add(int(m.group(1)), int(m.group(2)), f"the image resolves it to {lib}")
    return bool(into.readings) or links_cuda(needed)


# --------------------------------------------------------------------------- the build step
def measure(engine: str, prefix: Path) -> tuple[str | None, list[str]]:
    into = Measured()
    if engine == "vllm":
        measure_python_engine(into)
    elif engine == "llamacpp":
        if not measure_llamacpp(prefix, into):
            return None, ["bin/llama-server links no CUDA library (a CPU build)"]
        if not into.readings:
            raise FloorError("bin/llama-server links CUDA but neither a libcudart.so.NN entry nor "
                             f"{NVCC_FILE} says which CUDA: cannot measure its floor")
    else:
        raise FloorError(f"unknown engine {engine!r}")
    return into.floor(), into.evidence


def check_declared(declared: str | None, measured: str | None, evidence: list[str], target: str = "") -> None:
    if declared == measured:
        return
    said = f"[cuda] version = \"{declared}\"" if declared else "no [cuda] version (a CPU target)"
    found = f"CUDA {measured}" if measured else "no CUDA"
    raise FloorError(f"target{' ' + target if target else ''} declares {said} but the installed engine "
                     f"runs {found} ({'; '.join(evidence)}): set [cuda] version = \"{measured}\" in the "
                     "target (and its base), or install a build of the engine for the declared CUDA as a "
                     "separate target")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="cuda-floor.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", required=True, choices=("vllm", "llamacpp"))
    ap.add_argument("--prefix", default="/opt/kiln/engine", type=Path)
    ap.add_argument("--declared", default="", help="the target's [cuda] version; empty for a CPU target")
    ap.add_argument("--target", default="")
    ap.add_argument("--measure-only", action="store_true",
                    help="write what was measured and check nothing against --declared (a host build)")
    ap.add_argument("--out", type=Path, help=f"default: PREFIX/{FLOOR_FILE}")
    args = ap.parse_args(argv)
    declared = args.declared or None
    try:
        floor, evidence = measure(args.engine, args.prefix)
        if not args.measure_only:
            check_declared(declared, floor, evidence, args.target)
        env = os.environ.get("NVIDIA_REQUIRE_CUDA")
        if floor and env is not None and env != require_cuda(floor):
            raise FloorError(f"NVIDIA_REQUIRE_CUDA is {env!r} in this image but the engine needs "
                             f"{require_cuda(floor)!r}: the container runtime would check the wrong floor")
    except (FloorError, OSError) as e:
        print(f"cuda-floor: error: {e}", file=sys.stderr)
        return 1
    out = args.out or args.prefix / FLOOR_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"schema": SCHEMA, "engine": args.engine, "cuda": floor,
              "nvidia_require_cuda": require_cuda(floor) if floor else None, "evidence": evidence}
    out.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"cuda-floor: {args.engine} needs {'CUDA ' + floor if floor else 'no CUDA'}: " + "; ".join(evidence),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
