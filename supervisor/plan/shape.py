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

What is read is checked before any of it is counted: a count that is no integer or out of range (layers
1..100,000, widths at least 1, head counts and vocabulary at least 0), a per-layer array of another length,
more experts used than a layer has, tensor data past a file's end (truncated), a split set whose shards
disagree. Each is a ShapeError naming the field, the value and what is wrong: no Shape, so no plan.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import KilnError
from ..model.gguf_layout import FileHeader

KINDS = ("embeddings", "attention", "dense_ffn", "shared_experts", "routed_experts", "other")
_LAYER = re.compile(r"^blk\.(\d+)\.")
MAX_LAYERS = 100_000        # no model has more; a count past it is a corrupt or hostile header


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


_HF_ROUTED = re.compile(r"(^|\.)(experts|block_sparse_moe\.experts|moe\.experts)(\.|$)")


def hf_tensor_kind(name: str) -> str:
    """Which of KINDS a Hugging Face checkpoint's tensor is, by its module path (a quantized module's
    qweight, scales and zeros go with it): `mlp.experts.N.*` (or stacked `mlp.experts.*`) are routed
    experts, `shared_expert(s)` shared ones, the router and everything unnamed `other`."""
    low = name.lower()
    if any(e in low for e in ("embed_tokens", "lm_head", "word_embeddings", "wte.", "embeddings.")):
        return "embeddings"
    if "shared_expert" in low:
        return "shared_experts"
    if _HF_ROUTED.search(low):
        return "routed_experts"
    if any(a in low for a in ("self_attn", ".attention.", ".attn.", "linear_attn", ".mixer.")):
        return "attention"
    if ".mlp." in low or ".feed_forward." in low:
        return "other" if low.endswith(("mlp.gate.weight", ".router.weight")) else "dense_ffn"
    return "other"


def shown(value: Any) -> str:
    """A value read from a file, for a one-line message: as JSON ("abc", null, -1), cut short."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def checked_int(where: str, value: Any, lo: int, hi: int | None = None) -> int:
    """`value` as an integer in lo..hi (an integral float counts; a bool, a string, null do not), or a
    ShapeError naming `where` and the value: "num_hidden_layers \"abc\": not an integer"."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        raise ShapeError(f"{where} {shown(value)}: not an integer")
    n = int(value)
    if n < lo or (hi is not None and n > hi):
        bound = f"between {lo:,} and {hi:,}" if hi is not None else f"at least {lo:,}"
        raise ShapeError(f"{where} {shown(value)}: must be {bound}")
    return n


def _per_layer(where: str, value: Any, n: int, default: int) -> list[int]:
    """A per-layer count (non-negative): one value for every layer, or an array of n."""
    if value is None:
        return [default] * n
    if isinstance(value, (tuple, list)):
        if len(value) != n:
            raise ShapeError(f"{where} {shown(list(value))}: {len(value)} entries for {n} layers")
        return [checked_int(f"{where}[{i}]", v, 0) for i, v in enumerate(value)]
    return [checked_int(where, value, 0)] * n


def _past_end(headers: list[FileHeader]) -> None:
    """No shape from a file whose tensors do not fit in it: a header's tensor data that ends past the
    file's size is a truncated file (an interrupted download or copy), whatever the rest says."""
    for h in headers:
        past = h.past_end()
        if past:
            t = min(past, key=lambda t: t.offset)
            where = f"{h.path.name}: " if len(headers) > 1 else ""
            raise ShapeError(f"{where}tensor {t.name!r} ends at byte {h.tensor_end(t):,}, past the end of the file "
                             f"({h.size:,} bytes; {len(past)} tensor(s) past it): the file is truncated (an "
                             "interrupted download or copy?): download it again")


