"""A plan's speed, always with its basis: a measured row (the field notes' tables, carried in seed.py, and
Kiln's own measurements, measured.json, appended by bench/plan_record.py) for
this model, engine, GPU kind, count and residency; else, for a resident plan on a GPU whose memory
bandwidth Kiln knows, a bandwidth bound labelled as an upper bound (weights read per token: all but
the routed experts a token skips); else unknown, said so. An offloaded plan is host-bound: its
speed is the host's, and the plan names the vCPU the pod would get where pods have reported it.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.plan.shape import Shape

from . import measured, seed


@dataclass(frozen=True)
class Speed:
    decode_1: float | None          # tok/s, one stream
    decode_n: float | None          # aggregate tok/s at `streams`
    streams: int
    prefill: float | None
    basis: str
    measured: bool


def _rows(name: str, engine: str, gpu: str, count: int, resident: bool) -> list[seed.SpeedRow]:
    low = name.lower()
    known = (*seed.SPEED_ROWS, *measured.load())        # the field notes' tables, then Kiln's own measurements
    return sorted((r for r in known if all(m in low for m in r.match) and r.engine == engine
                   and r.gpu == gpu and r.count == count and r.resident == resident), key=lambda r: r.streams)


def estimate(shape: Shape, name: str, *, engine: str, gpu: str, count: int, resident: bool, streams: int) -> Speed:
    rows = _rows(name, engine, gpu, count, resident)
    if rows:
        one = next((r for r in rows if r.streams == 1), None)
        at = [r for r in rows if r.streams <= streams]
        n = at[-1] if at else rows[0]
        basis = f"measured: {n.source}"
        if n.streams != streams:
            basis += f" (aggregate at {n.streams} streams, the nearest measured at or below {streams})"
        return Speed(one.decode_tok_s if one else None, n.decode_tok_s, n.streams, n.prefill_tok_s, basis, True)
    if not resident:
        vcpu = seed.VCPU_BY_COUNT.get((gpu, count))
        host = f"{vcpu} vCPU (what such a pod reported)" if vcpu else "a vCPU count RunPod does not list per GPU"
        return Speed(None, None, streams, None, f"host-bound: part of the model runs on the host's CPU, "
                     f"{host}; no measured speed", False)
    bw = seed.BANDWIDTH_GB_S.get(gpu)
    if not bw:
        return Speed(None, None, streams, None, f"unknown: no measurement and no memory bandwidth figure for {gpu}",
                     False)
    per_token = bw * 1e9 / max(1, shape.active_bytes)
    # llama.cpp splits layers: one card works at a time (field notes § "Decode is serialisation-bound");
    # vLLM's tensor parallelism reads every card at once.
    one = per_token * (count if engine == "vllm" else 1)
    return Speed(one, one * streams, streams, None,
                 f"upper bound: {bw:g} GB/s (field notes) / {shape.active_bytes / 1e9:.1f} GB read per token"
                 f"{' x ' + str(count) + ' cards' if engine == 'vllm' and count > 1 else ''}; streams x that at "
                 f"{streams}", False)


def usd_per_million(usd_h: float, tok_s: float | None) -> float | None:
    """$ per 1M output tokens at an aggregate rate."""
    if not tok_s:
        return None
    return usd_h / (tok_s * 3600) * 1e6
