"""Throughput worth quoting: decode on coherent prose, prefill on a long prompt, cold and warm.

Decode. The field notes' 7.3 tok/s headline came from selftests whose replies were repetition loops
("a repetition loop decodes cheap"); re-measured on 600 tokens of coherent prose it was 7.22.
So decode is measured on prose prompts, greedy, streamed; a degenerate reply is void and the
next prompt is tried until at least N tokens of non-degenerate output were timed. The client
times each reply from its first content chunk to its last (the tokens after the first: one a
chunk, or the usage's count when a chunk carries several, as under speculation) and holds
that against the engine's own count of the same steps: llama.cpp's `timings` (predicted_n - 1
steps in predicted_ms: the first token comes from the prompt pass), and the decode counters of
`/metrics` (llama.cpp's tokens_predicted_*, vLLM's generation_tokens / request_decode_time).

Prefill. 6-22-token prompts make "prefill tok/s" per-request overhead; the field notes measured it
on a 3408-token prompt: 167 tok/s cold, then 4 tokens reprocessed in 0.53 s warm. Cold here is
a fresh prompt (a nonce first) built in chunks under the wall limit (chunked.py); warm is the
same prompt sent again, which a server with a prompt cache answers by reprocessing a few tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import degeneracy
from .chunked import ChunkedPrefill, prefill_in_chunks
from .client import Client, ClientError
from .metrics import Counters

# Open prose questions that SmolLM2-135M answers without looping at temperature 0 (checked on
# the real model), and any larger model answers at length.
PROSE_PROMPTS = (
    "Write a detailed essay about the history of bread, from ancient Egypt to modern bakeries.",
    "Tell me about the history of the printing press.",
    "Explain why the sky is blue.",
    "What is the difference between weather and climate?",
    "Explain what a database index is.",
    "Explain photosynthesis to a curious student, step by step.",
    "Describe the water cycle in detail, from the ocean to the clouds and back.",
    "Explain how vaccines train the immune system.",
)
MIN_REPLY_TOKENS = 8            # fewer tokens than this time nothing but overhead
DECODE_SHARE_OF_WALL = 0.7      # a decode request aims at this share of the wall limit
# A floor's verdict may be taken before decode_tokens were timed (the gate: runner.py) once at least
# SETTLE_TOKENS were, at a rate SETTLE_MARGIN times the floor or more, or the floor over SETTLE_MARGIN
# or less. Single-stream decode drifts by a few percent over hundreds of tokens of prose (the field notes:
# 7.3 on loops, 7.22 re-measured on 600 tokens), nowhere near a factor of 1.5.
SETTLE_TOKENS = 64
SETTLE_MARGIN = 1.5


@dataclass
class DecodeSample:
    prompt: str
    chunks: int                          # content chunks streamed (llama.cpp: one per token)
    steps: int                           # tokens decoded within client_s (Reply.decode_steps)
    completion_tokens: int | None
    finish_reason: str | None
    client_s: float                      # first chunk -> last chunk
    engine_steps: int | None             # timings.predicted_n - 1
    engine_s: float | None               # timings.predicted_ms / 1000
    metrics: Counters | None             # /metrics delta over this request
    verdict: degeneracy.Degeneracy | None
    void: str | None = None
    text: str = ""

    @property
    def client_tok_s(self) -> float | None:
        return self.steps / self.client_s if self.steps > 0 and self.client_s > 0 else None

    @property
    def engine_tok_s(self) -> float | None:
        return self.engine_steps / self.engine_s if self.engine_steps and self.engine_s else None

    def to_dict(self) -> dict[str, Any]:
        return {"prompt": self.prompt[:60], "chunks": self.chunks, "steps": self.steps,
                "completion_tokens": self.completion_tokens,
                "finish_reason": self.finish_reason, "client_s": round(self.client_s, 4),
                "client_tok_s": _r(self.client_tok_s), "engine_tok_s": _r(self.engine_tok_s),
                "void": self.void, "degeneracy": self.verdict.to_dict() if self.verdict else None,
                "text": self.text[:200]}


@dataclass
class DecodeResult:
    target_tokens: int
    samples: list[DecodeSample] = field(default_factory=list)
    error: str | None = None
    settled: str | None = None           # why the floor's verdict was taken early (the gate)

    @property
    def valid(self) -> list[DecodeSample]:
        return [s for s in self.samples if s.void is None]

    @property
    def tokens(self) -> int:
        return sum(s.steps + 1 for s in self.valid if s.chunks)

    @property
    def client_tok_s(self) -> float | None:
        """The selftest's decode tok/s: decode steps over the client's own clock, valid replies."""
        steps = sum(s.steps for s in self.valid)
        secs = sum(s.client_s for s in self.valid)
        return steps / secs if steps > 0 and secs > 0 else None

    @property
    def engine_tok_s(self) -> float | None:
        """The same replies as llama.cpp's `timings` count them."""
        v = self.valid
        if not v or any(s.engine_steps is None or not s.engine_s for s in v):
            return None
        return sum(s.engine_steps or 0 for s in v) / sum(s.engine_s or 0.0 for s in v)

    @property
    def metrics_tok_s(self) -> float | None:
        """The same replies as the engine's /metrics count them (one first token per reply is
        produced by the prompt pass: excluded, as the timings do)."""
        v = self.valid
        if not v or any(s.metrics is None or s.metrics.decode_tokens is None or not s.metrics.decode_seconds
                        for s in v):
            return None
        tokens = sum((s.metrics.decode_tokens or 0) - 1 for s in v if s.metrics)
        secs = sum(s.metrics.decode_seconds or 0.0 for s in v if s.metrics)
        return tokens / secs if tokens > 0 and secs > 0 else None

    @property
    def enough(self) -> bool:
        return self.tokens >= self.target_tokens or self.settled is not None

    def settle(self, floor: float) -> None:
        """Take the floor's verdict now if the rate so far leaves no doubt (SETTLE_TOKENS, SETTLE_MARGIN)."""
        rate = self.client_tok_s
        if floor <= 0 or rate is None or self.tokens < SETTLE_TOKENS:
            return
        if rate >= floor * SETTLE_MARGIN or rate <= floor / SETTLE_MARGIN:
            self.settled = (f"{rate:.2f} tok/s on {self.tokens} tokens is {rate / floor:.2f}x the floor "
                            f"({floor:g}): settled before {self.target_tokens} tokens")

    @property
    def error_pct(self) -> float | None:
        """Client against engine (timings, else /metrics), in percent of the engine's."""
        ref = self.engine_tok_s or self.metrics_tok_s
        c = self.client_tok_s
        return (c - ref) / ref * 100.0 if c and ref else None

    def to_dict(self) -> dict[str, Any]:
        return {"target_tokens": self.target_tokens, "tokens": self.tokens, "enough": self.enough,
                "settled": self.settled,
                "client_tok_s": _r(self.client_tok_s), "engine_tok_s": _r(self.engine_tok_s),
                "metrics_tok_s": _r(self.metrics_tok_s), "error_pct": _r(self.error_pct),
                "error": self.error, "samples": [s.to_dict() for s in self.samples]}


