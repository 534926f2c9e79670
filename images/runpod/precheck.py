"""Before anything is rented: can this image serve this deploy config on this shape? (issue 49)

A pod the supervisor then refuses still bills (the field notes' 5-GPU pod picked up a 2-GPU placement;
`pods up --gpu-count 5` once rented $2.20/h for a 2-GPU config). So `pods up`, `endpoint up` and
`cluster up` check, with what the workstation knows, every refusal the pod would make:

    engine          the config's engine is the image's
    flags           every rung lints against the image's own flag snapshot (images/engine-flags/:
                    the --help of the engine version the image pins; a target without one, the
                    llama.cpp fork at an unresolved commit, is linted on the pod only: a note)
    archs           the GPU kind's compute capability runs what the image compiled (CUDA binary
                    compatibility: an sm_86 build runs on 8.6 and later 8.x, never on 9.0 or 7.5)
    hardware        [hardware] gpu_count (exact), min_vram_mib (the catalog's memory, GB),
                    min_compute_capability (images/gpus.toml), as the supervisor's guard reads them
    parallelism     a vLLM rung's tensor x pipeline parallel = GPUs per pod x nodes
Each problem names the field (a command-line option, or the config's table and key), the value, and
the fix. What cannot be checked here (a GPU kind images/gpus.toml has no compute capability for) is a
note, said, never a silent pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.engines import registry as engines

from .. import gpus
from ..deployment import Deployment
from ..paths import IMAGES_DIR
from ..target import Target, parallel_of

FLAGS_DIR = IMAGES_DIR / "engine-flags"


@dataclass(frozen=True)
class PodShape:
    gpu_id: str | None            # None: a CPU pod
    gpus: int                     # per pod (node)
    nodes: int = 1
    gpu_from: str = "--gpu"       # where each value came from, for the error's field
    count_from: str = "--gpu-count"
    nodes_from: str = "--nodes"


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def snapshot_path(target: Target) -> Path | None:
    """The image's engine flag snapshot, when Kiln keeps one for its pinned version."""
    src = target.source
    if not (src.package and src.version):
        return None
    path = FLAGS_DIR / f"{src.package}-{src.version}.txt"
    return path if path.is_file() else None


def serves_capability(target: Target, capability: tuple[int, int]) -> bool:
    """CUDA binary compatibility: code compiled for sm_XY runs on X.Z for Z >= Y (same major)."""
    for arch in target.cuda_archs:
        major, minor = int(arch[:-1]), int(arch[-1])
        if capability[0] == major and capability[1] >= minor:
            return True
    return False


def archs_text(target: Target) -> str:
    return ", ".join(f"sm_{a}" for a in target.cuda_archs) or "none"


def check(dep: Deployment, shape: PodShape, catalog_entry: dict[str, Any] | None = None) -> Verdict:
    v = Verdict()
    target, cfg = dep.target, dep.config
    where = dep.describe()
    if cfg.engine != target.engine:
        v.problems.append(f"engine: {where} serves with {cfg.engine!r}, the {target.name} image runs "
                          f"{target.engine!r}. Fix: a {cfg.engine} target (`python build.py list`), or a config for "
                          f"{target.engine}")
        return v                                  # nothing else of it would mean anything
    _lint(dep, shape, v)
    if shape.gpu_id is not None:
        _gpu(dep, shape, catalog_entry, v)
    elif cfg.hardware.gpu_count:
        v.problems.append(f"[hardware] gpu_count: {where} expects {cfg.hardware.gpu_count} GPU(s) and this is a CPU "
                          "pod: the supervisor would refuse it. Fix: a GPU target, or gpu_count = 0")
    return v


def _lint(dep: Deployment, shape: PodShape, v: Verdict) -> None:
    target, cfg = dep.target, dep.config
    engine = engines.get(cfg.engine)
    snap_path = snapshot_path(target)
    snapshot = engine.load_snapshot(snap_path) if snap_path else None
    if snapshot is None:
        v.notes.append(f"flags NOT checked before renting: Kiln keeps no flag snapshot for {target.name}'s engine "
                       f"({target.source.package or target.source.url} {target.source.version or target.source.branch}); "
                       "the pod lints every rung against its own at boot")
    for i, rung in enumerate(cfg.ladder.rungs):
        for issue in engine.lint_rung(cfg, i, rung, snapshot, gpu_count=shape.gpus or None):
            if getattr(issue, "severity", "error") == "error":
                v.problems.append(f"{issue} ({dep.describe()}; the {target.name} image's engine would refuse it)")


