"""Binaries artifact: compiled llama-server published as a tarball whose *name* says what it is.

Compiling llama.cpp on a pod took 8m34s; extracting a published tarball takes seconds. The catch is
that a tarball built for another GPU arch, CUDA version or base image must never be picked up
silently. So the tarball's name pins every part of its identity (``ArtifactSpec.name()``), its
manifest records the full identity plus a sha256 of every file, and a fetch is trusted only after:

    sha256 of the tarball == manifest (== the lock's pin, when there is one)   -> else ArtifactCorrupt
    manifest spec == the spec the target expects, field by field               -> else ArtifactMismatch
    tarball name == expected name                                              -> else ArtifactMismatch
    safe extraction, each file's sha256 == manifest                            -> else ArtifactUnsafe / ArtifactCorrupt
    ``llama-server --version`` prints a ``version:`` line                       -> else SmokeTestFailed

A wrong binary is never executed: the smoke test runs only after every check above has passed, and
a failed smoke test leaves nothing behind at ``dest``.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import posixpath
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import zlib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, BinaryIO, Mapping, Sequence

import supervisor
from supervisor.errors import FetchError

from ..digest import sha256_file

MANIFEST_SCHEMA = 1
SMOKE_ARGV = ("--version",)
VERSION_FILE = "share/kiln/llama-server.version.txt"
BUILD_INFO_FILE = "share/kiln/build-info.env"
BINARY = "bin/llama-server"

# The binary each engine's tarball carries; the name starts with it. Only llama.cpp is built today.
_ENGINE_BINARY = {"llama.cpp": "llama-server"}
_HEX64 = re.compile(r"[0-9a-f]{64}")
_SOURCE_SDIST = re.compile(r"sdist:sha256:([0-9a-f]{64})")
_SOURCE_GIT = re.compile(r"git:(\S+)@([0-9a-f]{40})")
_SOURCE_GIT_FLOATING = re.compile(r"git:(\S+)#(\S+)")
_SHA256_REF = re.compile(r"sha256:([0-9a-f]{64})")
_CUDA = re.compile(r"\d+\.\d+")
_CUDA_ARCHS = re.compile(r"\d+(-\d+)*")
_OS_BASE = re.compile(r"os:([a-z0-9][a-z0-9._-]*)")
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.tar\.gz")
_CHUNK = 1024 * 1024


# ----------------------------------------------------------------------------- errors


class ArtifactError(FetchError):
    """A binaries artifact could not be fetched, verified or trusted."""


class ArtifactCorrupt(ArtifactError):
    """The bytes are not the bytes that were published (truncated download, bit rot, republished)."""


class ArtifactUnsafe(ArtifactError):
    """The tarball holds an entry that could write outside its destination (or a device file)."""


class SmokeTestFailed(ArtifactError):
    """The extracted llama-server did not start: ``--version`` failed or printed no version."""


# Why a field matters, said next to the difference so the reader knows what went wrong.
_FIELD_HINTS = {
    "engine": "this tarball holds another engine",
    "source": "this tarball was built from another engine source",
    "patch_set": "this tarball was built with other patches",
    "cuda": "this tarball was built against another CUDA version",
    "archs": "this tarball was built for another GPU arch",
    "build_config": "this tarball was built with other cmake flags or another compile script",
    "base": "this tarball was compiled in another base image or OS",
    "tarball name": "the file was renamed or is not the one the target names",
}


class ArtifactMismatch(ArtifactError):
    """The artifact is intact but is not the one expected; ``differences`` lists every field."""

    def __init__(self, what: str, differences: Sequence[tuple[str, str, str]]) -> None:
        self.differences = list(differences)
        lines = [f"{what} does not match the target: refusing it"]
        for field_name, expected, found in self.differences:
            hint = _FIELD_HINTS.get(field_name)
            lines.append(f"  - {field_name}: expected {expected}, found {found}" + (f" — {hint}" if hint else ""))
        super().__init__("\n".join(lines))


# ----------------------------------------------------------------------------- identity


@dataclass(frozen=True)
class ArtifactSpec:
    """What the binaries ARE. Every field must match at fetch time; the name pins each one."""

    engine: str         # "llama.cpp"
    source: str         # "sdist:sha256:<64hex>" | "git:<url>@<40hex>" | "git:<url>#<branch>" (floating)
    patch_set: str      # "none" | "sha256:<64hex>" (patch_set_hash)
    cuda: str           # "12.8" | "none"
    archs: str          # "86" / "86-90" for CUDA | "cpu"
    build_config: str   # "sha256:<64hex>" (build_config_hash)
    base: str           # "sha256:<64hex>" image digest | "os:<ID>-<VERSION_ID>" for a host compile

    def __post_init__(self) -> None:
        problems = _spec_problems(self)
        if problems:
            raise ValueError("invalid ArtifactSpec: " + "; ".join(problems))

    def name(self) -> str:
        """``llama-server_src-…_p-…_cuda-…_arch-…_cfg-…_base-….tar.gz``; only [A-Za-z0-9._-]."""
        parts = [
            _ENGINE_BINARY[self.engine],
            f"src-{_short_source(self.source)}",
            f"p-{_short_ref(self.patch_set)}",
            f"cuda-{self.cuda}",
            f"arch-{self.archs}",
            f"cfg-{_short_ref(self.build_config)}",
            f"base-{_short_ref(self.base).replace(':', '-')}",
        ]
        return "_".join(parts) + ".tar.gz"

    @property
    def floating(self) -> bool:
        """A branch build: the name cannot pin the commit, so the same name may hold other code."""
        return _SOURCE_GIT_FLOATING.fullmatch(self.source) is not None and not _SOURCE_GIT.fullmatch(self.source)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


SPEC_FIELDS = tuple(f.name for f in fields(ArtifactSpec))


def _spec_problems(spec: ArtifactSpec) -> list[str]:
    problems = []
    for name in SPEC_FIELDS:
        if not isinstance(getattr(spec, name), str):
            problems.append(f"{name} must be a string, got {type(getattr(spec, name)).__name__}")
    if problems:
        return problems
    if spec.engine not in _ENGINE_BINARY:
        problems.append(f"engine {spec.engine!r} is not one of {sorted(_ENGINE_BINARY)}")
    if not (_SOURCE_SDIST.fullmatch(spec.source) or _SOURCE_GIT.fullmatch(spec.source)
            or _SOURCE_GIT_FLOATING.fullmatch(spec.source)):
        problems.append(f"source {spec.source!r} is not sdist:sha256:<64hex>, git:<url>@<40hex> or git:<url>#<branch>")
    if spec.patch_set != "none" and not _SHA256_REF.fullmatch(spec.patch_set):
        problems.append(f"patch_set {spec.patch_set!r} is not 'none' or sha256:<64hex>")
    if spec.cuda != "none" and not _CUDA.fullmatch(spec.cuda):
        problems.append(f"cuda {spec.cuda!r} is not 'none' or a version like 12.8")
    if spec.archs != "cpu" and not _CUDA_ARCHS.fullmatch(spec.archs):
        problems.append(f"archs {spec.archs!r} is not 'cpu' or like 86 / 86-90")
    # A CPU build has no archs and a CUDA build has no "cpu": a mixed spec names nothing real.
    if (spec.cuda == "none") != (spec.archs == "cpu"):
        problems.append(f"cuda {spec.cuda!r} and archs {spec.archs!r} disagree (cuda 'none' goes with archs 'cpu')")
    if not _SHA256_REF.fullmatch(spec.build_config):
        problems.append(f"build_config {spec.build_config!r} is not sha256:<64hex>")
    if not (_SHA256_REF.fullmatch(spec.base) or _OS_BASE.fullmatch(spec.base)):
        problems.append(f"base {spec.base!r} is not sha256:<64hex> or os:<id>-<version>")
    return problems


def _short_ref(value: str) -> str:
    """"sha256:<hex>" -> 12 hex; anything else (none, os:debian-12) unchanged."""
    m = _SHA256_REF.fullmatch(value)
    return m.group(1)[:12] if m else value


def _short_source(source: str) -> str:
    if m := _SOURCE_SDIST.fullmatch(source):
        return m.group(1)[:12]
    if m := _SOURCE_GIT.fullmatch(source):
        return m.group(2)[:12]
    # Floating: no commit to pin; hash url#branch so at least two branches never share a name.
    return "floating-" + hashlib.sha256(source.encode()).hexdigest()[:12]


def spec_from_dict(d: Mapping[str, Any]) -> ArtifactSpec:
    """An ArtifactSpec from a manifest or lock entry; every problem is named at once."""
    missing = [k for k in SPEC_FIELDS if k not in d]
    unknown = sorted(k for k in d if k not in SPEC_FIELDS)
    if missing or unknown:
        raise ArtifactError(f"artifact spec: missing fields {missing}, unknown fields {unknown}")
    try:
        return ArtifactSpec(**{k: d[k] for k in SPEC_FIELDS})
    except ValueError as err:
        raise ArtifactError(str(err)) from None


def patch_set_hash(patches: Mapping[str, str]) -> str:
    """sha256 over "name:sha256\\n" lines sorted by name; "none" when there are no patches."""
    if not patches:
        return "none"
    for name, sha in patches.items():
        # "floating": a patch with no pinned sha256 (--allow-floating builds). The hash then says
        # which patches, not which bytes, like a git:<url>#<branch> source.
        if sha != "floating" and not _HEX64.fullmatch(sha):
            raise ValueError(f"patch {name!r}: sha256 must be 64 lowercase hex or 'floating', got {sha!r}")
        if ":" in name or "\n" in name:
            raise ValueError(f"patch name {name!r} may not hold ':' or a newline")
    text = "".join(f"{name}:{patches[name]}\n" for name in sorted(patches))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def build_config_hash(cmake_flags: Sequence[str], script_sha256: str, source_date_epoch: int | None = None) -> str:
    """sha256 over the cmake flags (sorted, so order does not matter), the compile script's sha256 and,
    when given, the SOURCE_DATE_EPOCH the compile and the tarball's mtimes use."""
    if isinstance(cmake_flags, str):  # a lone string would hash its characters
        raise TypeError("cmake_flags must be a sequence of flags, not a string")
    if not _HEX64.fullmatch(script_sha256):
        raise ValueError(f"script_sha256 must be 64 lowercase hex, got {script_sha256!r}")
    for flag in cmake_flags:
        if "\n" in flag:
            raise ValueError(f"cmake flag {flag!r} holds a newline")
    text = "".join(f"flag:{flag}\n" for flag in sorted(cmake_flags)) + f"script:{script_sha256}\n"
    if source_date_epoch is not None:
        if isinstance(source_date_epoch, bool) or not isinstance(source_date_epoch, int) or source_date_epoch < 0:
            raise ValueError(f"source_date_epoch must be whole seconds since 1970 (an int >= 0), got {source_date_epoch!r}")
        text += f"epoch:{source_date_epoch}\n"
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def os_identity(sysroot: str | Path = "/") -> str:
    """"os:debian-12" from <sysroot>/etc/os-release (falling back to /usr/lib/os-release, as systemd does)."""
    root = Path(sysroot)
    for rel in ("etc/os-release", "usr/lib/os-release"):
        path = root / rel
        if path.is_file():
            info = _parse_os_release(path.read_text(encoding="utf-8", errors="replace"))
            break
    else:
        raise ArtifactError(f"no etc/os-release or usr/lib/os-release under {root}: cannot name the host OS")
    os_id = info.get("ID", "linux")
    # Rolling distributions (Arch, Debian sid) have no VERSION_ID; the codename is the next best pin.
    version = info.get("VERSION_ID") or info.get("VERSION_CODENAME") or "unversioned"
    ident = re.sub(r"[^a-z0-9._-]+", "-", f"{os_id}-{version}".lower()).strip("-")
    return f"os:{ident}"


