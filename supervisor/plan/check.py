"""The plan checks itself after boot: what `build.py plan` predicted ([plan] in the deploy config)
beside what this pod measured, once the selftest has run.

    memory   the fullest card's used MiB from NVML (host/hardware.py) against [plan] card_mib
    kv       the KV cache tokens vLLM logged ("GPU KV cache size: N tokens", engine_log.py) against
             [plan] kv_tokens
    decode   the selftest's one-stream decode tok/s against [plan] decode_tok_s (a bound: measured
             should be under it; a measured row: near it)

and what vLLM said of its own sizing at boot (engine_log.vllm_sizing), predicted or not:

    kv_tokens               its KV cache in tokens (beside [plan] kv_tokens where there is one)
    kv_cache_gib            the KV cache memory it said it has, GiB
    cuda_graph_gib          what its CUDA graphs took, GiB, with its own estimate (engine_estimate,
                            engine_estimate_error_pct) where it printed one
    suggested_kv_cache_gib  the --kv-cache-memory it suggests to fit the requested memory, GiB (bytes:
                            the flag's value; full_gpu_bytes: its value to fill the card)

Each row is {predicted, measured, error_pct, source}; measured None says why in `source`, predicted
None: the plan predicted nothing of it.
Pure: the caller hands in what it read.
"""

from __future__ import annotations

from typing import Any

from ..config import PlanSpec
from .engine_log import VllmSizing, vllm_sizing


def _error_pct(predicted: float | None, measured: float | None) -> float | None:
    return None if predicted is None or measured in (None, 0) else round((predicted - measured) / measured * 100, 2)


def _row(predicted: float | None, measured: float | None, source: str) -> dict[str, Any]:
    return {"predicted": predicted, "measured": measured, "error_pct": _error_pct(predicted, measured),
            "source": source}


def _sizing_rows(spec: PlanSpec, got: VllmSizing) -> dict[str, Any]:
    """The rows from vLLM's own sizing lines: kv_tokens when predicted or printed, the rest when printed."""
    rows: dict[str, Any] = {}
    if spec.kv_tokens or got.kv_tokens is not None:
        rows["kv_tokens"] = _row(spec.kv_tokens or None, got.kv_tokens, "the engine's own log" if got.kv_tokens
                                 is not None else "not measured: the engine's log has no KV cache size")
    if got.kv_cache_gib is not None:
        rows["kv_cache_gib"] = _row(None, got.kv_cache_gib, "the engine's own log" + (
            f", the least of {got.kv_cache_workers} workers" if got.kv_cache_workers > 1 else ""))
    if got.cuda_graph_gib is not None:
        if got.cuda_graph_estimate_gib is None:
            rows["cuda_graph_gib"] = _row(None, got.cuda_graph_gib, "the engine's own log (it printed no estimate)")
        else:
            rows["cuda_graph_gib"] = {**_row(None, got.cuda_graph_gib, "the engine's own log, beside its estimate"),
                                      "engine_estimate": got.cuda_graph_estimate_gib,
                                      "engine_estimate_error_pct": _error_pct(got.cuda_graph_estimate_gib,
                                                                              got.cuda_graph_gib)}
    if got.suggested_kv_cache_bytes is not None:
        rows["suggested_kv_cache_gib"] = {
            **_row(None, got.suggested_kv_cache_gib,
                   f"the engine's suggestion: --kv-cache-memory={got.suggested_kv_cache_bytes} to fit the requested "
                   f"memory, --kv-cache-memory={got.suggested_full_gpu_bytes} to fill the card"),
            "bytes": got.suggested_kv_cache_bytes, "full_gpu_bytes": got.suggested_full_gpu_bytes}
    return rows


def check(spec: PlanSpec, *, engine: str, gpu_used_mib: list[int] | None, engine_lines: list[str],
          decode_tok_s: float | None) -> dict[str, Any]:
    """The /status `plan` section: the plan as written, and one row per quantity it predicted."""
    rows: dict[str, Any] = {}
    if spec.card_mib:
        rows["card_mib"] = _row(spec.card_mib, max(gpu_used_mib) if gpu_used_mib else None,
                                "NVML, the fullest card" if gpu_used_mib else "not measured: no GPU seen")
    rows.update(_sizing_rows(spec, vllm_sizing(engine_lines)))
    if spec.decode_tok_s:
        source = (f"the selftest (predicted: {spec.basis or 'no basis given'})" if decode_tok_s
                  else "not measured: the selftest measured no decode")
        rows["decode_tok_s"] = _row(spec.decode_tok_s, decode_tok_s, source)
    return {"engine": engine, "gpu": spec.gpu, "cards": spec.cards, "checks": rows}
