"""P18 as a test (issue 39): the plan's memory arithmetic against the field notes' figures (docs/field-notes.md),
within 15 %, and every fit/no-fit decision the field notes measured right."""

from __future__ import annotations

from images.plan import seed
from supervisor.plan import fit, memory

GOAL_PCT = 15.0


def _pct(pred, real):
    return abs(pred - real) / real * 100


def _k3(ctx, n):
    k3 = seed.kimi_k3_shape()
    return fit.llamacpp(k3, memory.llamacpp(k3, ctx), count=n, card_bytes=seed.A40_BYTES)


def test_kimi_linear_kv_tokens_on_one_a40():
    toks = memory.vllm_kv_tokens(seed.kimi_linear_shape(), card_bytes=seed.A40_BYTES, utilization=0.90)
    assert _pct(toks, seed.KIMI_LINEAR_KV_TOKENS) <= GOAL_PCT, toks


def test_kv_per_token_is_the_seeds_arithmetic():
    # field notes § "Kimi-Linear-48B-A3B on one A40": 7 x (512 + 64) x 2 = 7.88 KB;
    # § "Long context on Kimi-K3": 24 x ... = 27.6 KB
    assert memory.kv_bytes_per_token(seed.kimi_linear_shape(), "vllm", "auto") == 7 * 576 * 2
    assert memory.kv_bytes_per_token(seed.kimi_k3_shape(), "llamacpp", "f16") == 24 * 576 * 2
    # field notes § "Cost per million tokens": Qwen3-Coder-30B-A3B "KV 12 GiB@256k" (fp8)
    assert memory.kv_bytes_per_token(seed.qwen3_coder_shape(), "vllm", "fp8") * 262144 == 12 * 2**30


def test_kimi_k3_fits_five_a40_at_524288_and_not_at_1048576():
    assert _k3(524288, 5).resident
    at_1m = _k3(1048576, 5)
    assert not at_1m.resident and at_1m.why


def test_kimi_k3_on_two_a40_is_offloaded_and_fills_them_as_autofit_did():
    p = _k3(16384, 2)
    assert not p.resident and len(p.host_layers) > 0
    assert _pct(sum(p.per_card_bytes) / 1e9, 87.7) <= GOAL_PCT          # field notes: static VRAM 87.7 GB


def test_kimi_k3_memory_per_card_at_262144_on_five_a40():
    p = _k3(262144, 5)
    assert p.resident
    assert _pct(sum(p.per_card_bytes) / 5 / 1e9, 41.0) <= GOAL_PCT        # field notes: 39.5-42.5 GB per card


def test_kimi_k3_ranks_five_a40_resident_above_two_a40_offloaded():
    from images.plan import rank
    from kiln_dev.runpod.api import gpu_type

    plans = rank.plans(seed.kimi_k3_shape(), "mmnga-o/Kimi-K3-REAP50-Width50-UD-gguf/UD-IQ1_S", {"source": "hf://x"},
                       [gpu_type(seed.A40_ID)], engine="llamacpp", ctx=262144, streams=1, kv_type="f16", targets={})
    order = [(p.count, p.resident) for p in plans]
    assert order[0] == (5, True)
    assert order.index((2, False)) > 0
    two = next(p for p in plans if p.count == 2)
    # At one stream the two cost the same per token (field notes: ~85 $/1M either way); residency decides the rank.
    assert "measured" in two.speed.basis and two.speed.decode_1 < plans[0].speed.decode_1
