"""The plan checks itself after boot: what `build.py plan` predicted ([plan] in the deploy config)
beside what this pod measured, once the selftest has run.

    memory   the fullest card's used MiB from NVML (host/hardware.py) against [plan] card_mib
    kv       the KV cache tokens vLLM logged ("GPU KV cache size: N tokens", engine_log.py) against
             [plan] kv_tokens
    decode   the selftest's one-stream decode tok/s against [plan] decode_tok_s (a bound: measured
             should be under it; a measured row: near it)

Each row is {predicted, measured, error_pct, source}; measured None says why in `source`.
Pure: the caller hands in what it read.
"""

from __future__ import annotations

from typing import Any

from ..config import PlanSpec
from .engine_log import vllm_kv_tokens


def _row(predicted: float, measured: float | None, source: str) -> dict[str, Any]:
    error = None if measured in (None, 0) else round((predicted - measured) / measured * 100, 2)
    return {"predicted": predicted, "measured": measured, "error_pct": error, "source": source}


def check(spec: PlanSpec, *, engine: str, gpu_used_mib: list[int] | None, engine_lines: list[str],
          decode_tok_s: float | None) -> dict[str, Any]:
    """The /status `plan` section: the plan as written, and one row per quantity it predicted."""
    rows: dict[str, Any] = {}
    if spec.card_mib:
        rows["card_mib"] = _row(spec.card_mib, max(gpu_used_mib) if gpu_used_mib else None,
                                "NVML, the fullest card" if gpu_used_mib else "not measured: no GPU seen")
    if spec.kv_tokens:
        got = vllm_kv_tokens("\n".join(engine_lines))
        rows["kv_tokens"] = _row(spec.kv_tokens, got, "the engine's own log" if got is not None
                                 else "not measured: the engine's log has no KV cache size")
    if spec.decode_tok_s:
        source = (f"the selftest (predicted: {spec.basis or 'no basis given'})" if decode_tok_s
                  else "not measured: the selftest measured no decode")
        rows["decode_tok_s"] = _row(spec.decode_tok_s, decode_tok_s, source)
    return {"engine": engine, "gpu": spec.gpu, "cards": spec.cards, "checks": rows}