def measure_decode(client: Client, target_tokens: int, *, wall_s: float, prompts: tuple[str, ...] = PROSE_PROMPTS,
                   params: dict[str, Any] | None = None, rate_hint: float | None = None,
                   remaining_s: Callable[[], float] | None = None, settle_floor: float = 0.0,
                   metrics: bool = True) -> DecodeResult:
    """Decode tok/s on >= target_tokens of non-degenerate streamed output (see the module doc).
    `settle_floor` > 0: stop as soon as that floor's verdict is settled (DecodeResult.settle), the
    first reply sized to settle it. `metrics`: also count the decode with the engine's /metrics
    (False where the reply's own `timings` already count it: llama.cpp)."""
    params = params or {}
    out = DecodeResult(target_tokens=target_tokens)
    rate = rate_hint
    for prompt in prompts:
        if out.enough:
            break
        need = target_tokens - out.tokens
        if settle_floor > 0 and out.tokens < SETTLE_TOKENS:
            need = min(need, SETTLE_TOKENS - out.tokens)
        cap = int(rate * wall_s * DECODE_SHARE_OF_WALL) if rate else 128
        max_tokens = max(MIN_REPLY_TOKENS * 2, min(need + 1, cap))
        timeout = wall_s if remaining_s is None else max(0.1, min(wall_s, remaining_s()))
        before = Counters.from_text(client.metrics() if metrics else None)
        try:
            r = client.chat([{"role": "user", "content": prompt}], max_tokens=max_tokens, stream=True,
                            timeout_s=timeout, **params)
        except ClientError as e:
            if e.kind == "cancelled":
                raise
            out.error = f"decode request failed: {e}"
            break
        after = Counters.from_text(client.metrics() if metrics else None)
        delta = after.minus(before) if before.decode_tokens is not None else None
        t = r.timings or {}
        pred_n, pred_ms = t.get("predicted_n"), t.get("predicted_ms")
        sample = DecodeSample(
            prompt=prompt, chunks=len(r.chunk_times), steps=r.decode_steps, completion_tokens=r.completion_tokens,
            finish_reason=r.finish_reason, client_s=r.decode_span_s,
            engine_steps=int(pred_n) - 1 if isinstance(pred_n, (int, float)) and pred_n > 1 else None,
            engine_s=pred_ms / 1000.0 if isinstance(pred_ms, (int, float)) and pred_ms > 0 else None,
            metrics=delta, verdict=degeneracy.check(r.text), text=r.text)
        if sample.verdict and sample.verdict.degenerate:
            sample.void = "degenerate: " + "; ".join(sample.verdict.reasons)
        elif sample.steps + 1 < MIN_REPLY_TOKENS:
            sample.void = f"only {sample.steps + 1} tokens"
        out.samples.append(sample)
        if sample.client_tok_s:
            rate = sample.client_tok_s
        out.settle(settle_floor)
    return out


