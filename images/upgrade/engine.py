"""`build.py upgrade`: move a target's engine to another version, and show what the move changes before
anything is written.

    releases.py    the version (the index's newest by default, or --to) and the one file to pin
    cuda.py        its CUDA floor, from the wheel's and torch's metadata (vLLM)
    pyclosure.py   its closure walked and checked; closure.py: hash-locked (vLLM)
    kiln_argv.py   the flags Kiln's own argv builders add, which no deploy config shows
    snapshot.py    the flag snapshots of the pinned and the new version, from the engines' own parsers
    flagdiff.py    what the flags did: removed (with the replacement named), renamed, added, defaults
    here           every deploy config of every target on that engine, and the published configs given,
                   linted against both snapshots: a rung the new version would refuse where the pinned
                   one did not refuses the whole upgrade (file, rung, flag, fix); so does a flag the
                   supervisor itself puts on every rung's argv that the new version lacks (kiln_argv.py),
                   and, for a config that runs as a cluster, on every node's (supervisor/cluster/engine.py);
                   then the writes

Nothing is written until everything above is known and clean, and with --dry-run nothing at all: the
closure file (images/closures/), the target's pins in images/lock.toml, the target's [source] (and
[cuda] version where the floor moved); for the router (smg) also supervisor/router-requirements.txt,
resolved and hashed by pip before anything is written, and pyproject.toml's extras: one pin, so the
image never installs one version while its labels name another (images/build/render.py refuses that).
The rendered Dockerfiles follow with `python build.py generate`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re
from packaging.version import Version
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from supervisor.config import load_config
from supervisor.engines import registry
from supervisor.errors import ConfigError, KilnError

from ..pins import closure as closure_file
from . import flagdiff, kiln_argv, releases, snapshot
from ..pins import lock as lockfile
from ..pins.cuda import engine_cuda
from ..pins.lock import Pin, load_lock, pins_for, save_lock
from ..pins.pyclosure import walk
from ..pins.resolve import closure_source
from ..paths import REPO_ROOT, ROUTER_REQUIREMENTS, SUPERVISOR_REQUIREMENTS, TARGETS_DIR
from ..pins import requirements
from ..deployment import nodes_of
from ..target import Target, load_target

Log = Callable[[str], None]
PYPROJECT = REPO_ROOT / "pyproject.toml"      # the router's pin in the `router` and `dev` extras (a checkout's smg)


@dataclass(frozen=True)
class Refusal:
    file: str
    rung: str
    where: str
    flag: str
    fix: str

    def __str__(self) -> str:
        flag = f" {self.flag}" if self.flag else ""
        return f"{self.file}: rung {self.rung} ({self.where}){flag}: {self.fix}"


@dataclass
class Plan:
    target: Target                  # as pinned now
    moved: Target                   # with the new version's source (and CUDA)
    pins: dict[str, Pin]            # the new pins: source.sha256, engine.cuda, engine.closure
    closure_name: str               # "" for an engine without a closure (llama.cpp)
    closure_text: str
    old_closure: str                # the pinned version's closure file text, "" when there is none
    diff: flagdiff.FlagDiff
    snapshots: dict[str, str]       # version -> where its snapshot came from
    linted: list[tuple[str, int]] = field(default_factory=list)   # (file, rungs)
    refusals: list[Refusal] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)   # the new closure's gaps: the lock cannot be written
    resolvable: str | None = None   # then: the newest release newer than the pinned one whose closure resolves
    notes: list[str] = field(default_factory=list)
    files: dict[Path, str] = field(default_factory=dict)   # other files the one pin is written into (the router's)
    index: str = ""
    today: str = ""

    @property
    def old_version(self) -> str:
        return str(self.target.source.version)

    @property
    def new_version(self) -> str:
        return str(self.moved.source.version)

    @property
    def clean(self) -> bool:
        return not self.refusals and not self.unresolved


def rel_path(path: Path) -> str:
    """A path as a reader of the report would write it: repository-relative, else under ~, else whole."""
    for root, prefix in ((REPO_ROOT, ""), (Path.home(), "~/")):
        try:
            return prefix + str(path.resolve().relative_to(root.resolve()))
        except ValueError:
            continue
    return str(path)


def _moved(target: Target, release: releases.Release) -> Target:
    src = target.source
    url = release.url if src.kind == "sdist" else src.url
    return dataclasses.replace(target, source=dataclasses.replace(src, version=release.version,
                                                                  filename=release.filename, url=url))


def _closure(package: str, version: str, index: str, log: Log, *, partial: list[str] | None = None) -> str:
    """The version's hash-locked closure text: the committed file, else the cache, else a walk. With
    `partial` (a list), a walk with gaps is not an error: the gaps are appended to it and what was
    found is returned (closure_file.text partial: for the parser's scratch venv only, never cached)."""
    committed = closure_file.path_for(package, version)
    cache = snapshot.slot(package, version) / closure_file.file_name(package, version)
    for path in (committed, cache):
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        if f"walked on {index} " in text:
            return text
    root = f"{package}=={version}"
    log(f"upgrade: walking {root}'s closure on {index} (metadata only)")
    walked = walk(root, index=index)
    if partial is not None and not walked.complete:
        partial += walked.problems()
        return closure_file.text(root, walked, index, partial=True)
    text = closure_file.text(root, walked, index)
    cache.parent.mkdir(parents=True, exist_ok=True)
    closure_file.write(cache, text)
    return text


def plan(name: str, to: str | None = None, *, index: str = "https://pypi.org/simple",
         given: dict[str, Path] | None = None, published: list[Path] | None = None,
         python: str | None = None, cpu_torch: str | None = None, log: Log = snapshot._stderr,
         today: str | None = None, targets_dir: Path | None = None) -> Plan:
    """Everything `upgrade` would do, found out and nothing written."""
    today = today or _dt.date.today().isoformat()
    given = given or {}
    targets_dir = targets_dir or TARGETS_DIR
    target = load_target(name, targets_dir)
    src = target.source
    if src.kind not in ("pypi-wheel", "sdist") or not src.package:
        raise KilnError(f"target {name}: upgrade moves an engine pinned on PyPI (source kind pypi-wheel or "
                        f"sdist); {src.kind} sources follow their branch with `python build.py lock`")
    release = releases.release(target, to, index=index)
    moved = _moved(target, release)
    pins = {"source.sha256": Pin("source.sha256", release.sha256,
                                 f"PyPI simple API ({index}) for {release.filename}", today)}
    closure_text = old_closure = closure_name = ""
    unresolved: list[str] = []
    if target.engine == "vllm":
        floor, evidence = engine_cuda(moved, index=index)
        pins["engine.cuda"] = Pin("engine.cuda", floor, evidence, today)
        if floor != target.cuda_version:
            moved = dataclasses.replace(moved, cuda_version=floor)
        closure_name = closure_file.file_name(src.package, release.version)
        closure_text = _closure(src.package, release.version, index, log, partial=unresolved)
        if not unresolved:
            pins["engine.closure"] = Pin("engine.closure", closure_file.digest(closure_text),
                                         closure_source(closure_text, index, closure_name), today)
        old_closure = _closure(src.package, str(src.version), index, log)
    files: dict[Path, str] = {}
    if target.engine == "router":
        files = _router_files(src.package, str(src.version), release.version, unresolved, log)
    current = pins_for(target, load_lock())
    engine = registry.get(target.engine)
    snaps: dict[str, Any] = {}
    how: dict[str, str] = {}
    for version, tgt, tpins, text in ((str(src.version), target, current, old_closure),
                                      (release.version, moved, {**current, **pins}, closure_text)):
        if version in given:
            path, how[version] = given[version], f"given: {rel_path(given[version])}"
        else:
            path, made = snapshot.snapshot(tgt, tpins, closure_text=text, python=python, cpu_torch=cpu_torch,
                                           log=log)
            how[version] = f"{made}: {rel_path(path)}"
        snaps[version] = engine.load_snapshot(path)
    known = getattr(engine, "REMOVED", None) or {k: f"use {v}"
                                                 for k, v in getattr(engine, "KNOWN_RENAMES", {}).items()}
    diff = flagdiff.diff(snaps[str(src.version)], snaps[release.version], old_version=str(src.version),
                         new_version=release.version, known=known)
    p = Plan(target, moved, pins, closure_name, closure_text, old_closure, diff, how, index=index, today=today,
             unresolved=unresolved, files=files)
    if unresolved and closure_name:          # a closure walked on the index (vLLM); the router's is pip's
        p.resolvable = newest_resolvable(target, release.version, index=index, log=log)
    hosts = _configs(target.engine, targets_dir)
    configs = list(hosts) + [path.resolve() for path in published or []]
    _lint_all(p, engine, snaps[str(src.version)], snaps[release.version], configs, hosts)
    return p


def _router_files(package: str, old: str, new: str, unresolved: list[str], log: Log) -> dict[Path, str]:
    """The router's one pin, as the other files that hold it will read: supervisor/router-requirements.txt
    (what the image installs, every wheel hashed: resolved by pip now, so the lock, the target's [source]
    and the image's labels never name a version the image does not install) and pyproject.toml's extras."""
    current = ROUTER_REQUIREMENTS.read_text(encoding="utf-8") if ROUTER_REQUIREMENTS.is_file() else None
    log(f"upgrade: resolving {package}=={new} and its dependencies with pip (hashed, as `generate` does)")
    try:
        text = requirements.lock(current, top_level=(f"{package}=={new}",),
                                 base=SUPERVISOR_REQUIREMENTS.read_text(encoding="utf-8"),
                                 what=f"the router's {package} and its deps")
    except requirements.PipFailed as e:
        unresolved.append(f"{package}=={new} and its dependencies: {e}")
        return {}
    out = {ROUTER_REQUIREMENTS: text}
    pyproject = PYPROJECT.read_text(encoding="utf-8")
    moved = re.sub(rf'"{re.escape(package)}=={re.escape(old)}"', f'"{package}=={new}"', pyproject)
    if moved != pyproject:
        out[PYPROJECT] = moved
    return out


def newest_resolvable(target: Target, above: str, *, index: str, log: Log, tries: int = 4) -> str | None:
    """The newest release older than `above` and newer than the pinned one whose closure resolves
    (at most `tries` walks, newest first); None when none does."""
    pinned = Version(str(target.source.version))
    between = sorted((v for v in releases.usable_files(target, index=index) if pinned < v < Version(above)),
                     reverse=True)
    for v in between[:tries]:
        gaps: list[str] = []
        _closure(str(target.source.package), str(v), index, log, partial=gaps)
        if not gaps:
            return str(v)
        log(f"upgrade: {target.source.package} {v} does not resolve either: {gaps[0]}")
    return None


def _configs(engine: str, targets_dir: Path) -> dict[Path, Target]:
    """Every deploy config (default and profiles) of every target on this engine, with the (first)
    target that bakes it."""
    out: dict[Path, Target] = {}
    for path in sorted(targets_dir.glob("*.toml")):
        t = load_target(path.stem, targets_dir)
        if t.engine == engine:
            for cfg_path in (t.deploy_config_path, *t.profiles.values()):
                out.setdefault(cfg_path, t)
    return out


def _nodes(cfg: Any, host: Target) -> int:
    """How many nodes a config runs on: its target's [runpod] nodes (a cluster target bakes only configs
    that span them, images/target.py), or as many as its rungs span over the GPUs a node has (a config
    given with `cluster up --config`: images/deployment.py nodes_of, with the same shape)."""
    per_node = cfg.plan.cards or cfg.hardware.gpu_count or host.runpod.gpu_count
    return max(host.runpod.nodes, nodes_of(cfg, per_node))


def _lint_all(p: Plan, engine: Any, old: Any, new: Any, paths: list[Path],
              hosts: dict[Path, Target] | None = None) -> None:
    """`hosts`: the target that bakes each config (a published one's is the target being moved)."""
    own: dict[tuple[str, str], list[str]] = {}   # (builder, a flag Kiln adds) -> "file: rung" of each rung
    hosts = hosts or {}
    for path in paths:
        rel = rel_path(path)
        try:
            cfg = load_config(path, env={})
        except ConfigError as e:
            p.refusals.append(Refusal(rel, "-", "(file)", "", f"not a valid deploy config: {e}"))
            continue
        if cfg.engine != p.target.engine:
            p.notes.append(f"{rel}: engine {cfg.engine}, not {p.target.engine}: not linted")
            continue
        p.linted.append((rel, len(cfg.ladder.rungs)))
        per_node = kiln_argv.node_flags(engine, cfg, _nodes(cfg, hosts.get(path, p.target)))
        for i, rung in enumerate(cfg.ladder.rungs):
            args = list(cfg.server.extra_args) + list(rung.args)
            before = {x.where for x in engine.lint_rung(cfg, i, rung, old) if x.severity == "error"}
            for issue in engine.lint_rung(cfg, i, rung, new):
                if issue.severity != "error":
                    continue
                if issue.where in before:
                    p.notes.append(f"{rel}: {issue} (so on {p.old_version} already)")
                    continue
                flag = _flag_at(issue.where, args)
                fix = p.diff.replacement(flag) if flag else None
                p.refusals.append(Refusal(rel, rung.name, _short_where(issue.where), flag, fix or issue.message))
            p.refusals += _lost_values(p, rel, rung.name, i, args, new)
            for flag in kiln_argv.kiln_flags(engine, cfg, rung):
                own.setdefault((kiln_argv.builder(engine), flag), []).append(f"{rel}: {rung.name}")
            for flag in per_node:              # a cluster's: on every node's argv (supervisor/run/launch.py)
                own.setdefault((kiln_argv.NODE_BUILDER, flag), []).append(f"{rel}: {rung.name}")
            deprecated = {n for ch in p.diff.deprecated for n in ch.flag.split(", ")}
            for k, tok in enumerate(args):
                if tok.split("=", 1)[0] in deprecated:
                    p.notes.append(f"{rel}: rung {rung.name} (ladder.rungs[{i}].args[{k}]) {tok.split('=', 1)[0]}: "
                                   f"deprecated in {p.new_version}, still accepted")


    p.refusals += _lost_own(p, engine, old, new, own)


def _lost_own(p: Plan, engine: Any, old: Any, new: Any, own: dict[tuple[str, str], list[str]]) -> list[Refusal]:
    """A flag the supervisor itself puts on the command line (kiln_argv.py) that the new parser lacks:
    one refusal per flag and builder, naming the builder to change and the rungs it breaks."""
    out = []
    for (builder, flag), rungs in own.items():
        now = new.get(flag)
        if now is not None and not now.removed:
            continue
        was = old.get(flag)
        if was is None or was.removed:
            p.notes.append(f"Kiln's own argv passes {flag}, which {p.old_version} lacks already")
            continue
        said = f"removed it ({now.removed})" if now is not None else "does not accept it"
        fix = p.diff.replacement(flag)
        total = sum(n for _, n in p.linted)
        scope = f"all {total} linted" if len(rungs) == total else f"{len(rungs)} of {total} linted"
        where = "every cluster node's command line (rank 0's or a headless rank's)" \
            if builder == kiln_argv.NODE_BUILDER else "every command line"
        out.append(Refusal(builder, f"* ({scope}, e.g. {rungs[0]})", "Kiln's own argv, in no config",
                           flag, f"the supervisor adds {flag} to {where} it builds for these rungs and "
                           f"{p.new_version} {said}" + (f"; its flag diff: {fix}" if fix else "") + f". Change "
                           f"{builder} before moving the pin: no deploy config can fix this"))
    return out


def _short_where(where: str) -> str:
    """"ladder.rungs[0] (262k).args[4]" -> "ladder.rungs[0].args[4]": the rung's name is said beside it."""
    return re.sub(r"^(ladder\.rungs\[\d+\]) \([^)]*\)", r"\1", where)


def _flag_at(where: str, args: list[str]) -> str:
    m = re.search(r"\.args\[(\d+)\]$", where)
    if not m or int(m.group(1)) >= len(args):
        return ""
    return args[int(m.group(1))].split("=", 1)[0]


def _lost_values(p: Plan, rel: str, rung: str, index: int, args: list[str], new: Any) -> list[Refusal]:
    """A value the new parser's choices no longer hold (`--spec-method medusa` on 0.33.0)."""
    out = []
    for i, tok in enumerate(args):
        if not tok.startswith("--"):
            continue
        name, eq, inline = tok.partition("=")
        value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
        flag = new.get(name)
        if flag is not None and value in p.diff.lost_values(flag.names):
            choices = list(flag.choices or ())
            shown = ", ".join(choices[:12]) + (f", … ({len(choices)} in all)" if len(choices) > 12 else "")
            out.append(Refusal(rel, rung, f"ladder.rungs[{index}].args[{i}]", f"{name} {value}",
                               f"{p.new_version} no longer accepts {value!r}; choose one of its choices: {shown}"))
    return out


# -- writing --------------------------------------------------------------------------------------------
def apply(p: Plan) -> list[str]:
    """Write the closure file, the target's pins and its [source]; returns one line per file written."""
    if not p.clean:
        raise KilnError("refusing to write: " + "; ".join(str(r) for r in p.refusals))
    done: list[str] = []
    src = p.target.source
    assert src.package
    if p.closure_name:
        path = closure_file.path_for(src.package, p.new_version)
        if closure_file.write(path, p.closure_text):
            done.append(f"wrote {rel_path(path)}")
    lock = load_lock()
    pins = dict(lock.get(p.target.name, {}))
    for key, pin in p.pins.items():
        # resolved_on says when a value last changed: a pin found as it was stays as it was
        if key not in pins or (pins[key].value, pins[key].source) != (pin.value, pin.source):
            pins[key] = pin
    lock[p.target.name] = pins
    if save_lock(lock):
        done.append(f"wrote {rel_path(lockfile.LOCK_PATH)}")
    for path, content in p.files.items():
        if path.read_text(encoding="utf-8") != content:
            path.write_text(content, encoding="utf-8")
            done.append(f"wrote {rel_path(path)}")
    text = p.target.path.read_text(encoding="utf-8")
    new_text = edit_target(text, p.target, p.moved)
    if new_text != text:
        p.target.path.write_text(new_text, encoding="utf-8")
        done.append(f"wrote {rel_path(p.target.path)}")
    return done


def edit_target(text: str, old: Target, new: Target) -> str:
    """The target's TOML with [source] version/filename/url (and [cuda] version, the description's
    version) set to the new ones; comments and everything else as they were."""
    out, table = [], ""
    for line in text.splitlines(keepends=True):
        if m := re.match(r"^\[([\w.-]+)\]\s*$", line):
            table = m.group(1)
        key = re.match(r"^(\w+)\s*=", line)
        if key and table == "source" and key.group(1) in ("version", "filename", "url"):
            value = getattr(new.source, key.group(1))
            if value:
                line = f'{key.group(1)} = "{value}"\n'
        elif key and table == "cuda" and key.group(1) == "version" and new.cuda_version:
            line = f'version = "{new.cuda_version}"\n'
        elif key and table == "" and key.group(1) == "description" and old.source.version:
            line = re.sub(rf"(?<![\w.]){re.escape(old.source.version)}(?![\w.])", str(new.source.version), line)
        out.append(line)
    return "".join(out)


def stale_mentions(p: Plan) -> list[str]:
    """Lines of the target file (comments) that still name the old version, for a person to re-read."""
    pattern = re.compile(rf"(?<![\w.]){re.escape(p.old_version)}(?![\w.])")
    return [f"{rel_path(p.target.path)}:{n}: {line.strip()}"
            for n, line in enumerate(p.target.path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
