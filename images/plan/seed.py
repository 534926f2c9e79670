"""Facts the planner carries from the field notes' measurements, each with its source. Nothing here is a
guess: where the field notes give only a total (Kimi-K3's per-layer sizes), the shape says so in its notes.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.plan.shape import KINDS, Shape, from_config

GIB = 1 << 30
MIB = 1 << 20

# field notes § "Pods, models and engines": 2x A40, 2 x 46068 MiB
A40_BYTES = 46068 * MIB
A40_ID = "NVIDIA A40"
# field notes § "Host vCPU, not VRAM": what pods reported. RunPod's catalog lists no vCPU.
VCPU_BY_COUNT = {(A40_ID, 2): 16, (A40_ID, 5): 41}
# field notes § "Cost per million tokens": $0.44/h per A40
A40_USD_H = 0.44
# field notes § "Decode is serialisation-bound": 696 GB/s on the active card (A40)
BANDWIDTH_GB_S = {A40_ID: 696.0}


@dataclass(frozen=True)
class SpeedRow:
    """One measured row: aggregate decode tok/s at `streams` concurrent streams, for a model whose
    source names every string of `match` (case-insensitive)."""
    match: tuple[str, ...]
    engine: str
    gpu: str
    count: int
    resident: bool
    streams: int
    decode_tok_s: float
    prefill_tok_s: float | None
    source: str
    kv_tokens: int | None = None         # vLLM's KV cache as it said at boot (Kiln's measured rows), tokens
    kv_cache_gib: float | None = None    # and its memory, GiB


_QWEN = "field notes § \"Qwen3-Coder-30B-A3B on one A40\" (Qwen3-Coder-30B-A3B AWQ, vLLM 0.27.1, 1x A40)"
_KL = "field notes § \"Kimi-Linear-48B-A3B on one A40\" (Kimi-Linear-48B-A3B AWQ, vLLM 0.27.1, 1x A40)"
_K3_5 = "field notes § \"Kimi-K3 speed on A40s\" and § \"Decode is serialisation-bound\" (5x A40, all VRAM)"
_K3_2 = "field notes § \"Kimi-K3 speed on A40s\" (2x A40, autofit, partly on the host)"

SPEED_ROWS: tuple[SpeedRow, ...] = (
    *(SpeedRow(("qwen3-coder-30b-a3b", "awq"), "vllm", A40_ID, 1, True, s, agg, 3693.0, _QWEN)
      for s, agg in ((1, 77.6), (4, 265.3), (8, 496.8), (16, 782.4), (32, 1165.6))),
    *(SpeedRow(("kimi-linear-48b-a3b", "awq"), "vllm", A40_ID, 1, True, s, agg, 6162.0, _KL)
      for s, agg in ((1, 67.4), (4, 206.6), (8, 352.4), (16, 556.1), (32, 779.9))),
    *(SpeedRow(("kimi-k3", "iq1_s"), "llamacpp", A40_ID, 5, True, s, agg, 167.0, _K3_5)
      for s, agg in ((1, 7.35), (2, 9.85), (4, 14.53))),
    SpeedRow(("kimi-k3", "iq1_s"), "llamacpp", A40_ID, 2, False, 1, 2.94, None, _K3_2),
)

# -- the field notes' three models -----------------------------------------------------------------
# Kimi-Linear-48B-A3B-Instruct's config.json, the fields the memory depends on: layers, full-attention
# layers, kv_lora_rank and qk_rope_head_dim as field notes § "Kimi-Linear-48B-A3B on one A40" gives
# them; hidden_size 2304 and vocab_size 163840 as a public copy of the official config
# (Megatron-Bridge's Kimi-Linear test fixture, "the official Kimi-Linear-48B-A3B architecture") has them.
KIMI_LINEAR_CONFIG = {
    "model_type": "kimi_linear", "num_hidden_layers": 27, "hidden_size": 2304, "vocab_size": 163840,
    "num_attention_heads": 32, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16",
    "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27]},
}
# field notes § "Kimi-Linear-48B-A3B on one A40": cyankiwi/Kimi-Linear-48B-A3B-Instruct-AWQ-4bit, 28.4 GiB
KIMI_LINEAR_AWQ_BYTES = int(28.4 * GIB)
# field notes § "Kimi-Linear-48B-A3B on one A40": "GPU KV cache size: 1,416,566 tokens", at
# --gpu-memory-utilization 0.90
KIMI_LINEAR_KV_TOKENS = 1_416_566
KIMI_LINEAR_UTILIZATION = 0.90

# Qwen3-Coder-30B-A3B: 48 layers, 4 KV heads (Qwen's model card); head_dim 128, which field notes
# § "Cost per million tokens" confirms: "KV 12 GiB@256k" at fp8 = 262144 x 48 x 2 x 4 x 128 x 1 B.
QWEN3_CODER_CONFIG = {
    "model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "torch_dtype": "bfloat16",
}
# field notes § "Qwen3-Coder-30B-A3B on one A40": AWQ 4-bit (16.9 GiB)
QWEN3_CODER_AWQ_BYTES = int(16.9 * GIB)

# Kimi-K3 REAP448 Width50 UD-IQ1_S (field notes § "Pods, models and engines": 181 GiB;
# § "Long context on Kimi-K3": 93 layers, 24 of them MLA caching kv_lora_rank 512 + qk_rope_head_dim 64,
# the others KDA; `full_attn_layers` every 4th layer, and the last, as Kimi-Linear's). The field notes
# give only the total size: the layers share it evenly. Hidden width 3584 is the expert latent width of
# the field notes' MUL_MAT_ID shapes (§ "Host vCPU, not VRAM"); vocab as Kimi-Linear's.
K3_LAYERS = 93
K3_MLA_LAYERS = tuple(sorted({i for i in range(4, K3_LAYERS + 1, 4)} | {K3_LAYERS}))   # 1-indexed, 24 of them
K3_BYTES = 181 * GIB
K3_VOCAB = 163840


def kimi_k3_shape() -> Shape:
    mla = set(K3_MLA_LAYERS)
    k = tuple(512 + 64 if (i + 1) in mla else 0 for i in range(K3_LAYERS))
    per_layer = K3_BYTES // K3_LAYERS
    kinds = dict.fromkeys(KINDS, 0)
    kinds["other"] = per_layer * K3_LAYERS
    return Shape(architecture="kimi-k3", n_layers=K3_LAYERS, cache_k=k, cache_v=(0,) * K3_LAYERS,
                 weights_by_kind=kinds, layer_bytes=(per_layer,) * K3_LAYERS, hidden=3584, vocab=K3_VOCAB,
                 n_ff=1536, source="field notes",
                 notes=("per-layer sizes: the field notes' 181 GiB spread evenly over 93 layers",))


def kimi_linear_shape() -> Shape:
    return from_config(KIMI_LINEAR_CONFIG, weights_bytes=KIMI_LINEAR_AWQ_BYTES, source="field notes")


def qwen3_coder_shape() -> Shape:
    return from_config(QWEN3_CODER_CONFIG, weights_bytes=QWEN3_CODER_AWQ_BYTES, source="field notes")