@dataclass
class PrefillResult:
    target_tokens: int
    cold: ChunkedPrefill | None = None
    warm_wall_s: float | None = None
    warm_new_tokens: int | None = None
    warm_cached_tokens: int | None = None
    warm_engine_s: float | None = None
    error: str | None = None
    warm_skipped: str | None = None      # why the warm request was not sent (the gate: the chunks proved it)

    @property
    def cold_tok_s(self) -> float | None:
        return self.cold.rate() if self.cold and not self.cold.error else None

    @property
    def cold_engine_tok_s(self) -> float | None:
        return self.cold.rate(engine=True) if self.cold and not self.cold.error else None

    @property
    def warm_tok_s(self) -> float | None:
        """The whole prompt over the warm request's wall time (what a client sees)."""
        if self.cold and self.warm_wall_s:
            return self.cold.total_tokens / self.warm_wall_s
        return None

    @property
    def prefix_cache(self) -> bool | None:
        """Did the warm request reuse the prompt? (the field notes' Kimi-Linear on vLLM: ratio 1.04, no)"""
        if self.warm_cached_tokens is not None and self.cold and self.cold.total_tokens:
            return self.warm_cached_tokens >= 0.9 * self.cold.total_tokens
        if self.warm_skipped and self.cold is not None and self.cold.proven:
            return True                  # each chunk was served from the cached prefix of the one before
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"target_tokens": self.target_tokens, "cold_tok_s": _r(self.cold_tok_s),
                "cold_engine_tok_s": _r(self.cold_engine_tok_s), "warm_tok_s": _r(self.warm_tok_s),
                "warm_wall_s": _r(self.warm_wall_s, 4), "warm_new_tokens": self.warm_new_tokens,
                "warm_cached_tokens": self.warm_cached_tokens, "warm_engine_s": _r(self.warm_engine_s, 4),
                "prefix_cache": self.prefix_cache, "error": self.error, "warm_skipped": self.warm_skipped,
                "chunked": self.cold.to_dict() if self.cold else None}


def measure_prefill(client: Client, target_tokens: int, *, wall_s: float, params: dict[str, Any] | None = None,
                    nonce: str | None = None, safety: float | None = None,
                    remaining_s: Callable[[], float] | None = None, warm_unless_proven: bool = False) -> PrefillResult:
    """Cold prefill in chunks, then the same prompt warm. `warm_unless_proven` (the gate): no warm
    request when the chunks already proved the prefix cache (each one extended the one before)."""
    params = params or {}
    out = PrefillResult(target_tokens=target_tokens)
    kw: dict[str, Any] = {"safety": safety} if safety is not None else {}
    out.cold = prefill_in_chunks(client, target_tokens, wall_s, nonce=nonce or f"{time.time_ns():x}",
                                 params=params, remaining_s=remaining_s, **kw)
    if out.cold.error:
        out.error = out.cold.error
        return out
    if warm_unless_proven and out.cold.proven:
        out.warm_skipped = "the chunks proved the prefix cache: each was served from the one before"
        return out
    timeout = wall_s if remaining_s is None else max(0.1, min(wall_s, remaining_s()))
    try:
        r = client.complete(out.cold.prompt, max_tokens=1, timeout_s=timeout, **params)
    except ClientError as e:
        if e.kind == "cancelled":
            raise
        out.error = f"warm request: {e}"
        return out
    t = r.timings or {}
    out.warm_wall_s = r.wall_s
    out.warm_cached_tokens = r.cached_tokens
    new = t.get("prompt_n")
    if isinstance(new, (int, float)):
        out.warm_new_tokens = int(new)
    elif r.prompt_tokens is not None and r.cached_tokens is not None:
        out.warm_new_tokens = r.prompt_tokens - r.cached_tokens
    if isinstance(t.get("prompt_ms"), (int, float)):
        out.warm_engine_s = t["prompt_ms"] / 1000.0
    return out


def _r(v: float | None, nd: int = 2) -> float | None:
    return None if v is None else round(v, nd)