def _split_counts(headers: list[FileHeader], meta: Mapping[str, Any]) -> None:
    """A split set is whole: split.count shards, split.tensors.count tensors among them."""
    count, tensors = meta.get("split.count"), meta.get("split.tensors.count")
    found = sum(len(h.tensors) for h in headers)
    if count is not None and (len(headers) > 1 or checked_int("split.count", count, 0) > 1):
        if checked_int("split.count", count, 1) != len(headers):
            raise ShapeError(f"split.count {shown(count)}: the file names say {len(headers)} shard(s) "
                             "(keep the shards' names as published)")
        if tensors is not None and checked_int("split.tensors.count", tensors, 0) != found:
            raise ShapeError(f"split.tensors.count {shown(tensors)}: the {len(headers)} shards hold {found} "
                             "tensors (a shard of another model, or of another quantization?): download them again")


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
    if not arch:
        raise ShapeError("general.architecture: missing from the header (not a model's GGUF?)")
    _past_end(headers)
    _split_counts(headers, meta)

    def get(suffix: str) -> Any:
        key = f"{arch}.{suffix}"
        return meta[key] if key in meta else arrays.get(key)

    def count(suffix: str, lo: int, default: int | None = None) -> int:
        value = get(suffix)
        if value is None:
            if default is None:
                raise ShapeError(f"{arch}.{suffix}: missing from the header (GGUF of architecture {arch!r})")
            return default
        return checked_int(f"{arch}.{suffix}", value, lo)

    # Every layer has tensors: a block_count past the file's tensor count is no model (and 10^9 layers
    # were ten lists of 10^9 entries: a MemoryError). A file without tensors is refused by its caller.
    raw_layers, n_tensors = get("block_count"), sum(len(h.tensors) for h in headers)
    if isinstance(raw_layers, int) and not isinstance(raw_layers, bool) and 0 < n_tensors < raw_layers:
        raise ShapeError(f"{arch}.block_count {raw_layers}: more layers than the file has tensors for "
                         f"({n_tensors} tensors)")
    if raw_layers is None:
        raise ShapeError(f"{arch}.block_count: missing from the header (GGUF of architecture {arch!r})")
    n_layers = checked_int(f"{arch}.block_count", raw_layers, 1, MAX_LAYERS)
    n_embd = count("embedding_length", 1)
    n_head = _per_layer(f"{arch}.attention.head_count", get("attention.head_count"), n_layers, 1)
    n_head_kv = _per_layer(f"{arch}.attention.head_count_kv", get("attention.head_count_kv"), n_layers, 0) \
        if get("attention.head_count_kv") is not None else list(n_head)
    head0 = max(n_head) or 1
    k_len = count("attention.key_length", 0, 0) or n_embd // head0          # 0: not said (llama.cpp's default)
    v_len = count("attention.value_length", 0, 0) or n_embd // head0
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
    vocab = count("vocab_size", 0, 0) or next(
        (t.dims[1] for h in headers for t in h.tensors if t.name == "token_embd.weight" and len(t.dims) > 1), 0)
    n_ff = max(_per_layer(f"{arch}.feed_forward_length", get("feed_forward_length"), n_layers, 0), default=0)
    experts = (count("expert_count", 0, 0), count("expert_used_count", 0, 0))
    if experts[1] > experts[0]:                         # llama.cpp asserts n_expert_used <= n_expert
        raise ShapeError(f"{arch}.expert_used_count {experts[1]}: more than {arch}.expert_count {experts[0]} "
                         "(a token cannot use more experts than a layer has)")
    trained = count("context_length", 0, 0)            # 0: the header does not say
    return Shape(architecture=arch, n_layers=n_layers, cache_k=cache_k, cache_v=cache_v,
                 weights_by_kind=by_kind, layer_bytes=tuple(layer_bytes), host_input_bytes=host_input,
                 hidden=n_embd, vocab=int(vocab), n_ff=n_ff, experts=experts, source="gguf", notes=tuple(notes),
                 trained_ctx=trained, trained_ctx_from=f"the GGUF's {arch}.context_length" if trained else "")