def _gpu(dep: Deployment, shape: PodShape, entry: dict[str, Any] | None, v: Verdict) -> None:
    target, cfg = dep.target, dep.config
    hw = cfg.hardware
    gpu = shape.gpu_id
    assert gpu is not None
    f = gpus.facts(gpu)
    if hw.gpu_count is not None and hw.gpu_count != shape.gpus:
        v.problems.append(f"{shape.count_from} {shape.gpus}: {dep.describe()} has [hardware] gpu_count = "
                          f"{hw.gpu_count}: the supervisor would refuse a pod of {shape.gpus} GPU(s). Fix: "
                          f"{'--gpu-count' if shape.count_from == '--gpu-count' else 'rent'} {hw.gpu_count}, or a "
                          f"config planned for {shape.gpus} (`python build.py plan --model SRC --gpu '{gpu}' --count "
                          f"{shape.gpus} --write-config FILE`)")
    memory_gb = (entry or {}).get("memory") if entry else None
    if memory_gb is None and f is not None:
        memory_gb = f.memory_gb
    if hw.min_vram_mib is not None:
        if memory_gb is None:
            v.notes.append(f"[hardware] min_vram_mib NOT checked: no memory figure for {gpu!r}")
        elif memory_gb * 10**9 / 2**20 < hw.min_vram_mib * 0.99:   # the catalog's GB round the card's own size
            v.problems.append(f"{shape.gpu_from} {gpu!r}: {memory_gb:g} GB a card, under the {hw.min_vram_mib} MiB "
                              f"[hardware] min_vram_mib of {dep.describe()} asks. Fix: a GPU kind with more memory, "
                              "or a config planned for this one")
    capability = f.capability if f is not None else None
    if capability is None:
        v.notes.append(f"compute capability of {gpu!r} unknown to Kiln (images/gpus.toml): the image's archs "
                       f"({archs_text(target)}) and [hardware] min_compute_capability NOT checked before renting")
    else:
        cc = f"{capability[0]}.{capability[1]}"
        if not serves_capability(target, capability):
            v.problems.append(f"{shape.gpu_from} {gpu!r}: compute capability {cc}; the {target.name} image is built for "
                              f"{archs_text(target)}, which runs on the same major version only. Fix: a GPU kind of "
                              f"compute capability {_served(target)}, or a target built for sm_{capability[0]}"
                              f"{capability[1]} (docs/images.md: Add a target)")
        if hw.min_compute_capability:
            want = tuple(int(x) for x in hw.min_compute_capability.split("."))
            if capability < want:
                v.problems.append(f"{shape.gpu_from} {gpu!r}: compute capability {cc}, under [hardware] "
                                  f"min_compute_capability = {hw.min_compute_capability} of {dep.describe()}: the "
                                  f"supervisor would refuse the pod. Fix: a GPU kind of {hw.min_compute_capability} "
                                  "or later")
    if cfg.engine == "vllm":
        total = shape.gpus * shape.nodes
        for i, rung in enumerate(cfg.ladder.rungs):
            args = list(cfg.server.extra_args) + list(rung.args)
            tp = parallel_of(args, ("-tp", "--tensor-parallel-size"))
            pp = parallel_of(args, ("-pp", "--pipeline-parallel-size"))
            if tp * pp != total:
                span = f"{shape.nodes} nodes x {shape.gpus} GPUs" if shape.nodes > 1 else f"{shape.gpus} GPU(s)"
                fix = f"-tp {shape.gpus} -pp {shape.nodes}" if shape.nodes > 1 else f"-tp {shape.gpus}"
                v.problems.append(f"ladder.rungs[{i}] ({rung.name}): tensor x pipeline parallel = {tp} x {pp} GPUs, "
                                  f"the {'cluster' if shape.nodes > 1 else 'pod'} has {span} "
                                  f"({shape.count_from}{', ' + shape.nodes_from if shape.nodes > 1 else ''}). Fix: "
                                  f"{fix} in the rung, or rent {tp * pp} GPUs")


def _served(target: Target) -> str:
    return " or ".join(f"{a[:-1]}.{a[-1]}+ (same major)" for a in target.cuda_archs) or "none"
