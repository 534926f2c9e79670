"""The engine's binaries: what a target expects them to be, compiling them on a host,
and fetching a prebuilt tarball that is verified before anything runs it.

The field notes' boot time fell from 14m28s to ~4 minutes once compiled binaries were
published (2 s to extract vs 8m34s to compile). The expected ArtifactSpec is
derived from the target and its lock alone, so a tarball for another arch,
CUDA version, source, patch set or base is refused by name and by manifest.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Mapping

import requests

from supervisor.errors import KilnError

from . import artifacts
from .artifacts import ArtifactSpec, Packed
from ..digest import sha256_file
from ..pins.lock import Pin, source_date_epoch
from ..paths import COMPILE_SCRIPT, IMAGES_DIR
from .stores import Store
from ..target import Target


def cache_dir() -> Path:
    return Path(os.environ.get("KILN_CACHE_DIR") or Path.home() / ".cache" / "kiln")


def local_store_dir() -> Path:
    """Where `compile` publishes by default, and `--binaries auto` looks last."""
    return cache_dir() / "artifacts"


class BinariesError(KilnError):
    pass


def expected_spec(target: Target, pins: Mapping[str, Pin], base: str) -> ArtifactSpec:
    src = target.source
    if src.kind == "git":
        commit = pins["source.commit"].value
        source = f"git:{src.url}@{commit}" if commit else f"git:{src.url}#{src.branch}"
    else:
        source = f"sdist:sha256:{pins['source.sha256'].value}"
    patches = {p.name: pins[f"patch.{p.name}"].value or "floating" for p in target.patches}
    return ArtifactSpec(
        engine="llama.cpp",
        source=source,
        patch_set=artifacts.patch_set_hash(patches) if patches else "none",
        cuda=target.cuda_version or "none",
        archs="-".join(target.cuda_archs) or "cpu",
        build_config=artifacts.build_config_hash(target.cmake_flags, sha256_file(COMPILE_SCRIPT),
                                                 source_date_epoch(target, pins)),
        base=base,
    )


def fetch_source(target: Target, pins: Mapping[str, Pin]) -> Path:
    """The sdist, downloaded once into the cache and verified by its locked sha256."""
    src = target.source
    sha = pins["source.sha256"].value
    if not sha:
        raise BinariesError(f"{target.name}: source.sha256 is unresolved; run `python build.py lock --target {target.name}`")
    dest = cache_dir() / "sources" / sha / (src.filename or "source")
    if dest.is_file() and sha256_file(dest) == sha:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    with requests.get(src.url, stream=True, timeout=60) as r:
        r.raise_for_status()
        h = hashlib.sha256()
        with open(tmp, "wb") as f:
            for chunk in r.iter_content(1 << 20):
                h.update(chunk)
                f.write(chunk)
    if h.hexdigest() != sha:
        tmp.unlink(missing_ok=True)
        raise BinariesError(f"{src.url} has sha256 {h.hexdigest()}, the lock says {sha}: refusing it")
    tmp.replace(dest)
    return dest


def patch_paths(target: Target, patch_files: Mapping[str, Path]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for p in target.patches:
        path = patch_files.get(p.name) or (IMAGES_DIR / p.path if p.path else None)
        if path is None or not Path(path).is_file():
            raise BinariesError(f"patch {p.name}: no file (looked at {path}); pass --patch-file {p.name}=PATH")
        out[p.name] = Path(path)
    return out


def compile_args(target: Target, pins: Mapping[str, Pin], prefix: Path, work: Path, *,
                 patch_files: Mapping[str, Path], jobs: int | None) -> list[str]:
    argv = ["bash", str(COMPILE_SCRIPT), "--prefix", str(prefix), "--work", str(work)]
    if target.source.kind == "sdist":
        argv += ["--sdist", str(fetch_source(target, pins)), "--sdist-sha256", str(pins["source.sha256"].value)]
    else:
        argv += ["--git-url", target.source.url]
        commit = pins["source.commit"].value
        argv += ["--git-commit", commit] if commit else ["--git-branch", str(target.source.branch)]
    for name, path in patch_paths(target, patch_files).items():
        sha = pins[f"patch.{name}"].value
        argv += ["--patch", f"{path}={sha}"] if sha else ["--patch-floating", str(path)]
    for e in sorted({e for p in target.patches for e in p.exclude}):
        argv += ["--patch-exclude", e]
    if target.cuda_archs:
        argv += ["--cuda-archs", ";".join(target.cuda_archs)]
    for f in target.cmake_flags:
        argv += ["--cmake-flag", f]
    argv += ["--source-date-epoch", str(source_date_epoch(target, pins))]
    if jobs:
        argv += ["--jobs", str(jobs)]
    return argv


def host_compile(target: Target, pins: Mapping[str, Pin], *, patch_files: Mapping[str, Path] | None = None,
                 jobs: int | None = None, force: bool = False) -> tuple[Path, Packed]:
    """Compile on this host into the cache, keyed by the artifact name; reuse it when present."""
    spec = expected_spec(target, pins, artifacts.os_identity())
    slot = cache_dir() / "binaries" / spec.name().removesuffix(".tar.gz")
    with _one_compile_at_a_time(slot.with_name(slot.name + ".lock")):
        return _host_compile(target, pins, spec, slot, patch_files=patch_files, jobs=jobs, force=force)


@contextlib.contextmanager
def _one_compile_at_a_time(lock_file: Path):
    """Two compiles of one slot at once (two clones, a test run beside a bench) would delete each other's
    half-built prefix: the second waits, then finds the first's result cached. The kernel drops the
    lock when its holder dies."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"compile: waiting for another compile of {lock_file.stem} to finish", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _host_compile(target: Target, pins: Mapping[str, Pin], spec: ArtifactSpec, slot: Path, *,
                  patch_files: Mapping[str, Path] | None, jobs: int | None, force: bool) -> tuple[Path, Packed]:
    prefix = slot / "prefix"
    packed_dir = slot / "packed"
    tarball = packed_dir / spec.name()
    if not force and (prefix / "bin" / "llama-server").is_file():
        print(f"compile: cached {slot}", file=sys.stderr)
        if tarball.is_file() and _packed_from(tarball).manifest.is_file():
            return prefix, _packed_from(tarball)
        return prefix, artifacts.pack(prefix, spec, packed_dir)   # cached binaries, packed anew
    if slot.exists():
        shutil.rmtree(slot)
    slot.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="kiln-compile-") as work:
        argv = compile_args(target, pins, slot / "prefix.tmp", Path(work), patch_files=patch_files or {},
                            jobs=jobs)
        r = subprocess.run(argv, check=False)
        if r.returncode != 0:
            raise BinariesError(f"compile failed (exit {r.returncode}); see the output above")
    (slot / "prefix.tmp").replace(prefix)
    packed = artifacts.pack(prefix, spec, packed_dir)
    return prefix, packed


