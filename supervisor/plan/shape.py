"""What a model's memory depends on: weights per layer and per tensor kind, and which layers keep a
KV cache and how wide, from a GGUF header or from an hf:// repo's config.json (and its index).

GGUF (what llama.cpp counts): a tensor's bytes are the gap to the next tensor's offset, as
model/gguf_layout.py measures them (the data section is what llama.cpp maps as its model buffer,
alignment padding included). The cache per layer is llama.cpp's own rule (src/llama-hparams.cpp,
src/llama-kv-cache.cpp in the pinned sdist): K = key_length x head_count_kv(layer), V = value_length x
head_count_kv(layer); a layer with head_count_kv 0 keeps none (a recurrent KDA/Mamba layer: its state
does not grow with the context); an MLA model (`attention.key_length_mla` present) caches K only
(kv_lora_rank + rope) and reads V as a view of it.

config.json (what vLLM counts): full attention and GQA cache 2 x num_key_value_heads x head_dim per
layer; MLA (`kv_lora_rank`) caches kv_lora_rank + qk_rope_head_dim once; only the layers a hybrid
names keep one (Kimi-Linear's `linear_attn_config.full_attn_layers`, 1-indexed — field notes
§ "Kimi-Linear-48B-A3B on one A40"; `layer_types` entries other than linear/mamba).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import KilnError
from ..model.gguf_layout import FileHeader

KINDS = ("embeddings", "attention", "dense_ffn", "shared_experts", "routed_experts", "other")
_LAYER = re.compile(r"^blk\.(\d+)\.")


class ShapeError(KilnError):
    """A model's header or config lacks what the memory depends on."""


@dataclass(frozen=True)
class Shape:
    """Everything the memory model reads. Cache widths are elements per token per layer."""
    architecture: str
    n_layers: int
    cache_k: tuple[int, ...]                  # per layer; 0 = no growing cache there
    cache_v: tuple[int, ...]
    weights_by_kind: Mapping[str, int]
    layer_bytes: tuple[int, ...]              # blk.N's tensors, by N (empty when the source has no layout)
    host_input_bytes: int = 0                 # token_embd: llama.cpp keeps the input layer on the host
    hidden: int = 0
    vocab: int = 0
    n_ff: int = 0
    dtype_bytes: int = 2                      # the checkpoint's dtype (vLLM's kv-cache-dtype auto)
    experts: tuple[int, int] = (0, 0)         # routed experts per layer, of which used per token
    source: str = ""
    notes: tuple[str, ...] = field(default=())
    # The longest context the model was trained for, as its engine reads it (0: the source does not say),
    # and where that came from: the GGUF's <arch>.context_length (llama.cpp's n_ctx_train), or config.json's
    # length keys with RoPE scaling as vLLM derives its max_model_len (trained_context below).
    trained_ctx: int = 0
    trained_ctx_from: str = ""

    @property
    def weights_bytes(self) -> int:
        return sum(self.weights_by_kind.values())

    @property
    def active_bytes(self) -> int:
        """Weights read per decoded token: all but the routed experts a token does not use."""
        total, used = self.experts
        routed = self.weights_by_kind.get("routed_experts", 0)
        if not total or not routed:
            return self.weights_bytes
        return self.weights_bytes - routed + routed * used // total

    @property
    def cache_layers(self) -> int:
        return sum(1 for k, v in zip(self.cache_k, self.cache_v) if k or v)

    @property
    def cache_elements_per_token(self) -> int:
        return sum(self.cache_k) + sum(self.cache_v)


def tensor_kind(name: str) -> str:
    """Which of KINDS a GGUF tensor is (llama.cpp's tensor names, src/llama-arch.cpp)."""
    base = _LAYER.sub("", name)
    if name.startswith(("token_embd", "output.")) and not name.startswith("output_norm"):
        return "embeddings"
    if "_exps" in base or base.startswith(("exp_probs", "ffn_gate_inp")):
        return "routed_experts"
    if "_shexp" in base:
        return "shared_experts"
    if base.startswith(("attn_", "ssm_", "time_mix", "wkv")):
        return "attention"
    if base.startswith(("ffn_gate", "ffn_up", "ffn_down", "ffn_routed")):
        return "dense_ffn"
    return "other"