def _parse_os_release(text: str) -> dict[str, str]:
    info = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        info[key.strip()] = value
    return info


def manifest_name(tarball_name: str) -> str:
    """<stem>.manifest.json beside <stem>.tar.gz."""
    return tarball_name.removesuffix(".tar.gz") + ".manifest.json"


def provenance_name(tarball_name: str) -> str:
    """<stem>.provenance.json beside <stem>.tar.gz: publish-binaries' in-toto statement (SLSA provenance)."""
    return tarball_name.removesuffix(".tar.gz") + ".provenance.json"


def sha256_name(tarball_name: str) -> str:
    """<stem>.sha256 beside <stem>.tar.gz; it names the tarball, so `sha256sum --check` works next to it."""
    return tarball_name.removesuffix(".tar.gz") + ".sha256"


def check_tarball_name(name: str) -> str:
    """A tarball name is one plain path segment: stores use it as a file name and a Hub path."""
    if not _SAFE_NAME.fullmatch(name) or ".." in name:
        raise ArtifactError(f"{name!r} is not a binaries tarball name (only [A-Za-z0-9._-], ending .tar.gz)")
    return name


# ----------------------------------------------------------------------------- pack


@dataclass(frozen=True)
class Packed:
    tarball: Path
    manifest: Path
    sha256_file: Path
    sha256: str


