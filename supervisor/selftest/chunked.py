"""Long prompts built in chunks, so that no single request outlives the proxy in front of the pod.

RunPod's HTTP proxy sits behind Cloudflare and cuts a request at ~125 s (`error code: 524`);
the field notes' cold 38k-token prefill took ~230 s. The workaround they used: send the prompt in
growing prefixes, each request extending what the server already has in its prompt cache,
so each one only processes the new part. This module does that, sizing each chunk from the
prefill rate just measured so the next request stays well inside the wall limit, and proves
the extension with the server's own counts: llama.cpp reports `timings.cache_n` (tokens
taken from the cache) and `timings.prompt_n` (tokens processed) on every reply; OpenAI-style
servers may report `usage.prompt_tokens_details.cached_tokens`. Chunk k extended the prefix
when its cached count reaches the whole prompt of chunk k-1.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable

from .client import Client, ClientError

# Boundary re-tokenisation may shift a token or two where a chunk was cut; llama.cpp measured
# cache_n == the previous prompt_tokens exactly (SmolLM2, llama-server 11434).
EXTEND_SLACK_TOKENS = 4
FIRST_CHUNK_TOKENS = 128
GROWTH = 4.0            # a chunk is at most this many times the one before (rate estimates are noisy)
SAFETY = 0.5            # aim each request at this share of the wall limit (prefill slows as context grows)

_WORDS = ("amber basin cedar delta ember fjord granite harbor island juniper kestrel lagoon meadow "
          "nectar orchard prairie quarry river summit tundra upland valley willow yarrow zephyr "
          "anchor beacon canyon dune estuary forest glacier heath inlet jetty knoll ledge marsh "
          "north ocean pebble quay reef shoal tide umber vista wharf").split()


def filler(n_lines: int, nonce: str) -> list[str]:
    """Deterministic lines of varied words; the nonce first, so no earlier prompt shares a
    prefix with it (a cold measurement must start from an empty cache)."""
    rng = random.Random(nonce)
    lines = [f"Survey log {nonce}. Each entry lists what the field team recorded that day.\n"]
    for i in range(1, n_lines):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(10, 18)))
        lines.append(f"Entry {i}: {words}.\n")
    return lines


@dataclass
class Chunk:
    index: int
    prompt_tokens: int                  # the whole prompt sent, as the server counted it
    new_tokens: int | None              # processed this time (timings.prompt_n, else prompt - cached)
    cached_tokens: int | None           # taken from the prompt cache
    wall_s: float                       # this request, as the client timed it
    engine_s: float | None              # timings.prompt_ms / 1000 (llama.cpp)
    extends_prefix: bool | None         # cached >= the previous prompt (None: the server does not say)

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "prompt_tokens": self.prompt_tokens, "new_tokens": self.new_tokens,
                "cached_tokens": self.cached_tokens, "wall_s": round(self.wall_s, 4),
                "engine_s": None if self.engine_s is None else round(self.engine_s, 4),
                "extends_prefix": self.extends_prefix}


@dataclass
class ChunkedPrefill:
    wall_limit_s: float
    chunks: list[Chunk] = field(default_factory=list)
    prompt: str = ""
    error: str | None = None
    context_exceeded: bool = False

    @property
    def total_tokens(self) -> int:
        return self.chunks[-1].prompt_tokens if self.chunks else 0

    @property
    def max_request_s(self) -> float:
        return max((c.wall_s for c in self.chunks), default=0.0)

    @property
    def proven(self) -> bool | None:
        """Every chunk after the first extended the cached prefix (None: the server never said)."""
        later = [c.extends_prefix for c in self.chunks[1:]]
        if not later or any(x is None for x in later):
            return None
        return all(later)

    def rate(self, engine: bool = False) -> float | None:
        """Cold prefill tok/s over every chunk: tokens processed / time (client wall or engine's)."""
        tokens = sum(c.new_tokens or 0 for c in self.chunks)
        secs = sum((c.engine_s or 0.0) if engine else c.wall_s for c in self.chunks)
        if engine and any(c.engine_s is None for c in self.chunks):
            return None
        return tokens / secs if tokens and secs > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {"wall_limit_s": self.wall_limit_s, "total_tokens": self.total_tokens,
                "chunks": [c.to_dict() for c in self.chunks], "max_request_s": round(self.max_request_s, 4),
                "prefix_extended": self.proven, "error": self.error,
                "context_exceeded": self.context_exceeded}


def send(client: Client, prompt: str, timeout_s: float, params: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """One prefill request: the prompt, one token back (the shortest reply every server allows)."""
    r = client.complete(prompt, max_tokens=1, timeout_s=timeout_s, **params)
    return r, {"prompt_tokens": r.prompt_tokens, "cached": r.cached_tokens,
               "new": (r.timings or {}).get("prompt_n"), "engine_ms": (r.timings or {}).get("prompt_ms")}


def prefill_in_chunks(client: Client, target_tokens: int, wall_s: float, *, nonce: str,
                      params: dict[str, Any] | None = None, safety: float = SAFETY,
                      first_tokens: int = FIRST_CHUNK_TOKENS,
                      remaining_s: Callable[[], float] | None = None) -> ChunkedPrefill:
    """Grow one prompt to >= target_tokens, no request longer than wall_s; see the module doc."""
    params = params or {}
    out = ChunkedPrefill(wall_limit_s=wall_s)
    lines = filler(max(64, target_tokens // 4), nonce)        # ~10+ tokens a line: plenty
    ends: list[int] = []
    pos = 0
    for line in lines:
        pos += len(line)
        ends.append(pos)
    text = "".join(lines)
    chars_per_token = 4.0
    chunk_tokens = float(min(first_tokens, target_tokens))
    cut = 0
    prev_tokens = 0
    while prev_tokens < target_tokens:
        want_chars = cut + max(1, int(chunk_tokens * chars_per_token))
        # cut after a whole line so every prompt is a prefix of the next, token for token
        nxt = next((e for e in ends if e >= want_chars), ends[-1])
        if nxt <= cut:
            out.error = f"ran out of filler text at {prev_tokens} tokens"
            break
        cut = nxt
        timeout = wall_s if remaining_s is None else max(0.1, min(wall_s, remaining_s()))
        try:
            r, seen = send(client, text[:cut], timeout, params)
        except ClientError as e:
            if e.kind == "timeout":
                out.error = (f"chunk {len(out.chunks) + 1} ({cut} chars) got no reply within "
                             f"{timeout:.1f} s (wall limit {wall_s:.1f} s)")
            else:
                out.error = f"chunk {len(out.chunks) + 1}: {e}"
                out.context_exceeded = e.context_exceeded
            if e.kind == "cancelled":
                raise
            break
        total = seen["prompt_tokens"] or 0
        cached = seen["cached"]
        new = seen["new"] if isinstance(seen["new"], (int, float)) else (
            total - cached if cached is not None else total - prev_tokens)
        engine_s = seen["engine_ms"] / 1000.0 if isinstance(seen["engine_ms"], (int, float)) else None
        extends = None if not out.chunks or cached is None else cached >= prev_tokens - EXTEND_SLACK_TOKENS
        out.chunks.append(Chunk(index=len(out.chunks), prompt_tokens=total, new_tokens=int(new),
                                cached_tokens=cached, wall_s=r.wall_s, engine_s=engine_s, extends_prefix=extends))
        if total <= prev_tokens:
            out.error = "the prompt stopped growing (the server counts no new tokens)"
            break
        chars_per_token = cut / total
        rate = new / r.wall_s if r.wall_s > 0 and new > 0 else None
        planned = rate * wall_s * safety if rate else chunk_tokens * GROWTH
        chunk_tokens = max(16.0, min(planned, chunk_tokens * GROWTH, float(target_tokens - total)))
        prev_tokens = total
    out.prompt = text[:cut]
    return out
