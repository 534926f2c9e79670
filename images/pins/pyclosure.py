"""Can the index reach every package a pinned engine wheel needs? Which one is missing? Which files,
by sha256, would an image install?

A vLLM image installs `vllm==V` and whatever pip resolves under it; where the index lacks one
exact pin deep in the tree (the index this machine reaches has no `nvidia-nccl-cu13==2.29.7`,
which torch 2.13.0 requires), the build fails minutes in with pip's resolver error. The lock asks
first and records the answer: the pin `engine.closure` is the sha256 of the closure file
(images/pins/closure.py writes it: every package, its version and the sha256 of each wheel that
fits), or unresolved with the missing requirement, who asked for it and what the index has
instead. Never a guess.

This is a walk, not a full resolver: each requirement takes the newest version on the index that
satisfies it and has a wheel for the image's Python (cp312, manylinux x86_64 up to the image's
glibc), its Requires-Dist is read through PEP 658 and followed, extras included (a package asked
for again with another extra has that extra's needs followed too). When the walk is done every
requirement met on the way is checked against the versions it chose. Where one fails (the first
asker took numpy 2.5.5, a later one wants numpy<2.4), the walk runs again with every specifier
seen for that package applied at once, until nothing fails or nothing new is learnt (a few rounds;
the index's answers are reused). What still fails is reported (`conflicts`), so a closure that is
not what pip would install is never locked. Checked on vllm 0.33.0: the same 199 packages and
versions as `pip install --dry-run --report` on pypi.org (docs/research/vllm-0.27.1-to-0.33.0-flags.md).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

import requests
from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from .cuda import SIMPLE_JSON, CudaUnknown, file_metadata, requires_dist

PYTHON = "3.12"
PYTHON_FULL = "3.12.3"          # Ubuntu 24.04's python3, what the vLLM images install into
GLIBC = (2, 39)                 # Ubuntu 24.04's glibc: a manylinux_2_40 wheel would not install there
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_x86_64$")
_LEGACY_MANYLINUX = {"manylinux1_x86_64": (2, 5), "manylinux2010_x86_64": (2, 12), "manylinux2014_x86_64": (2, 17)}


@dataclass
class Closure:
    found: dict[str, str] = field(default_factory=dict)        # name -> version walked
    missing: list[str] = field(default_factory=list)            # one line each
    files: dict[str, list[dict]] = field(default_factory=dict)  # name -> the index's fitting wheels of that version
    required_by: dict[str, list[str]] = field(default_factory=dict)   # name -> who asked for it
    conflicts: list[str] = field(default_factory=list)          # a chosen version some requirement rejects

    @property
    def complete(self) -> bool:
        return not self.missing and not self.conflicts

    def problems(self) -> list[str]:
        return self.missing + self.conflicts


def _environment() -> dict[str, str]:
    env = dict(default_environment())
    env.update(python_version=PYTHON, python_full_version=PYTHON_FULL, platform_machine="x86_64",
               sys_platform="linux", platform_system="Linux", os_name="posix",
               implementation_name="cpython", platform_python_implementation="CPython")
    return env


def _platform_fits(platform: str) -> bool:
    if platform == "any":
        return True
    if platform in _LEGACY_MANYLINUX:
        return True
    m = _MANYLINUX.match(platform)
    return bool(m) and (int(m.group(1)), int(m.group(2))) <= GLIBC


def wheel_fits(filename: str) -> bool:
    """A wheel pip would install for CPython 3.12 on the image's manylinux x86-64."""
    try:
        tags = parse_wheel_filename(filename)[3]
    except Exception:  # noqa: BLE001 - an odd name is simply not a candidate
        return False
    for t in tags:
        if not _platform_fits(t.platform):
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


def _versions(files: list[dict]) -> dict[Version, list[dict]]:
    """version -> its fitting wheels, over the index's files (yanked ones skipped)."""
    out: dict[Version, list[dict]] = {}
    for f in files:
        name = f.get("filename", "")
        if f.get("yanked") or not name.endswith(".whl") or not wheel_fits(name):
            continue
        out.setdefault(parse_wheel_filename(name)[1], []).append(f)
    return out


ROUNDS = 24


class _Index:
    """The index's answers, fetched once per walk (a second round asks nothing twice)."""

    def __init__(self, index: str, session: requests.Session):
        self.index, self.session = index, session
        self._versions: dict[str, dict[Version, list[dict]] | None] = {}
        self._needs: dict[str, list[Requirement]] = {}

    def versions(self, name: str) -> dict[Version, list[dict]] | None:
        """version -> fitting wheels; None when the index has no such project."""
        if name not in self._versions:
            r = self.session.get(f"{self.index}/{name}/", headers={"Accept": SIMPLE_JSON}, timeout=60)
            if r.status_code == 404:
                self._versions[name] = None
            else:
                r.raise_for_status()
                self._versions[name] = _versions(r.json().get("files", []))
        return self._versions[name]

    def needs(self, file: dict) -> list[Requirement]:
        """A wheel's Requires-Dist (PEP 658, else its zip's METADATA); CudaUnknown when unreadable."""
        url = file["url"]
        if url not in self._needs:
            out = []
            for line in requires_dist(file_metadata(file, session=self.session)):
                try:
                    out.append(Requirement(line))
                except InvalidRequirement:
                    continue
            self._needs[url] = out
        return self._needs[url]


