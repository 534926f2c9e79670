"""What a build was made from, each input with its digest: read from what Kiln pinned and the build
context it wrote, never guessed. The SBOM (sbom.py) and the provenance (provenance.py) both take one.

    lock        images/lock.toml                         sha256 of the file the build read
    target      images/targets/<target>.toml             sha256
    dockerfile  the rendered Dockerfile the build ran    sha256 (a --base-image build renders another)
    source      the engine's sdist, wheel or git commit  the lock's source.sha256 / source.commit
    patches     each [[patches]] entry                   the lock's patch.<name>; a floating one: the
                                                         sha256 of the file given, marked floating
    bases       build and runtime base                   the lock's base.* digests; a --base-image
                                                         override: its local image ID, marked so
    closures    the hash-locked requirements files the   sha256 of each file, and every wheel in it:
                image installs, in install order         name, version, the sha256s pip accepts
    binaries    a fetched engine tarball                 its sha256, as verified before the build
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..digest import sha256_file
from ..pins import closure as closure_file
from ..pins import lock as lockfile
from ..paths import REPO_ROOT
from ..pins.lock import Pin
from ..target import Target

# The requirements files a build context carries (images/build/render.py write_context), in the order
# the templates install them: the supervisor's venv (with the router's pins), then the engine's closure.
CONTEXT_REQUIREMENTS = (
    ("requirements.txt", "supervisor/requirements.txt"),
    ("router-requirements.txt", "supervisor/router-requirements.txt"),
    ("engine-requirements.txt", "images/closures/{closure}"),
)


@dataclass(frozen=True)
class Input:
    """One file or artifact the build read. `sha256` is 64 hex, or "" when no digest is pinned (then
    `note` says why)."""
    name: str
    sha256: str = ""
    uri: str = ""
    note: str = ""


@dataclass(frozen=True)
class Base:
    role: str                # "build" | "runtime"
    ref: str                 # the tag the target names, or the --base-image override
    digest: str              # "sha256:<hex>": the lock's pin, or the override's local image ID; "" unresolved
    override: bool = False   # True: a --base-image the user gave, identified by its local image ID
    note: str = ""


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    sha256s: tuple[str, ...]       # every sha256 pip --require-hashes accepts for it (one per fitting wheel)
    files: tuple[str, ...]         # the requirements files (repo paths) that pin it


@dataclass(frozen=True)
class Source:
    kind: str                      # sdist | pypi-wheel | git
    package: str                   # PyPI project, or the repository URL for git
    version: str                   # the version, or the git commit ("" when floating)
    filename: str = ""
    url: str = ""
    sha256: str = ""               # sdist / wheel: the lock's source.sha256
    commit: str = ""               # git: the lock's source.commit
    note: str = ""


@dataclass(frozen=True)
class BuildInputs:
    target: str
    engine: str
    kiln_version: str
    lock: Input
    target_file: Input
    dockerfile: Input
    source: Source
    patches: tuple[Input, ...]
    bases: tuple[Base, ...]
    closures: tuple[Input, ...]
    wheels: tuple[Wheel, ...]
    binaries: Input | None = None          # the fetched tarball, when the engine was fetched
    floating: tuple[str, ...] = ()         # unresolved pins the build went ahead without
    kiln_commit: str = ""                  # this checkout's git HEAD, where there is one
    kiln_dirty: bool = False               # ...with tracked files changed since


def repo_path(path: Path) -> str:
    """A path as the repository names it (images/lock.toml), or as given when outside the checkout."""
    try:
        return Path(path).resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def source_of(target: Target, pins: Mapping[str, Pin]) -> Source:
    src = target.source
    if src.kind == "git":
        commit = pins["source.commit"].value or ""
        return Source(kind="git", package=src.url, version=commit, url=src.url, commit=commit,
                      note="" if commit else f"floating: branch {src.branch}, commit unresolved "
                      f"({pins['source.commit'].unresolved})")
    sha = pins["source.sha256"].value or ""
    return Source(kind=src.kind, package=str(src.package), version=str(src.version), filename=src.filename or "",
                  url=src.url, sha256=sha, note="" if sha else f"floating: {pins['source.sha256'].unresolved}")


def patches_of(target: Target, pins: Mapping[str, Pin], patch_files: Mapping[str, Path]) -> tuple[Input, ...]:
    out = []
    for p in target.patches:
        pin = pins[f"patch.{p.name}"]
        if pin.resolved:
            out.append(Input(name=p.name, sha256=str(pin.value), uri=p.url or ""))
        else:
            given = patch_files.get(p.name)
            out.append(Input(name=p.name, sha256=sha256_file(given) if given else "", uri=p.url or "",
                             note=f"floating: the lock pins no sha256 ({pin.unresolved})"
                             + ("; this is the sha256 of the file given" if given else "")))
    return tuple(out)


def bases_of(target: Target, pins: Mapping[str, Pin], *, base_image: str | None, base_image_id: str = "") -> tuple[Base, ...]:
    out = []
    for role, ref in (("build", target.bases.build), ("runtime", target.bases.runtime)):
        if base_image:
            out.append(Base(role, base_image, base_image_id, override=True,
                            note=f"--base-image {base_image} replaced {ref}; its digest is the local image ID "
                            "(the sha256 of its config), not a registry manifest digest"))
        else:
            pin = pins[f"base.{role}"]
            out.append(Base(role, ref, str(pin.value or ""), note="" if pin.resolved else f"floating: {pin.unresolved}"))
    return tuple(out)


def closures_of(context: Path, closure_name: str) -> tuple[tuple[Input, ...], tuple[Wheel, ...]]:
    """The requirements files in the build context (what the image installed), and every wheel they pin.
    A package pinned by two files at one version keeps the sha256s both accept (pip installs it once,
    from the first file, with a hash the first accepts); at two versions, the later file's (pip
    replaces it)."""
    files: list[Input] = []
    merged: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {}
    for in_context, origin in CONTEXT_REQUIREMENTS:
        path = context / "kiln" / in_context
        if not path.is_file():
            continue
        name = origin.format(closure=closure_name)
        text = path.read_text(encoding="utf-8")
        files.append(Input(name=name, sha256=closure_file.digest(text)))
        for pkg, (version, hashes) in closure_file.pinned(text).items():
            if pkg in merged and merged[pkg][0] == version:
                _, before, where = merged[pkg]
                both = tuple(h for h in before if h in hashes) or before
                merged[pkg] = (version, both, where + (name,))
            else:
                merged[pkg] = (version, tuple(hashes), (name,))
    wheels = tuple(Wheel(pkg, v, tuple(sorted(h)), where) for pkg, (v, h, where) in sorted(merged.items()))
    return tuple(files), wheels


def kiln_checkout(root: Path = REPO_ROOT) -> tuple[str, bool]:
    """(HEAD commit, whether tracked files differ from it) of the Kiln checkout that builds; ("", False)
    where Kiln is not a git checkout (an installed copy) or git is absent."""
    if not (root / ".git").exists():
        return "", False
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30, check=False)
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "", False
    commit = head.stdout.strip()
    if head.returncode != 0 or len(commit) != 40:
        return "", False
    return commit, status.returncode != 0 or bool(status.stdout.strip())


def binaries_of(engine_from: str, binaries_ref: str, store: str = "") -> Input | None:
    """The fetched tarball: build.py's KILN_BINARIES build argument is `<name>@sha256:<hex>`."""
    if engine_from != "fetch" or "@sha256:" not in binaries_ref:
        return None
    name, _, sha = binaries_ref.rpartition("@sha256:")
    return Input(name=name, sha256=sha, uri=store, note="fetched, sha256 and manifest verified against the target")


