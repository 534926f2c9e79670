"""supervisor/requirements.txt: the in-image runtime deps of the supervisor, every wheel hashed.

The image installs them with `pip install --require-hashes`, so a compromised or re-uploaded file
fails the build instead of landing in it. Hashes cover the wheels for every Python the image bases
ship (Debian bookworm: 3.11, Ubuntu 24.04: 3.12), downloaded by pip itself from the index it is
configured with (PyPI): generating or checking this file needs that index.

The top-level pins are TOP_LEVEL below. Their dependencies are resolved by pip once and then kept:
a regeneration passes the committed file's versions to pip as constraints, so the file changes only
when TOP_LEVEL (or the Pythons, platforms) change, never because PyPI published something new
overnight. When the kept versions no longer fit TOP_LEVEL, pip resolves them afresh. To move a
dependency on purpose, delete its lines (or the whole file) and run `python build.py generate`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from supervisor.errors import KilnError

from ..digest import sha256_file

TOP_LEVEL = ("psutil==7.2.2", "requests==2.34.2", "watchdog==7.1.0", "huggingface_hub==2.4.0",
             "nvidia-ml-py==13.615.71")
# The router image's extra: smg (the SGLang gateway; why not vllm-router: docs/research/router-choice-2026-12-01.md).
# Its closure is resolved under the supervisor's pins and holds only what they do not: the router
# image installs both files in one pip call, so one package never has two pins. Its version is the
# router target's [source] (images/targets/router.toml): one pin, read here, in the image and its labels.


def router_top_level() -> tuple[str, ...]:
    from ..target import load_target

    src = load_target("router").source
    return (f"{src.package}=={src.version}",)


def router_pin_problem(target_version: str, package: str, text: str) -> str | None:
    """Why an image of the router must not be made: its target's [source] names one version of the
    router's package while the requirements it installs (`text`) pin another (or none): its labels would
    name a version the image does not install. None when they agree."""
    have = pinned(text).get(normalize(package))
    if have == target_version:
        return None
    return (f"the router target pins {package} {target_version} but supervisor/router-requirements.txt (what the "
            f"image installs) pins {package}=={have or '(nothing)'}: run `python build.py generate --only "
            f"router-requirements` (or `python build.py upgrade --target router --to {target_version}`)")


PYTHONS = ("3.11", "3.12")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64",
             "manylinux_2_5_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\]+)", re.MULTILINE)


class PipFailed(KilnError):
    """pip could not download the wheels (no index reachable, or a pin it cannot satisfy): its last words."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_name(filename: str) -> tuple[str, str]:
    """A wheel's (normalized name, version)."""
    stem = filename[:-4] if filename.endswith(".whl") else filename.rsplit(".tar", 1)[0]
    name, version = stem.split("-")[:2]
    return normalize(name), version


def pinned(text: str) -> dict[str, str]:
    """name -> version of every `name==version` line of a requirements file."""
    return {normalize(n): v for n, v in _PIN.findall(text)}


def _download(top_level: tuple[str, ...], constraints: dict[str, str], pythons: tuple[str, ...],
              platforms: tuple[str, ...]) -> dict[tuple[str, str], set[str]]:
    hashes: dict[tuple[str, str], set[str]] = defaultdict(set)
    with tempfile.TemporaryDirectory(prefix="kiln-requirements-") as tmp:
        cfile = Path(tmp) / "constraints.txt"
        cfile.write_text("".join(f"{n}=={v}\n" for n, v in sorted(constraints.items())), encoding="utf-8")
        for py in pythons:
            d = Path(tmp) / py
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", py,
                   "--implementation", "cp", "-d", str(d), "-c", str(cfile)]
            for p in platforms:
                cmd += ["--platform", p]
            r = subprocess.run([*cmd, *top_level], capture_output=True, text=True)
            if r.returncode != 0:
                said = [line for line in r.stderr.splitlines() if line.startswith("ERROR")] or r.stderr.splitlines()
                raise PipFailed(f"pip download (Python {py}) exited {r.returncode}: "
                                f"{said[-1].strip() if said else 'no message'}")
            for f in d.iterdir():
                hashes[dist_name(f.name)].add(sha256_file(f))
    return hashes


def lock(current: str | None, *, top_level: tuple[str, ...] = TOP_LEVEL, pythons: tuple[str, ...] = PYTHONS,
         platforms: tuple[str, ...] = PLATFORMS, base: str | None = None,
         what: str = "the supervisor's runtime deps") -> str:
    """The requirements file: top_level and their dependencies, the versions of `current` (the committed
    file) kept where they still fit. Raises PipFailed when pip cannot download them."""
    tops = {normalize(t.split("==")[0]) for t in top_level}
    fixed = pinned(base or "")          # base: another requirements file these are installed with
    kept = {n: v for n, v in pinned(current or "").items() if n not in tops}
    try:
        hashes = _download(top_level, {**kept, **fixed}, pythons, platforms)
    except PipFailed:
        if not kept:
            raise
        hashes = _download(top_level, fixed, pythons, platforms)     # the kept versions no longer fit
    lines = [f"# Generated by `python build.py generate` (images/pins/requirements.py): {what}",
             f"# inside images, every wheel hashed for Python {' and '.join(pythons)} on x86-64. Do not edit by hand.",
             ""]
    if base is not None:
        lines[-1:-1] = ["# Installed together with supervisor/requirements.txt, whose pins it leaves out."]
    for (name, version), shas in sorted(hashes.items()):
        if name in fixed:
            continue
        ordered = sorted(shas)
        lines.append(f"{name}=={version} \\")
        lines += [f"    --hash=sha256:{s} \\" for s in ordered[:-1]]
        lines.append(f"    --hash=sha256:{ordered[-1]}")
    return "\n".join(lines) + "\n"