def pack(prefix: Path, spec: ArtifactSpec, out_dir: Path) -> Packed:
    """Tar a compiled prefix deterministically and write its manifest and sha256 file.

    Same binaries, same sha256: entries sorted, every mtime the SOURCE_DATE_EPOCH the compile
    recorded (share/kiln/build-info.env; 0 when it recorded none), uid/gid 0, no user names, modes
    reduced to 0755/0644, gzip header without name or mtime. (The gzip bytes also depend on zlib's
    version, so identical sha256s are promised for one build machine, not across zlib releases.)
    """
    prefix = Path(prefix)
    out_dir = Path(out_dir)
    binary = prefix / BINARY
    if binary.is_symlink() or not binary.is_file() or not os.access(binary, os.X_OK):
        raise ArtifactError(f"{binary} is missing, a link or not executable: {prefix} is not a compiled prefix")
    version = _version_line(prefix / VERSION_FILE)
    mtime = recorded_epoch(prefix)
    entries = _prefix_entries(prefix)
    name = spec.name()
    out_dir.mkdir(parents=True, exist_ok=True)

    files: dict[str, str] = {}
    tmp_tar = _tmp_path(out_dir, name)
    try:
        with tmp_tar.open("wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, path in entries:
                info = tarfile.TarInfo(rel)
                info.mtime = mtime
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                st = path.lstat()
                if stat.S_ISLNK(st.st_mode):
                    info.type = tarfile.SYMTYPE
                    info.linkname = os.readlink(path)
                    info.mode = 0o777
                    tar.addfile(info)
                elif stat.S_ISDIR(st.st_mode):
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
                else:
                    info.type = tarfile.REGTYPE
                    info.mode = 0o755 if st.st_mode & 0o111 else 0o644
                    info.size = st.st_size
                    with path.open("rb") as f:
                        hashing = _HashingReader(f)
                        tar.addfile(info, hashing)
                    files[rel] = hashing.hexdigest()
        digest = sha256_file(tmp_tar)
        tarball = out_dir / name
        os.replace(tmp_tar, tarball)
    finally:
        tmp_tar.unlink(missing_ok=True)

    manifest = {
        "schema": MANIFEST_SCHEMA,
        "spec": spec.to_dict(),
        "tarball": name,
        "tarball_sha256": digest,
        "files": files,
        "llama_server_version": version,
        "created_by": f"kiln {supervisor.__version__}",
    }
    manifest_path = out_dir / manifest_name(name)
    _write_atomic(manifest_path, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    sha_path = out_dir / sha256_name(name)
    _write_atomic(sha_path, f"{digest}  {name}\n".encode())  # `sha256sum --check` format
    return Packed(tarball=tarball, manifest=manifest_path, sha256_file=sha_path, sha256=digest)


class _HashingReader:
    """Hashes what tarfile reads, so each file is read once for both the tar and the manifest."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._h = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        self._h.update(data)
        return data

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def recorded_epoch(prefix: Path) -> int:
    """KILN_SOURCE_DATE_EPOCH from the prefix's build-info.env (the compile script writes it); 0 if absent."""
    path = Path(prefix) / BUILD_INFO_FILE
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return 0
    for line in lines:
        key, _, value = line.partition("=")
        if key == "KILN_SOURCE_DATE_EPOCH":
            if not value.isdigit():
                raise ArtifactError(f"{path}: KILN_SOURCE_DATE_EPOCH={value!r} is not whole seconds since 1970")
            return int(value)
    return 0


def _version_line(path: Path) -> str:
    if not path.is_file():
        raise ArtifactError(f"{path} is missing: the compile step writes it after its --version smoke test")
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    # The first line, unless a CUDA init line came first (compiled on a GPU host): then the version line.
    for line in lines:
        if line.startswith("version:"):
            return line.strip()
    if not lines:
        raise ArtifactError(f"{path} is empty: no llama-server version recorded")
    return lines[0].strip()


def _prefix_entries(prefix: Path) -> list[tuple[str, Path]]:
    """(relpath, path) for everything under prefix, sorted; only files, dirs and in-prefix symlinks."""
    out: list[tuple[str, Path]] = []
    real_prefix = prefix.resolve()
    for dirpath, dirnames, filenames in os.walk(prefix):
        dirnames.sort()
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            rel = path.relative_to(prefix).as_posix()
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(path)
                resolved = (path.parent / target).resolve()
                if os.path.isabs(target) or not resolved.is_relative_to(real_prefix):
                    raise ArtifactError(f"{path} links to {target!r}, outside the prefix: it would not travel")
            elif not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                raise ArtifactError(f"{path} is not a file, directory or symlink: refusing to pack it")
            out.append((rel, path))
    out.sort(key=lambda e: e[0])
    return out


def _tmp_path(directory: Path, name: str) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    return Path(tmp)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = _tmp_path(path.parent, path.name)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- verify


def verify(tarball: Path, manifest: Path, expected: ArtifactSpec, *, expected_sha256: str | None = None) -> dict:
    """Check a downloaded tarball against its manifest and the expected spec; return the manifest.

    Order matters: integrity first (a corrupt download is a retry, not a mismatch), then identity
    (every differing spec field listed at once), then the name.
    """
    tarball = Path(tarball)
    data = _load_manifest(Path(manifest))

    if not tarball.is_file():
        raise ArtifactError(f"tarball {tarball} does not exist")
    actual = sha256_file(tarball)
    if actual != data["tarball_sha256"]:
        raise ArtifactCorrupt(
            f"{tarball.name} is corrupt or incomplete: its sha256 is {actual}, "
            f"its manifest says {data['tarball_sha256']} — download it again"
        )
    if expected_sha256 is not None and actual != expected_sha256:
        raise ArtifactCorrupt(
            f"{tarball.name} has sha256 {actual} but the lock pins {expected_sha256}: "
            "the published artifact changed since it was locked — refusing it"
        )

    found = data["spec"]
    differences = []
    for name in SPEC_FIELDS:
        want = getattr(expected, name)
        got = found.get(name, "(missing)")
        if got != want:
            differences.append((name, want, str(got)))
    differences += [(k, "(no such field)", str(found[k])) for k in sorted(found) if k not in SPEC_FIELDS]
    if differences:
        raise ArtifactMismatch(f"{tarball.name}", differences)

    # The file's name and the manifest's record of it: a renamed file claims an identity it lacks.
    want_name = expected.name()
    for found_name in (tarball.name, data["tarball"]):
        if found_name != want_name:
            raise ArtifactMismatch(tarball.name, [("tarball name", want_name, found_name)])
    return data


def _load_manifest(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(f"manifest {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ArtifactCorrupt(f"manifest {path.name} is unreadable: {err}") from None
    problems = []
    if not isinstance(data, dict):
        raise ArtifactCorrupt(f"manifest {path.name} is not a JSON object")
    if data.get("schema") != MANIFEST_SCHEMA:
        problems.append(f"schema is {data.get('schema')!r}, this Kiln reads {MANIFEST_SCHEMA}")
    if not isinstance(data.get("spec"), dict):
        problems.append("spec is missing or not an object")
    if not isinstance(data.get("tarball"), str):
        problems.append("tarball is missing")
    if not (isinstance(data.get("tarball_sha256"), str) and _HEX64.fullmatch(data["tarball_sha256"])):
        problems.append("tarball_sha256 is missing or not 64 hex")
    files = data.get("files")
    if not (isinstance(files, dict) and all(isinstance(v, str) and _HEX64.fullmatch(v) for v in files.values())):
        problems.append("files is missing or not {relpath: sha256}")
    elif BINARY not in files:
        problems.append(f"files does not list {BINARY}")
    if problems:
        raise ArtifactCorrupt(f"manifest {path.name} is malformed: " + "; ".join(problems))
    return data


# ----------------------------------------------------------------------------- extract and smoke


def extract_and_smoke(
    tarball: Path,
    manifest: dict,
    dest: Path,
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 30,
) -> Path:
    """Extract a verified tarball to ``dest`` and run ``llama-server --version`` before trusting it.

    Extraction goes to a temporary sibling of ``dest`` that is renamed into place only after every
    check has passed, so ``dest`` never holds a half-extracted or failing binary. ``env`` is the
    smoke test's whole environment (as for subprocess; None inherits), e.g. to add CUDA stubs to
    LD_LIBRARY_PATH on a machine without a driver. ``dest`` must not exist, or be an empty directory.
    """
    tarball, dest = Path(tarball), Path(dest)
    if dest.is_symlink() or (dest.exists() and (not dest.is_dir() or any(dest.iterdir()))):
        raise ArtifactError(f"{dest} already exists and is not an empty directory: refusing to extract over it")
    given_empty = dest.is_dir()
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
    try:
        extracted = _safe_extract(tarball, work)
        _check_files(tarball.name, extracted, manifest["files"])
        _smoke(work / BINARY, manifest.get("llama_server_version"), env, timeout_s)
        if dest.exists():
            dest.rmdir()  # empty (checked above); rename needs the name free
        os.replace(work, dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        if given_empty:  # nothing usable at dest: a caller checking for it must not find it
            with contextlib.suppress(OSError):
                dest.rmdir()  # only while still empty: never delete what someone else put there
        raise
    return dest


def _safe_extract(tarball: Path, root: Path) -> dict[str, str]:
    """Extract regular files, dirs and in-root symlinks by hand; return {relpath: sha256} of the files.

    tarfile.extractall trusts the archive; this refuses absolute paths, '..', links that leave the
    root (checked against the real path, so a link to '.' cannot be chained outwards), hard links,
    device files, FIFOs and duplicate entries.
    """
    real_root = root.resolve()
    hashes: dict[str, str] = {}
    seen: set[str] = set()
    try:
        tar = tarfile.open(tarball, mode="r:gz")
    except (tarfile.TarError, OSError, EOFError) as err:
        raise ArtifactCorrupt(f"{tarball.name} is not a readable tar.gz: {err}") from None
    with tar:
        try:
            for member in tar:
                rel = _member_path(tarball.name, member.name)
                if rel in seen:
                    raise ArtifactUnsafe(f"{tarball.name}: entry {rel!r} appears twice: refusing to extract")
                seen.add(rel)
                target = root / rel
                parent_real = target.parent.resolve()
                if not parent_real.is_relative_to(real_root):
                    raise ArtifactUnsafe(f"{tarball.name}: entry {rel!r} would be written outside {root} via a link")
                if target.is_symlink():
                    raise ArtifactUnsafe(f"{tarball.name}: entry {rel!r} would be written through a link")
                if member.isdir():
                    target.mkdir(mode=0o755, exist_ok=True)
                elif member.isreg():
                    hashes[rel] = _write_member(tar, member, target)
                elif member.issym():
                    link = member.linkname
                    resolved = Path(os.path.normpath(parent_real / link))
                    if os.path.isabs(link) or not resolved.is_relative_to(real_root):
                        raise ArtifactUnsafe(f"{tarball.name}: link {rel!r} -> {link!r} points outside the artifact")
                    os.symlink(link, target)
                elif member.islnk():
                    raise ArtifactUnsafe(f"{tarball.name}: hard link {rel!r} -> {member.linkname!r} is not allowed")
                else:
                    raise ArtifactUnsafe(f"{tarball.name}: entry {rel!r} is a device file or FIFO: refusing it")
        except (tarfile.TarError, EOFError, zlib.error) as err:
            raise ArtifactCorrupt(f"{tarball.name} is truncated or corrupt: {err}") from None
        except ArtifactError:
            raise
        except OSError as err:  # disk full, a file where a directory should be, ...
            raise ArtifactError(f"{tarball.name}: could not extract into {root}: {err}") from None
    return hashes


def _member_path(tar_name: str, name: str) -> str:
    if name.startswith("/"):
        raise ArtifactUnsafe(f"{tar_name}: entry {name!r} is an absolute path: refusing to extract")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ArtifactUnsafe(f"{tar_name}: entry {name!r} climbs out with '..': refusing to extract")
    if not parts:
        raise ArtifactUnsafe(f"{tar_name}: entry {name!r} has no usable path")
    return posixpath.join(*parts)


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> str:
    src = tar.extractfile(member)
    assert src is not None  # a regular file always has a body
    h = hashlib.sha256()
    # O_EXCL | O_NOFOLLOW: never follow or overwrite whatever is already at the path.
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out, src:
        while chunk := src.read(_CHUNK):
            h.update(chunk)
            out.write(chunk)
    # Only the permission bits that make sense for binaries: no setuid/setgid/sticky, no world-write.
    os.chmod(target, 0o755 if member.mode & 0o111 else 0o644)
    return h.hexdigest()


def _check_files(tar_name: str, extracted: Mapping[str, str], expected: Mapping[str, str]) -> None:
    problems = []
    for rel in sorted(set(expected) | set(extracted)):
        if rel not in extracted:
            problems.append(f"{rel}: in the manifest, not in the tarball")
        elif rel not in expected:
            problems.append(f"{rel}: in the tarball, not in the manifest")
        elif extracted[rel] != expected[rel]:
            problems.append(f"{rel}: sha256 {extracted[rel]}, manifest says {expected[rel]}")
    if problems:
        raise ArtifactCorrupt(f"{tar_name}: extracted files do not match the manifest:\n"
                              + "\n".join(f"  - {p}" for p in problems))


def _smoke(binary: Path, recorded: str | None, env: Mapping[str, str] | None, timeout_s: float) -> None:
    argv = [str(binary), *SMOKE_ARGV]
    try:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None, timeout=timeout_s, check=False,
        )
    except subprocess.TimeoutExpired:
        raise SmokeTestFailed(f"'llama-server --version' did not finish within {timeout_s:g} s: not trusting it") from None
    except OSError as err:
        raise SmokeTestFailed(f"'llama-server --version' could not start: {err.strerror or err}") from None
    out = proc.stdout.decode("utf-8", errors="replace")
    tail = "\n".join(out.splitlines()[-20:])
    if proc.returncode != 0:
        raise SmokeTestFailed(f"'llama-server --version' exited with {proc.returncode}:\n{tail}")
    versions = [line.strip() for line in out.splitlines() if line.startswith("version:")]
    if not versions:
        raise SmokeTestFailed(f"'llama-server --version' printed no 'version:' line:\n{tail}")
    # The files' sha256s already match; this catches a manifest whose recorded version lies.
    if recorded and recorded.startswith("version:") and versions[0] != recorded:
        raise SmokeTestFailed(f"llama-server reports {versions[0]!r}, the manifest recorded {recorded!r}")