# How vLLM derives a model's longest context from config.json (vLLM 0.32.0, vllm/transformers_utils/
# model_arch_config_convertor.py derive_max_model_len_and_key and vllm/config/model.py
# _get_and_verify_max_len): the smallest of these keys, model_max_length over them, then the RoPE scaling
# factor, except for the rope types whose max_position_embeddings is already scaled, and Gemma 3's.
_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
_PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def trained_context(cfg: Mapping[str, Any]) -> tuple[int, str]:
    """(the longest context vLLM accepts for this config, what it was read from); (0, "") when no key says.
    A length or RoPE factor that is no number is a ShapeError naming it (it was an OverflowError, or a
    negative context planned)."""
    text, pre = config_text(cfg)

    def length_of(k: str) -> int:
        value = text.get(k)
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ShapeError(f"config.json: {pre}{k} {shown(value)}: not an integer")
        return int(value) if value > 0 else 0          # 0 or less: says nothing (as before)

    found = [(n, k) for k in _LENGTH_KEYS if (n := length_of(k)) > 0]
    if not found:
        return 0, ""
    length, key = min(found)
    if length_of("model_max_length") > 0:
        length, key = length_of("model_max_length"), "model_max_length"
    rope_key = "rope_parameters" if text.get("rope_parameters") else "rope_scaling"
    rope = text.get(rope_key)
    if isinstance(rope, dict) and rope and all(isinstance(v, dict) for v in rope.values()):
        ropes = [(f"{rope_key}.{k}", v) for k, v in rope.items()]     # one per layer type (full and sliding attention)
    else:
        ropes = [(rope_key, rope)] if isinstance(rope, dict) else []
    why = f"config.json {key} {length:,}"
    if ropes and "gemma3" not in str(text.get("model_type", "")):
        factor = 1.0
        for where, r in ropes:
            kind = r.get("rope_type") or r.get("type")
            if kind not in _PRESCALED_ROPE and r.get("factor") is not None:
                f = r["factor"]
                if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f <= 0:
                    raise ShapeError(f"config.json: {pre}{where}.factor {shown(f)}: must be more than 0 (a number "
                                     "the trained context is scaled by)")
                factor = float(f)
        if factor != 1.0:
            length = int(length * factor)
            why += f" x RoPE scaling factor {factor:g}"
    return length, why


_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}
_NO_CACHE_TYPES = {"linear_attention", "mamba", "mamba2", "kda", "gated_delta_net"}


