"""Where a serving llama.cpp model's weights ended up: in VRAM, or left in host RAM.

The field notes' wall: weights left in host RAM run at the speed of the host's vCPUs (16 vCPU ran the
identical placement 1.9x slower than 41). Once a rung serves, the loop estimates the host-resident
share (the model's size less the VRAM the engine took above the baseline) and warns when vCPU per
host-resident GiB is low (hardware.host_resident_warning).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from ..config import DeployConfig
from ..model.gguf_layout import shards
from ..host.hardware import Hardware, host_resident_warning


def estimate(cfg: DeployConfig, model_path: Path | None, hw: Hardware | None, *,
             gpu_used: Callable[[], Sequence[int] | None],
             baseline_mib: Sequence[int] | None) -> tuple[dict[str, Any] | None, str | None]:
    """(/status's `placement_estimate`, a warning): both None when there is nothing to estimate
    (another engine, no hardware probe, no model file). `gpu_used`: MiB in use per visible GPU,
    read only when there is something to estimate."""
    if cfg.engine != "llamacpp" or hw is None or model_path is None:
        return None, None
    try:
        model_gib = sum(p.stat().st_size for p in shards(model_path)) / 2**30
    except OSError:
        return None, None
    in_vram_gib = sum(max(u - b, 0) for u, b in zip(gpu_used() or [], baseline_mib or [])) / 1024
    host_gib = max(model_gib - in_vram_gib, 0.0)
    record = {"model_gib": round(model_gib, 4), "vram_gib": round(in_vram_gib, 4),
              "host_resident_gib": round(host_gib, 4)}
    return record, host_resident_warning(cfg.hardware, hw, host_gib)