def collect(target: Target, pins: Mapping[str, Pin], context: Path, *, kiln_version: str, closure_name: str = "",
            patch_files: Mapping[str, Path] | None = None, base_image: str | None = None, base_image_id: str = "",
            engine_from: str = "compile", binaries_ref: str = "", binaries_store: str = "",
            floating: tuple[str, ...] = (), kiln_commit: str = "", kiln_dirty: bool = False) -> BuildInputs:
    """Everything one build of `target` read, from its pins and the context directory it built."""
    lock_path = lockfile.LOCK_PATH                     # read at call time: tests point it at a copy
    closures, wheels = closures_of(context, closure_name)
    return BuildInputs(
        target=target.name, engine=target.engine, kiln_version=kiln_version,
        lock=Input(name=repo_path(lock_path), sha256=sha256_file(lock_path)),
        target_file=Input(name=repo_path(target.path), sha256=sha256_file(target.path)),
        dockerfile=Input(name="Dockerfile", sha256=sha256_file(context / "Dockerfile"),
                         note=f"rendered from images/templates/{target.engine}.Dockerfile.j2"),
        source=source_of(target, pins),
        patches=patches_of(target, pins, patch_files or {}),
        bases=bases_of(target, pins, base_image=base_image, base_image_id=base_image_id),
        closures=closures, wheels=wheels,
        binaries=binaries_of(engine_from, binaries_ref, binaries_store),
        floating=floating, kiln_commit=kiln_commit, kiln_dirty=kiln_dirty)