def json_kind(value: Any) -> str:
    """What a JSON value is, for "not a JSON object (an array)"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def config_text(cfg: Any) -> tuple[Mapping[str, Any], str]:
    """A config.json's text model config (a multimodal one's text_config), and the prefix its fields are
    named with ("text_config." or "")."""
    if not isinstance(cfg, Mapping):
        raise ShapeError(f"config.json: not a JSON object ({json_kind(cfg)})")
    text = cfg.get("text_config")
    if text is None:
        return cfg, ""
    if not isinstance(text, Mapping):
        raise ShapeError(f"config.json: text_config {shown(text)}: not a JSON object")
    return text, "text_config."


def cache_layers_of_config(cfg: Mapping[str, Any], *, prefix: str = "") -> list[bool]:
    """Which layers keep a KV cache, by index, from a Hugging Face config.json (its text config; `prefix`
    names where that sits in the file, for the messages)."""
    n = checked_int(f"config.json: {prefix}num_hidden_layers", cfg.get("num_hidden_layers"), 1, MAX_LAYERS)
    linear = cfg.get("linear_attn_config")
    if linear is not None and not isinstance(linear, Mapping):
        raise ShapeError(f"config.json: {prefix}linear_attn_config {shown(linear)}: not a JSON object")
    full_layers = (linear or {}).get("full_attn_layers")
    if full_layers is not None:
        where = f"config.json: {prefix}linear_attn_config.full_attn_layers"
        if not isinstance(full_layers, list):
            raise ShapeError(f"{where} {shown(full_layers)}: not a list")
        # 1-indexed (Kimi-Linear: [..., 27] of 27)
        full = {checked_int(f"{where}[{j}]", i, 1, n) for j, i in enumerate(full_layers)}
        return [(i + 1) in full for i in range(n)]
    types = cfg.get("layer_types")
    if types:
        if not isinstance(types, list):
            raise ShapeError(f"config.json: {prefix}layer_types {shown(types)}: not a list")
        if len(types) != n:
            raise ShapeError(f"config.json: {prefix}layer_types: {len(types)} entries for {n} layers")
        return [str(t) not in _NO_CACHE_TYPES for t in types]
    return [True] * n


def from_config(cfg: Mapping[str, Any], *, weights_bytes: int, weights_by_kind: Mapping[str, int] | None = None,
                source: str = "config.json") -> Shape:
    """A Shape from a Hugging Face config.json (the text config of a multimodal one) and the weights'
    size (the safetensors index's metadata.total_size, or the sum of the files' tensors). Every count it
    reads is checked: a ShapeError names the field, the value and what is wrong."""
    text, pre = config_text(cfg)

    def required(key: str, lo: int, hi: int | None = None) -> int:
        if key not in text:
            raise ShapeError(f"config.json: {pre}{key}: missing (is it a causal language model's config?)")
        return checked_int(f"config.json: {pre}{key}", text[key], lo, hi)

    def optional(key: str, lo: int, default: int) -> int:           # absent or null: the default
        value = text.get(key)
        if isinstance(value, list):                                 # per layer (intermediate_size of some)
            return max((checked_int(f"config.json: {pre}{key}[{i}]", v, lo) for i, v in enumerate(value)),
                       default=default)
        return default if value is None else checked_int(f"config.json: {pre}{key}", value, lo)

    def first(*keys: str) -> tuple[int, str]:                        # the first key that says (not 0)
        for key in keys:
            n = optional(key, 0, 0)
            if n:
                return n, key
        return 0, keys[0]

    n = required("num_hidden_layers", 1, MAX_LAYERS)
    hidden = required("hidden_size", 1)
    caching = cache_layers_of_config(text, prefix=pre)
    kv_lora = optional("kv_lora_rank", 0, 0)
    if kv_lora:
        width_k, width_v = kv_lora + optional("qk_rope_head_dim", 0, 0), 0
    else:
        heads = optional("num_attention_heads", 1, 1)
        kv_heads = optional("num_key_value_heads", 1, heads)
        head_dim = optional("head_dim", 1, hidden // heads)
        width_k = width_v = kv_heads * head_dim
    total, total_key = first("num_experts", "n_routed_experts")
    used, used_key = first("num_experts_per_tok", "num_experts_per_token")
    if total and used > total:
        raise ShapeError(f"config.json: {pre}{used_key} {used}: more than {pre}{total_key} {total} (a token cannot "
                         "use more experts than a layer has)")
    dtype = str(text.get("torch_dtype") or text.get("dtype") or "bfloat16")
    kinds = dict(weights_by_kind) if weights_by_kind else {"other": int(weights_bytes)}
    trained, trained_from = trained_context(cfg)
    return Shape(architecture=str(text.get("model_type", "")), n_layers=n,
                 cache_k=tuple(width_k if c else 0 for c in caching),
                 cache_v=tuple(width_v if c else 0 for c in caching),
                 weights_by_kind=kinds, layer_bytes=(), hidden=hidden, vocab=optional("vocab_size", 0, 0),
                 n_ff=optional("intermediate_size", 0, 0), dtype_bytes=_DTYPE_BYTES.get(dtype, 2), source=source,
                 experts=(total, used), trained_ctx=trained, trained_ctx_from=trained_from)
