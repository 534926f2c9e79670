"""Can the index reach every package a pinned engine wheel needs? Which one is missing?

A vLLM image installs `vllm==V` and whatever pip resolves under it; where the index lacks one
exact pin deep in the tree (the index this machine reaches has no `nvidia-nccl-cu13==2.29.7`,
which torch 2.13.0 requires), the build fails minutes in with pip's resolver error. The lock asks
first and records the answer: the pin `engine.closure` is `complete`, or unresolved with the
missing requirement, who asked for it and what the index has instead. Never a guess.

This is a walk, not a resolver: each requirement takes the newest version on the index that
satisfies it and has a wheel for the image's Python (cp312, manylinux x86_64), its Requires-Dist
is read through PEP 658 and followed. No backtracking: a conflict pip could solve by choosing an
older version is not reported as missing, and one it could not is.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import requests
from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from .cuda import SIMPLE_JSON, CudaUnknown, file_metadata, requires_dist

PYTHON = "3.12"


@dataclass
class Closure:
    found: dict[str, str] = field(default_factory=dict)       # name -> version walked
    missing: list[str] = field(default_factory=list)           # one line each


def _environment() -> dict[str, str]:
    env = dict(default_environment())
    env.update(python_version=PYTHON, python_full_version=f"{PYTHON}.3", platform_machine="x86_64",
               sys_platform="linux", platform_system="Linux", os_name="posix",
               implementation_name="cpython", platform_python_implementation="CPython")
    return env


def wheel_fits(filename: str) -> bool:
    """A wheel pip would install for CPython 3.12 on manylinux x86-64."""
    try:
        tags = parse_wheel_filename(filename)[3]
    except Exception:  # noqa: BLE001 - an odd name is simply not a candidate
        return False
    for t in tags:
        if not (t.platform == "any" or (t.platform.startswith(("manylinux", "linux")) and t.platform.endswith("_x86_64"))):
            continue
        if t.interpreter == "cp312" and t.abi in ("cp312", "abi3", "none"):
            return True
        minor = t.interpreter[3:]
        if t.interpreter[:3] in ("cp3", "py3") and not (minor == "" or minor.isdigit() and int(minor) <= 12):
            continue
        if t.abi == "abi3" and t.interpreter.startswith("cp3"):
            return True
        if t.abi == "none" and t.interpreter.startswith("py3"):
            return True
    return False


def _versions(files: list[dict]) -> dict[Version, dict]:
    """version -> one fitting wheel, over the index's files (yanked ones skipped)."""
    out: dict[Version, dict] = {}
    for f in files:
        name = f.get("filename", "")
        if f.get("yanked") or not name.endswith(".whl") or not wheel_fits(name):
            continue
        out.setdefault(parse_wheel_filename(name)[1], f)
    return out


def walk(root: str, *, index: str, session: requests.Session | None = None, limit: int = 600) -> Closure:
    """Walk root's requirement tree on the index; see the module docstring for what it promises."""
    s = session or requests.Session()
    env = _environment()
    closure = Closure()
    queue: deque[tuple[Requirement, str]] = deque([(Requirement(root), "the target")])
    seen: set[str] = set()
    while queue and len(seen) < limit:
        req, parent = queue.popleft()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        r = s.get(f"{index}/{name}/", headers={"Accept": SIMPLE_JSON}, timeout=60)
        if r.status_code == 404:
            closure.missing.append(f"{req} (required by {parent}) is not on {index} at all")
            continue
        r.raise_for_status()
        versions = _versions(r.json().get("files", []))
        # filter() is pip's rule: final releases only, unless the specifier names a pre-release
        # or nothing else matches.
        fitting = sorted(req.specifier.filter(versions))
        if not fitting:
            have = ", ".join(str(v) for v in sorted(versions)[-3:]) or "no wheel for CPython 3.12 on x86-64"
            closure.missing.append(f"{req} (required by {parent}) is not on {index} (it has {have})")
            continue
        version = fitting[-1]
        closure.found[name] = str(version)
        try:
            meta = file_metadata(versions[version], session=s)
        except CudaUnknown as e:
            closure.missing.append(f"{name}=={version}: its needs are unknown ({e})")
            continue
        who = f"{name}=={version}"
        for line in requires_dist(meta):
            try:
                dep = Requirement(line)
            except InvalidRequirement:
                continue
            extras = set(req.extras) | {""}
            if dep.marker is None or any(dep.marker.evaluate({**env, "extra": e}) for e in extras):
                queue.append((dep, who))
    if queue:
        closure.missing.append(f"stopped after {limit} packages: the tree is larger than this walk allows")
    return closure
