"""Rebuild and compare: does compiling the same locked inputs again give the same tarball, byte for byte?

    fresh_compile(target, pins, out)  compile in a new work directory (never the cache) and pack
    again(target, pins, out)          the target's binaries compiled once more from scratch: on this
                                      host, or in the Dockerfile's compile stage with no build cache
    differences(a, b)                 every way two tarballs differ (images/tarcompare.py): the gzip
                                      header, each member's header and content sha256
    check_same(a, b)                  raises RebuildMismatch naming both sha256s and each difference
    leaks(prefix, needles)            build paths (the work directory) that landed in the files
    toolchain()                       the compiler and CMake a host compile uses, as they print it

The work directory of each fresh compile has its own name and length (`label`), so a build path that
reaches the binary shows up as a difference here, not later on someone else's machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Mapping

from . import artifacts
from .artifacts import ArtifactError, ArtifactSpec, Packed
from ..digest import sha256_file
from ..tarcompare import differences
from ..pins.lock import Pin
from ..target import Target

__all__ = ["RebuildMismatch", "again", "check_same", "differences", "fresh_compile", "leaks", "toolchain"]


class RebuildMismatch(ArtifactError):
    """Two compiles of the same locked inputs gave different tarballs: the build is not reproducible."""

    def __init__(self, first: Path, first_sha: str, second: Path, second_sha: str, diffs: list[str]) -> None:
        self.first_sha256, self.second_sha256, self.differences = first_sha, second_sha, diffs
        shown = diffs[:40] + ([f"... and {len(diffs) - 40} more"] if len(diffs) > 40 else [])
        super().__init__(
            f"the rebuild differs: {first.name} has sha256 {first_sha}, the rebuild {second_sha}; not publishing.\n"
            + "\n".join(f"  - {d}" for d in shown)
            + "\nFix the cause at its source (docs/images.md, 'Rebuild and compare' names the known ones).")


def fresh_compile(target: Target, pins: Mapping[str, Pin], spec: ArtifactSpec, out: Path, *, label: str,
                  patch_files: Mapping[str, Path] | None = None, jobs: int | None = None) -> tuple[Packed, Path]:
    """Compile in a new temporary work directory named after `label` and pack into out/packed.

    Returns (packed, work directory it used: deleted by now, but its path is what to look for)."""
    from .obtain import BinariesError, compile_args

    out = Path(out)
    prefix = out / "prefix"
    if prefix.exists():
        shutil.rmtree(prefix)
    with tempfile.TemporaryDirectory(prefix=f"kiln-rebuild-{label}-") as work:
        argv = compile_args(target, pins, prefix, Path(work), patch_files=patch_files or {}, jobs=jobs)
        r = subprocess.run(argv, check=False)
        if r.returncode != 0:
            raise BinariesError(f"compile ({label}) failed (exit {r.returncode}); see the output above")
        used = Path(work)
    return artifacts.pack(prefix, spec, out / "packed"), used


def again(target: Target, pins: Mapping[str, Pin], out: Path, *, in_build: bool,
          patch_files: Mapping[str, Path] | None = None, allow_floating: bool = False,
          network: str = "host") -> Packed:
    """Compile the target's binaries once more, never from a cache, and pack them into out.

    in_build: the Dockerfile's engine-compile stage on the pinned build base, with --no-cache (the
    tarball is keyed by that base); else on this host, in a work directory of its own."""
    from .obtain import compile_in_build, expected_spec

    if in_build:
        return compile_in_build(target, pins, patch_files=patch_files, allow_floating=allow_floating,
                                network=network, no_cache=True, out=Path(out) / "packed")
    spec = expected_spec(target, pins, artifacts.os_identity())
    packed, _ = fresh_compile(target, pins, spec, out, label="again", patch_files=patch_files)
    return packed


def check_same(first: Path, second: Path) -> str:
    """The sha256 both tarballs share, or RebuildMismatch naming both and every difference."""
    sa, sb = sha256_file(first), sha256_file(second)
    if sa != sb:
        raise RebuildMismatch(first, sa, second, sb, differences(first, second) or ["(no member differs)"])
    return sa


def leaks(root: Path, needles: list[str]) -> list[str]:
    """'<file>: <needle>' for each file under root whose bytes hold a needle (a build path)."""
    found = []
    encoded = [(n, n.encode()) for n in needles if n]
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file() and not p.is_symlink()):
        data = path.read_bytes()
        found += [f"{path.relative_to(root).as_posix()}: {n}" for n, b in encoded if b in data]
    return found


def toolchain() -> dict[str, str]:
    """The first line of `cc --version`, `c++ --version` and `cmake --version`: what CMake compiles with."""
    out = {}
    for tool in ("cc", "c++", "cmake"):
        path = shutil.which(tool)
        if path is None:
            out[tool] = "absent"
            continue
        r = subprocess.run([path, "--version"], capture_output=True, text=True, check=False,
                           env={**os.environ, "LC_ALL": "C"})
        out[tool] = (r.stdout.splitlines() or ["(no output)"])[0].strip()
    return out

