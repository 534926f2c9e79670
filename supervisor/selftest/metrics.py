"""The engine's own counters from Prometheus text: decode tokens and seconds, prefill tokens,
and speculative-decoding drafts and acceptances, for llama.cpp and vLLM.

Names are the engines' own, checked against real output: llama-server 11434 with --metrics
(`llamacpp:` prefix; tests/fixtures/selftest/llamacpp-11434-metrics.txt) and vLLM 0.27.1's
metrics logger (tests/fixtures/engine-logs/vllm-0.27.1-metrics-format-sample.txt). A counter
that is absent stays None: "not exposed" is not zero.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")

# field -> metric names, first found wins (llama.cpp, then vLLM); summed over label sets.
NAMES: dict[str, tuple[str, ...]] = {
    "decode_tokens": ("llamacpp:tokens_predicted_total", "vllm:generation_tokens_total"),
    # llama.cpp: the sum of every slot's generation time; vLLM: the decode phase of every request
    "decode_seconds": ("llamacpp:tokens_predicted_seconds_total", "vllm:request_decode_time_seconds_sum"),
    "prompt_tokens": ("llamacpp:prompt_tokens_total", "vllm:prompt_tokens_total"),
    "prompt_seconds": ("llamacpp:prompt_seconds_total", "vllm:request_prefill_time_seconds_sum"),
    "prompt_tokens_cached": ("llamacpp:prompt_tokens_cached_total", "vllm:prompt_tokens_cached_total"),
    "spec_drafts": ("llamacpp:spec_decode_num_drafts_total", "vllm:spec_decode_num_drafts_total"),
    "spec_draft_tokens": ("llamacpp:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_draft_tokens_total"),
    "spec_accepted_tokens": ("llamacpp:spec_decode_num_accepted_tokens_total",
                             "vllm:spec_decode_num_accepted_tokens_total"),
}


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text format -> {name: [(labels, value), ...]}; comments and junk skipped."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group("labels") or ""))
        out.setdefault(m.group("name"), []).append((labels, value))
    return out


@dataclass(frozen=True)
class Counters:
    decode_tokens: float | None = None
    decode_seconds: float | None = None
    prompt_tokens: float | None = None
    prompt_seconds: float | None = None
    prompt_tokens_cached: float | None = None
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None

    @classmethod
    def from_text(cls, text: str | None) -> "Counters":
        if not text:
            return cls()
        samples = parse(text)
        values: dict[str, float | None] = {}
        for f, names in NAMES.items():
            values[f] = None
            for name in names:
                if name in samples:
                    values[f] = sum(v for _, v in samples[name] if math.isfinite(v))
                    break
        return cls(**values)

    def minus(self, before: "Counters") -> "Counters":
        """What happened between two scrapes (None where either lacks the counter)."""
        d: dict[str, Any] = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(before, f.name)
            d[f.name] = None if a is None or b is None else a - b
        return Counters(**d)

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens over summed per-request decode time: a per-stream rate, as the engine saw it."""
        if self.decode_tokens and self.decode_seconds:
            return self.decode_tokens / self.decode_seconds
        return None

    @property
    def spec_acceptance(self) -> float | None:
        """Accepted / drafted tokens; None when the engine exposes no counters or drafted none."""
        if self.spec_draft_tokens and self.spec_accepted_tokens is not None:
            return self.spec_accepted_tokens / self.spec_draft_tokens
        return None

    def to_dict(self) -> dict[str, float | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
