"""Bytes per element of a KV cache type, as each engine counts it.

llama.cpp's `--cache-type-k/-v` types are ggml types: a block of `n` elements in `b` bytes
(supervisor/model/gguf_layout.py GGML_BLOCKS, from the pinned gguf-py's GGML_QUANT_SIZES).
vLLM's `--kv-cache-dtype`: `auto` is the model's dtype, `fp8*` one byte.
"""

from __future__ import annotations

from fractions import Fraction

from ..errors import KilnError
from ..model.gguf_layout import GGML_BLOCKS

# llama.cpp cache type name -> ggml type id (ggml.h enum ggml_type)
LLAMACPP = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}
VLLM = {"auto": None, "bfloat16": Fraction(2), "float16": Fraction(2), "half": Fraction(2),
        "fp8": Fraction(1), "fp8_e4m3": Fraction(1), "fp8_e5m2": Fraction(1)}


class KVTypeError(KilnError):
    """A KV cache type this engine does not know."""


def bytes_per_element(engine: str, kv_type: str, model_dtype_bytes: int = 2) -> Fraction:
    """Exact bytes one cached element takes (q8_0: 34/32)."""
    name = kv_type.lower()
    if engine == "llamacpp":
        if name == "q8":
            name = "q8_0"
        if name not in LLAMACPP:
            raise KVTypeError(f"kv type {kv_type!r} is not a llama.cpp cache type (one of {', '.join(LLAMACPP)})")
        block, size = GGML_BLOCKS[LLAMACPP[name]]
        return Fraction(size, block)
    if engine == "vllm":
        if name not in VLLM:
            raise KVTypeError(f"kv type {kv_type!r} is not a vLLM --kv-cache-dtype (one of {', '.join(VLLM)})")
        return VLLM[name] or Fraction(model_dtype_bytes)
    raise KVTypeError(f"engine {engine!r}: one of llamacpp, vllm")
