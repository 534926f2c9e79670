"""Which versions of an engine the index has, and the one file of a version a target would pin.

`upgrade` asks this first: the newest final release with a file the target can use (a wheel that fits
the vLLM image, an sdist for llama.cpp), or the version the user named, refused with what the index
has when it has no such file. PEP 691 JSON only: one request per project, no download.
"""

from __future__ import annotations

from dataclasses import dataclass

import requests
from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from supervisor.errors import KilnError

from ..pins.cuda import index_files
from ..pins.pyclosure import wheel_fits
from ..target import Target


class NoSuchRelease(KilnError):
    """The index has no usable file of the version asked for (the message says what it has)."""


@dataclass(frozen=True)
class Release:
    version: str
    filename: str
    url: str
    sha256: str


def _version_of(filename: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        return parse_sdist_filename(filename)[1]
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None


def _usable(target: Target, filename: str) -> bool:
    if target.source.kind == "pypi-wheel":
        return filename.endswith(".whl") and wheel_fits(filename)
    return filename.endswith((".tar.gz", ".zip"))


def usable_files(target: Target, *, index: str, session: requests.Session | None = None) -> dict[Version, list[dict]]:
    """version -> the files of it this target could pin (yanked ones and pre-releases left out)."""
    package = target.source.package
    assert package, "only PyPI-sourced targets have releases"
    out: dict[Version, list[dict]] = {}
    for f in index_files(package, index=index, session=session or requests.Session()):
        name = f.get("filename", "")
        v = _version_of(name)
        if v is None or f.get("yanked") or v.is_prerelease or v.is_devrelease or not _usable(target, name):
            continue
        out.setdefault(v, []).append(f)
    return out


def release(target: Target, version: str | None, *, index: str, session: requests.Session | None = None) -> Release:
    """The release to move to: `version`, or the newest the index has; its one file, chosen like the
    pinned one (the same name with the version replaced where the index has it)."""
    files = usable_files(target, index=index, session=session)
    package = target.source.package
    if not files:
        raise NoSuchRelease(f"{index} has no file of {package} that {target.name} could pin")
    if version is None:
        chosen = max(files)
    else:
        try:
            chosen = Version(version)
        except InvalidVersion:
            raise NoSuchRelease(f"--to {version}: not a version (e.g. 0.33.0)") from None
        if chosen not in files:
            newest = ", ".join(str(v) for v in sorted(files)[-5:])
            raise NoSuchRelease(f"--to {version}: {index} has no file of {package} {version} that {target.name} "
                                f"could pin (newest it has: {newest})")
    candidates = sorted(files[chosen], key=lambda f: f["filename"])
    old = target.source
    like_pinned = (old.filename or "").replace(str(old.version), str(chosen), 1)
    f = next((c for c in candidates if c["filename"] == like_pinned), candidates[0])
    sha = f.get("hashes", {}).get("sha256")
    if not sha:
        raise NoSuchRelease(f"{index} lists {f['filename']} without a sha256")
    return Release(str(chosen), f["filename"], f["url"], sha)
