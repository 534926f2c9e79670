"""Which host CUDA versions a target's image can run on.

A host's CUDA version (what RunPod's catalog lists per GPU type, from the host's driver) must be
at least the CUDA the image was built against: newer drivers run older CUDA, not the reverse.
`cuda_floor` is the one place that says what the image needs: the target's `[cuda] version`, which
is the CUDA the engine really runs, not the base image's (a vLLM target declares 13.0: its torch
wheel needs cu13 although the base is nvidia/cuda 12.8), and which the image build measures again
and refuses to label differently (images/pins/cudafloor.py).
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from ..target import Target

_VERSION = re.compile(r"(\d+)\.(\d+)")


def cuda_floor(target: Target) -> str | None:
    """The lowest host CUDA version (major.minor) the target's image runs on; None for a CPU image."""
    return target.cuda_version


def key(version: str) -> tuple[int, int]:
    """major.minor compared numerically (12.10 is above 12.9), as RunPod's minCudaVersion is."""
    m = _VERSION.fullmatch(version.strip())
    if not m:
        raise ValueError(f"not a major.minor CUDA version: {version!r}")
    return int(m.group(1)), int(m.group(2))


def runs_on(host: str, floor: str) -> bool:
    try:
        return key(host) >= key(floor)
    except ValueError:
        return False


def compatible(offered: Iterable[dict[str, Any]], floor: str) -> list[dict[str, Any]]:
    """The catalog's cudaVersions entries ({version, available}) a `floor` image runs on."""
    return [v for v in offered if isinstance(v, dict) and runs_on(str(v.get("version", "")), floor)]
