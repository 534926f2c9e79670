"""A plan's speed, always with its basis, in this order:

1. measured: a row for this model, engine, GPU kind, count and residency (the field notes' tables in
   seed.py; Kiln's own measurements in measured.json, appended by bench/plan_record.py);
2. estimate: for a resident plan on a GPU kind whose memory bandwidth Kiln knows (images/gpus.toml),
   decode.py's step-time model calibrated on measured sweeps (images/plan/decode-calibration.json), for
   one stream and for the asked streams; the bandwidth bound (weights read per token over the
   datasheet bandwidth) beside it, labelled as a bound;
3. host-bound: an offloaded plan runs at the host's speed; the plan names the vCPU the pod would get
   where pods have reported it;
4. unknown, said so.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.plan.shape import Shape

from .. import gpus
from . import decode, measured, seed

# The slot layout of the deploy config plan writes: llama.cpp with --kv-unified (rank.deploy_config)
LAYOUT = {"llamacpp": "unified", "vllm": ""}


@dataclass(frozen=True)
class Speed:
    decode_1: float | None          # tok/s, one stream, at the start of a conversation
    decode_n: float | None          # aggregate tok/s at `streams`
    streams: int
    prefill: float | None
    basis: str
    measured: bool
    bound_1: float | None = None    # the bandwidth bound, one stream (never a prediction)
    decode_1_at_ctx: float | None = None     # one stream at the planned context's end (estimates only)


def _rows(name: str, engine: str, gpu: str, count: int, resident: bool) -> list[seed.SpeedRow]:
    low = name.lower()
    known = (*seed.SPEED_ROWS, *measured.load())        # the field notes' tables, then Kiln's own measurements
    return sorted((r for r in known if all(m in low for m in r.match) and r.engine == engine
                   and r.gpu == gpu and r.count == count and r.resident == resident), key=lambda r: r.streams)


def bandwidth(gpu: str) -> tuple[float | None, str]:
    facts = gpus.facts(gpu)
    if facts is not None and facts.bandwidth_gbs:
        return facts.bandwidth_gbs, facts.bandwidth_basis
    if gpu in seed.BANDWIDTH_GB_S:
        return seed.BANDWIDTH_GB_S[gpu], "field notes"
    return None, "no datasheet bandwidth known"


def estimate(shape: Shape, name: str, *, engine: str, gpu: str, count: int, resident: bool, streams: int,
             kv_bytes_per_token: float = 0.0, ctx: int = 0) -> Speed:
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
    bw, bw_basis = bandwidth(gpu)
    facts = gpus.facts(gpu)
    bw_said = f"{bw:g} GB/s" + ("" if facts is not None and facts.bandwidth_verified else " (a third-party figure)")
    if not bw:
        return Speed(None, None, streams, None, f"unknown: no measurement and no memory bandwidth figure for {gpu}",
                     False)
    at_once = count if engine == "vllm" else 1      # vLLM's tensor parallelism reads every card at once
    bound = bw * 1e9 * at_once / max(1, shape.active_bytes)
    fit = decode.fit_for(engine, LAYOUT[engine])
    if fit is None:
        return Speed(bound, bound * streams, streams, None,
                     f"upper bound: {bw_basis} / {shape.active_bytes / 1e9:.1f} GB read per token; no calibration",
                     False, bound_1=bound)
    kw = {"bandwidth_gbs": bw, "cards_read_at_once": at_once, "kv_bytes_per_token": kv_bytes_per_token}
    est = decode.estimate(fit, shape, streams=streams, **kw)
    at_ctx = decode.estimate(fit, shape, streams=1, position=ctx, **kw).decode_1 if ctx else None
    basis = f"estimate: calibrated on {fit.basis}, {fit.checked}; bound {bound:.4g} tok/s at {bw_said}"
    if gpu not in fit.basis:
        basis += "; per-step costs assumed as on the calibration GPU"
    if est.extrapolated:
        basis += f"; {streams} streams is past the most measured ({max(fit.by_streams)}): extrapolated"
    return Speed(est.decode_1, est.decode_n, streams, None, basis, False, bound_1=bound, decode_1_at_ctx=at_ctx)


def usd_per_million(usd_h: float, tok_s: float | None) -> float | None:
    """$ per 1M output tokens at an aggregate rate."""
    if not tok_s:
        return None
    return usd_h / (tok_s * 3600) * 1e6
