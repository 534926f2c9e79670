"""Which of Kiln's images serves an engine on a GPU kind: the deploy command `plan` prints names it.

A target is an engine build (images/targets/); it serves a GPU kind whose compute capability its
compiled archs run on (CUDA binary compatibility: images/runpod/precheck.py serves_capability). Of
several, the one whose pins all resolve wins (CI builds and releases it; a floating one is built only
with --allow-floating). None serves: `plan` says which target to add and how (docs/images.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.errors import KilnError

from .. import gpus
from ..pins.lock import load_lock, missing, pins_for
from ..runpod.precheck import serves_capability
from ..target import Target, load_target, target_names


@dataclass(frozen=True)
class ImageChoice:
    target: str | None            # the target to deploy, None when no image serves this GPU kind
    note: str                     # why none, or what to know of the one chosen ("" when nothing)


def _targets(engine: str) -> list[tuple[Target, bool]]:
    """(target, whether its pins all resolve) of every GPU target on `engine`, resolved ones first."""
    lock = load_lock()
    out = []
    for name in target_names():
        try:
            t = load_target(name)
        except KilnError:
            continue
        if t.engine == engine and t.is_gpu:
            out.append((t, not missing(t, pins_for(t, lock))))
    return sorted(out, key=lambda x: (not x[1], x[0].name))


def choose(engine: str, gpu_id: str) -> ImageChoice:
    f = gpus.facts(gpu_id)
    if f is None or f.capability is None:
        return ImageChoice(None, f"no compute capability known for {gpu_id} (images/gpus.toml): Kiln cannot say "
                                 "which image runs there")
    fitting = [(t, ok) for t, ok in _targets(engine) if serves_capability(t, f.capability)]
    if fitting:
        t, resolved = fitting[0]
        return ImageChoice(t.name, "" if resolved else f"{t.name} has unresolved pins: build it with --allow-floating")
    like = next((t for t, _ in _targets(engine)), None)
    cc = f"{f.capability[0]}{f.capability[1]}"
    how = (f"copy images/targets/{like.name}.toml to a new target with [cuda] archs = [\"{cc}\"] and [runpod] "
           f"gpu_type = \"{gpu_id}\", then `python build.py lock --target NAME` and build it (docs/images.md: "
           "Add a target)") if like else f"no {engine} target exists to start from"
    return ImageChoice(None, f"no Kiln image runs {engine} on {gpu_id} (compute capability "
                             f"{f.capability_text}): {how}")
