"""What Kiln knows of each RunPod GPU kind beyond its catalog entry: compute capability, memory,
memory bandwidth, each with where it was read and whether it was read on the vendor's own page.

RunPod's catalog (GET /v2/catalog/gpus) gives memory, price, count and CUDA versions, never the
compute capability or bandwidth; images/gpus.toml carries those for every GPU type id of RunPod's GPU
types page (research of 2026-12-06: docs/research/gpu-facts-2026-12-06.md). A figure read only on a
third-party page is kept and said to be so (`verified` False for that field); a figure nobody read is
absent, never guessed: callers say "unknown" for it.

    facts(gpu_id)            -> GpuFacts or None (an id images/gpus.toml does not hold)
    GpuFacts.capability      (8, 6) or None
    GpuFacts.bandwidth_gbs   696.0 or None, with bandwidth_basis saying where it came from
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass

from .paths import IMAGES_DIR

FACTS_FILE = IMAGES_DIR / "gpus.toml"


@dataclass(frozen=True)
class GpuFacts:
    id: str
    capability: tuple[int, int] | None       # CUDA compute capability; None for AMD or not known
    capability_verified: bool
    memory_gb: float | None
    bandwidth_gbs: float | None
    bandwidth_verified: bool
    source: str                              # the vendor page of the verified fields
    other_sources: tuple[str, ...]           # "field: URL (kind)" for third-party figures

    @property
    def capability_text(self) -> str:
        return f"{self.capability[0]}.{self.capability[1]}" if self.capability else "unknown"

    @property
    def bandwidth_basis(self) -> str:
        if self.bandwidth_gbs is None:
            return "no datasheet bandwidth known"
        if self.bandwidth_verified:
            return f"datasheet {self.bandwidth_gbs:g} GB/s ({self.source})"
        return f"{self.bandwidth_gbs:g} GB/s as third-party pages restate the datasheet (not read on the vendor's)"


def parse_capability(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


@functools.cache
def _all() -> dict[str, GpuFacts]:
    data = tomllib.loads(FACTS_FILE.read_text(encoding="utf-8"))
    out = {}
    for gpu_id, e in data.items():
        verified = set(e.get("verified_fields") or ())
        cc = e.get("compute_capability")
        out[gpu_id] = GpuFacts(
            id=gpu_id, capability=parse_capability(cc) if isinstance(cc, str) else None,
            capability_verified="compute_capability" in verified,
            memory_gb=float(e["memory_gb"]) if isinstance(e.get("memory_gb"), (int, float)) else None,
            bandwidth_gbs=float(e["bandwidth_gbs"]) if isinstance(e.get("bandwidth_gbs"), (int, float)) else None,
            bandwidth_verified="bandwidth_gbs" in verified, source=str(e.get("source", "")),
            other_sources=tuple(e.get("other_sources") or ()))
    return out


def facts(gpu_id: str) -> GpuFacts | None:
    return _all().get(gpu_id)


def known_ids() -> list[str]:
    return sorted(_all())