def walk(root: str, *, index: str, session: requests.Session | None = None, limit: int = 600) -> Closure:
    """Walk root's requirement tree on the index; see the module docstring for what it promises."""
    answers = _Index(index, session or requests.Session())
    narrowed: dict[str, SpecifierSet] = {}
    closure = Closure()
    for _ in range(ROUNDS):
        closure, edges = _walk_once(root, answers, narrowed, limit)
        if not closure.conflicts:
            break
        learnt = _learn(closure, edges, answers, narrowed)
        if learnt == narrowed:
            break                       # nothing new to apply: report what still fails
        narrowed = learnt
    return closure


def _learn(closure: Closure, edges: list[tuple[str, Requirement]], answers: _Index,
           narrowed: dict[str, SpecifierSet]) -> dict[str, SpecifierSet]:
    """What the next round applies. A package whose askers can all be satisfied at once gets all their
    specifiers together; where they cannot, the earlier askers (nearer the root: the walk is breadth
    first) win and the asker that cannot be satisfied with them steps back one version (pip's
    backtracking, one step a round)."""
    learnt = dict(narrowed)
    for name in {canonicalize_name(line.split("==", 1)[0]) for line in closure.conflicts}:
        asks = [(parent, req) for parent, req in edges if canonicalize_name(req.name) == name]
        versions = answers.versions(name) or {}
        together = SpecifierSet()
        for parent, req in asks:
            if list((together & req.specifier).filter(versions, prereleases=None)):
                together &= req.specifier
            elif "==" in parent:
                who, _, version = parent.partition("==")
                learnt[who] = learnt.get(who, SpecifierSet()) & SpecifierSet(f"!={version}")
        learnt[name] = learnt.get(name, SpecifierSet()) & together
    return learnt


def _walk_once(root: str, answers: _Index, narrowed: dict[str, SpecifierSet],
               limit: int) -> tuple[Closure, list[tuple[str, Requirement]]]:
    env = _environment()
    closure = Closure()
    queue: deque[tuple[Requirement, str]] = deque([(Requirement(root), "the target")])
    needs: dict[str, list[Requirement]] = {}       # name -> its Requires-Dist
    extras_done: dict[str, set[str]] = {}          # name -> extras whose needs were queued ("" = the base)
    failed: set[str] = set()
    edges: list[tuple[str, Requirement]] = []      # (who, what it asked for)
    while queue:
        req, parent = queue.popleft()
        name = canonicalize_name(req.name)
        edges.append((parent, req))
        if parent not in closure.required_by.setdefault(name, []):
            closure.required_by[name].append(parent)
        if name in failed:
            continue
        if name not in needs:
            if len(needs) >= limit:
                closure.missing.append(f"stopped after {limit} packages: the tree is larger than this walk allows")
                break
            chosen = _choose(req, parent, name, answers, narrowed.get(name), closure)
            if chosen is None:
                failed.add(name)
                continue
            needs[name] = chosen
            extras_done[name] = set()
        wanted = ({""} | set(req.extras)) - extras_done[name]
        extras_done[name] |= wanted
        who = f"{name}=={closure.found[name]}"
        for dep in needs[name]:
            if dep.marker is None:
                take = "" in wanted
            else:
                take = any(dep.marker.evaluate({**env, "extra": e}) for e in wanted)
            if take:
                queue.append((dep, who))
    closure.conflicts = _conflicts(edges, closure)
    return closure, edges


def _choose(req: Requirement, parent: str, name: str, answers: _Index, narrowed: SpecifierSet | None,
            closure: Closure) -> list[Requirement] | None:
    """The newest fitting version for req (and what later rounds learnt): recorded in closure, its
    needs returned; None when missing."""
    index = answers.index
    versions = answers.versions(name)
    if versions is None:
        closure.missing.append(f"{req} (required by {parent}) is not on {index} at all")
        return None
    # filter() is pip's rule: final releases only, unless the specifier names a pre-release
    # or nothing else matches.
    fitting = sorted(req.specifier.filter(versions))
    if narrowed is not None:
        fitting = sorted(narrowed.filter(fitting))
    if not fitting:
        have = ", ".join(str(v) for v in sorted(versions)[-3:]) or "no wheel for CPython 3.12 on x86-64"
        also = f" and {narrowed}, which others ask for" if narrowed is not None else ""
        closure.missing.append(f"{req}{also} (required by {parent}) is not on {index} (it has {have})")
        return None
    version = fitting[-1]
    closure.found[name] = str(version)
    closure.files[name] = sorted(versions[version], key=lambda f: f["filename"])
    try:
        return answers.needs(versions[version][0])
    except CudaUnknown as e:
        closure.missing.append(f"{name}=={version}: its needs are unknown ({e})")
        return None


def _conflicts(edges: list[tuple[str, Requirement]], closure: Closure) -> list[str]:
    """Every requirement met on the walk that the version chosen for it does not satisfy."""
    out: list[str] = []
    for parent, req in edges:
        name = canonicalize_name(req.name)
        have = closure.found.get(name)
        if have is None or req.specifier.contains(Version(have), prereleases=True):
            continue
        line = (f"{name}=={have} (the walk's choice) does not satisfy {req} (required by {parent}): "
                "pip would pick another version; this walk does not backtrack")
        if line not in out:
            out.append(line)
    return out