def _per_layer(value: Any, n: int, default: int) -> list[int]:
    if value is None:
        return [default] * n
    if isinstance(value, (tuple, list)):
        vals = [int(v) for v in value]
        if len(vals) != n:
            raise ShapeError(f"a per-layer value has {len(vals)} entries for {n} layers")
        return vals
    return [int(value)] * n


def from_gguf(headers: Iterable[FileHeader]) -> Shape:
    """A Shape from every shard's header (one FileHeader per file of a split model)."""
    headers = list(headers)
    if not headers:
        raise ShapeError("no GGUF header given")
    meta: dict[str, Any] = {}
    arrays: dict[str, Any] = {}
    for h in headers:
        for k, v in h.metadata.items():
            meta.setdefault(k, v)
        for k, a in h.arrays.items():
            arrays.setdefault(k, a.values)
    arch = str(meta.get("general.architecture", ""))

    def get(suffix: str) -> Any:
        key = f"{arch}.{suffix}"
        return meta[key] if key in meta else arrays.get(key)

    n_layers = get("block_count")
    n_embd = get("embedding_length")
    if n_layers is None or n_embd is None:
        raise ShapeError(f"GGUF of architecture {arch!r} has no {arch}.block_count / {arch}.embedding_length")
    n_layers, n_embd = int(n_layers), int(n_embd)
    n_head = _per_layer(get("attention.head_count"), n_layers, 1)
    n_head_kv = _per_layer(get("attention.head_count_kv"), n_layers, 0) if get("attention.head_count_kv") is not None \
        else list(n_head)
    head0 = max(n_head) or 1
    k_len = int(get("attention.key_length") or n_embd // head0)
    v_len = int(get("attention.value_length") or n_embd // head0)
    mla = get("attention.key_length_mla") is not None
    cache_k = tuple(k_len * h for h in n_head_kv)
    cache_v = tuple(0 if mla else v_len * h for h in n_head_kv)
    notes = []
    if get("attention.sliding_window") is not None:
        notes.append("sliding-window layers are counted as full attention (an upper bound)")

    by_kind = dict.fromkeys(KINDS, 0)
    layer_bytes = [0] * n_layers
    host_input = 0
    for h in headers:
        infos = sorted(h.tensors, key=lambda t: t.offset)
        end = h.size - h.data_start
        for i, t in enumerate(infos):
            size = (infos[i + 1].offset if i + 1 < len(infos) else end) - t.offset
            by_kind[tensor_kind(t.name)] += size
            m = _LAYER.match(t.name)
            if m and int(m.group(1)) < n_layers:
                layer_bytes[int(m.group(1))] += size
            elif t.name.startswith("token_embd"):
                host_input += size
    vocab = meta.get(f"{arch}.vocab_size") or next(
        (t.dims[1] for h in headers for t in h.tensors if t.name == "token_embd.weight" and len(t.dims) > 1), 0)
    n_ff = get("feed_forward_length")
    n_ff = max(n_ff) if isinstance(n_ff, (tuple, list)) else int(n_ff or 0)
    experts = (int(get("expert_count") or 0), int(get("expert_used_count") or 0))
    trained = get("context_length")
    return Shape(architecture=arch, n_layers=n_layers, cache_k=cache_k, cache_v=cache_v,
                 weights_by_kind=by_kind, layer_bytes=tuple(layer_bytes), host_input_bytes=host_input,
                 hidden=n_embd, vocab=int(vocab), n_ff=n_ff, experts=experts, source="gguf", notes=tuple(notes),
                 trained_ctx=int(trained) if isinstance(trained, int) and trained > 0 else 0,
                 trained_ctx_from=f"the GGUF's {arch}.context_length" if isinstance(trained, int) and trained > 0
                 else "")


# How vLLM derives a model's longest context from config.json (vLLM 0.32.0, vllm/transformers_utils/
# model_arch_config_convertor.py derive_max_model_len_and_key and vllm/config/model.py
# _get_and_verify_max_len): the smallest of these keys, model_max_length over them, then the RoPE scaling
# factor, except for the rope types whose max_position_embeddings is already scaled, and Gemma 3's.
_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
_PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def trained_context(cfg: Mapping[str, Any]) -> tuple[int, str]:
    """(the longest context vLLM accepts for this config, what it was read from); (0, "") when no key says."""
    text = cfg.get("text_config", cfg)
    found = [(int(text[k]), k) for k in _LENGTH_KEYS if isinstance(text.get(k), (int, float)) and text[k] > 0]
    if not found:
        return 0, ""
    length, key = min(found)
    if isinstance(text.get("model_max_length"), (int, float)) and text["model_max_length"] > 0:
        length, key = int(text["model_max_length"]), "model_max_length"
    rope = text.get("rope_parameters") or text.get("rope_scaling")
    if isinstance(rope, dict) and rope and all(isinstance(v, dict) for v in rope.values()):
        ropes = list(rope.values())             # one per layer type (full and sliding attention)
    else:
        ropes = [rope] if isinstance(rope, dict) else []
    why = f"config.json {key} {length:,}"
    if ropes and "gemma3" not in str(text.get("model_type", "")):
        factor = 1.0
        for r in ropes:
            kind = r.get("rope_type") or r.get("type")
            if kind not in _PRESCALED_ROPE and isinstance(r.get("factor"), (int, float)):
                factor = float(r["factor"])
        if factor != 1.0:
            length = int(length * factor)
            why += f" x RoPE scaling factor {factor:g}"
    return length, why


_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}
_NO_CACHE_TYPES = {"linear_attention", "mamba", "mamba2", "kda", "gated_delta_net"}


def cache_layers_of_config(cfg: Mapping[str, Any]) -> list[bool]:
    """Which layers keep a KV cache, by index, from a Hugging Face config.json."""
    n = int(cfg["num_hidden_layers"])
    linear = cfg.get("linear_attn_config") or {}
    if linear.get("full_attn_layers") is not None:
        full = {int(i) for i in linear["full_attn_layers"]}         # 1-indexed (Kimi-Linear: [..., 27] of 27)
        return [(i + 1) in full for i in range(n)]
    if cfg.get("layer_types"):
        types = list(cfg["layer_types"])
        if len(types) != n:
            raise ShapeError(f"config.json layer_types has {len(types)} entries for {n} layers")
        return [str(t) not in _NO_CACHE_TYPES for t in types]
    return [True] * n


def from_config(cfg: Mapping[str, Any], *, weights_bytes: int, weights_by_kind: Mapping[str, int] | None = None,
                source: str = "config.json") -> Shape:
    """A Shape from a Hugging Face config.json (the text config of a multimodal one) and the weights'
    size (the safetensors index's metadata.total_size, or the sum of the files' tensors)."""
    cfg = cfg.get("text_config", cfg)
    missing = [k for k in ("num_hidden_layers", "hidden_size") if k not in cfg]
    if missing:
        raise ShapeError(f"config.json has no {', '.join(missing)}: is it a causal language model's config?")
    n = int(cfg["num_hidden_layers"])
    hidden = int(cfg["hidden_size"])
    caching = cache_layers_of_config(cfg)
    if cfg.get("kv_lora_rank"):
        width_k, width_v = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim", 0)), 0
    else:
        heads = int(cfg.get("num_attention_heads") or 1)
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        width_k = width_v = kv_heads * head_dim
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    kinds = dict(weights_by_kind) if weights_by_kind else {"other": int(weights_bytes)}
    trained, trained_from = trained_context(cfg)
    return Shape(architecture=str(cfg.get("model_type", "")), n_layers=n,
                 cache_k=tuple(width_k if c else 0 for c in caching),
                 cache_v=tuple(width_v if c else 0 for c in caching),
                 weights_by_kind=kinds, layer_bytes=(), hidden=hidden, vocab=int(cfg.get("vocab_size") or 0),
                 n_ff=int(cfg.get("intermediate_size") or 0), dtype_bytes=_DTYPE_BYTES.get(dtype, 2), source=source,
                 experts=(int(cfg.get("num_experts") or cfg.get("n_routed_experts") or 0),
                          int(cfg.get("num_experts_per_tok") or cfg.get("num_experts_per_token") or 0)),
                 trained_ctx=trained, trained_ctx_from=trained_from)