def _packed_from(tarball: Path) -> Packed:
    manifest = tarball.with_name(artifacts.manifest_name(tarball.name))
    shafile = tarball.with_name(artifacts.sha256_name(tarball.name))
    return Packed(tarball=tarball, manifest=manifest, sha256_file=shafile, sha256=sha256_file(tarball))


def fetch_verified(store: Store, spec: ArtifactSpec, dest: Path, *, smoke: bool,
                   expected_sha256: str | None = None) -> tuple[Path, Path, str]:
    """Download -> sha256 -> manifest vs target -> (extract -> --version smoke). Returns tarball, shafile, sha."""
    dest.mkdir(parents=True, exist_ok=True)
    tarball, manifest = store.fetch(spec.name(), dest)
    man = artifacts.verify(tarball, manifest, spec, expected_sha256=expected_sha256)
    if smoke:
        with tempfile.TemporaryDirectory(prefix="kiln-smoke-") as tmp:
            artifacts.extract_and_smoke(tarball, man, Path(tmp) / "engine")
    sha = sha256_file(tarball)
    shafile = dest / artifacts.sha256_name(spec.name())
    shafile.write_text(f"{sha}  {tarball.name}\n", encoding="utf-8")
    return tarball, shafile, sha


EXPORT_STAGE = "engine-prefix"   # images/templates/llamacpp.Dockerfile.j2: the compiled prefix alone


def compile_in_build(target: Target, pins: Mapping[str, Pin], *, patch_files: Mapping[str, Path] | None = None,
                     allow_floating: bool = False, network: str = "host", no_cache: bool = False,
                     out: Path | None = None) -> Packed:
    """Compile in the Dockerfile's engine-compile stage, on the target's pinned build base, and pack
    the exported prefix under the spec an image build of the target expects (base = that pin).

    A host compile is keyed by the host's OS and fits builds with --base-image; this one is what a
    plain `build.py build --target T --binaries auto` fetches, and it needs no CUDA toolkit on the host.
    no_cache compiles again whatever the builder's cache holds; out packs somewhere other than the cache
    (both for a rebuild to compare against the first)."""
    from ..build import docker as docker_build, render

    base = pins["base.build"].value
    if not base:
        raise BinariesError(f"{target.name}: base.build is unresolved; run `python build.py lock --target "
                            f"{target.name}` first (the tarball is keyed by the pinned base)")
    spec = expected_spec(target, pins, str(base))
    ctx = render.make_context(target, dict(pins), allow_floating=allow_floating)
    docker_build.ping()
    with tempfile.TemporaryDirectory(prefix="kiln-in-build-") as tmp:
        context, prefix = Path(tmp) / "context", Path(tmp) / "prefix"
        render.write_context(ctx, context, patch_files=dict(patch_files or {}))
        docker_build.build(docker_build.BuildRequest(
            context=context, tags=[], target_stage=EXPORT_STAGE, output_dir=prefix, network=network,
            build_args={"SOURCE_DATE_EPOCH": str(ctx.source_date_epoch)}, no_cache=no_cache))
        out = out or cache_dir() / "binaries" / spec.name().removesuffix(".tar.gz") / "packed"
        return artifacts.pack(prefix, spec, out)
