"""Whether an estimate is resident on `count` cards of `card_bytes` each: per-card bytes, and what is not.

llama.cpp splits by whole layers (`--split-mode layer`, what autofit does): each card keeps its
compute buffer and leaves the fit margin free; a layer goes with its KV cache; the output head goes
with the last layer; the input embedding stays on the host. Layers that fit nowhere run on the host:
the plan is offloaded, and host-bound (field notes § "Host vCPU, not VRAM").

vLLM splits by tensor parallelism: every card holds 1/count of the weights and never offloads; what
does not fit is a failure, not a slower plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .memory import PIPELINE_COPIES, Estimate, llamacpp_cells, llamacpp_compute_bytes
from .shape import Shape


@dataclass(frozen=True)
class Placement:
    count: int
    card_bytes: int
    per_card_bytes: tuple[int, ...]            # what each card holds
    resident: bool                             # every layer (and its cache) on a card
    host_layers: tuple[int, ...] = ()          # layers that would run on the host
    host_bytes: int = 0                        # weights + cache left on the host
    why: str = ""
    notes: tuple[str, ...] = field(default=())


def _layer_items(shape: Shape, est: Estimate) -> list[int]:
    """Bytes per layer: its weights and its KV cache. A source with no per-layer layout (config.json)
    spreads the weights other than the embeddings evenly: said in the plan's notes."""
    cells = llamacpp_cells(est.ctx) if est.engine == "llamacpp" else est.ctx
    per_elem = est.kv_bytes_per_token / max(1, shape.cache_elements_per_token)
    kv = [int(cells * (k + v) * per_elem) for k, v in zip(shape.cache_k, shape.cache_v)]
    if shape.layer_bytes:
        return [w + c for w, c in zip(shape.layer_bytes, kv)]
    body = (shape.weights_bytes - shape.weights_by_kind.get("embeddings", 0)) // max(1, shape.n_layers)
    return [body + c for c in kv]


def _output_head(shape: Shape) -> int:
    """The output projection's bytes on the last card. A model with tied embeddings has no output
    tensor: llama.cpp then loads token_embd a second time as the output (TENSOR_DUPLICATED in
    src/models/<arch>.cpp, src/llama-model-loader.cpp), so the card holds a copy of what the host
    keeps. Without a layout (config.json), half the embeddings."""
    embeddings = shape.weights_by_kind.get("embeddings", 0)
    if not shape.layer_bytes:
        return embeddings // 2
    return embeddings - shape.host_input_bytes or shape.host_input_bytes


def _greedy(items: list[int], count: int, usable: int) -> tuple[list[int], list[int]]:
    """Whole layers in order onto the cards, each up to `usable`; what is left runs on the host."""
    cards, host, c = [0] * count, [], 0
    for i, need in enumerate(items):
        while c < count and cards[c] + need > usable:
            c += 1
        if c < count:
            cards[c] += need
        else:
            host.append(i)
    return cards, host


def _even(items: list[int], count: int) -> list[int]:
    """Contiguous layer ranges of about equal bytes (autofit fills the cards alike:
    field notes § "Autofit and placement flags", both cards filled to 95 %)."""
    total, cards, acc = sum(items), [0] * count, 0
    for need in items:
        c = min(count - 1, int(acc * count // max(1, total)))
        cards[c] += need
        acc += need
    return cards


def llamacpp(shape: Shape, est: Estimate, *, count: int, card_bytes: int) -> Placement:
    items = _layer_items(shape, est)
    items[-1] += _output_head(shape)                    # the output head goes with the last layer
    notes = [] if shape.layer_bytes else ["per-layer sizes spread evenly (the source lists no layout)"]
    # Resident on several cards means pipeline parallelism: the compute buffer with its copies.
    compute = llamacpp_compute_bytes(shape, est.ctx, est.streams, copies=PIPELINE_COPIES if count > 1 else 1)
    usable = card_bytes - est.reserve_bytes - compute
    cards, host = _greedy(items, count, usable)
    if host:
        # Not every layer fits beside the copies: autofit offloads fewer layers, which turns pipeline
        # parallelism off (one copy) — so at least one layer stays on the host even where the rest fit.
        compute = est.compute_bytes
        cards, host = _greedy(items, count, card_bytes - est.reserve_bytes - compute)
        if not host:
            last = max(i for i, b in enumerate(cards) if b)
            cards[last] -= items[-1]
            host = [len(items) - 1]
    else:
        even = _even(items, count)
        if max(even) <= usable:
            cards = even
    per_card = tuple(b + compute if b else 0 for b in cards)
    host_bytes = sum(items[i] for i in host) + shape.host_input_bytes
    why = (f"{len(host)} of {shape.n_layers} layers do not fit {count} card(s) of {card_bytes / 2**30:.1f} GiB "
           f"(each keeps {est.reserve_bytes / 2**20:.0f} MiB free and a {compute / 2**20:.0f} MiB "
           f"compute buffer)") if host else ""
    return Placement(count=count, card_bytes=card_bytes, per_card_bytes=per_card, resident=not host,
                     host_layers=tuple(host), host_bytes=host_bytes, why=why, notes=tuple(notes))


def vllm(shape: Shape, est: Estimate, *, count: int, card_bytes: int, utilization: float) -> Placement:
    # Tensor parallelism splits the weights and GQA's KV heads; an MLA latent (no V) is whole on every rank.
    kv = est.kv_bytes if not any(shape.cache_v) else est.kv_bytes // count
    per_card = est.weights_bytes // count + kv + est.compute_bytes
    budget = int(utilization * card_bytes)
    ok = per_card <= budget
    why = "" if ok else (f"{per_card / 2**30:.1f} GiB per card against {utilization:g} x "
                         f"{card_bytes / 2**30:.1f} GiB = {budget / 2**30:.1f} GiB (vLLM does not offload)")
    return Placement(count=count, card_bytes=card_bytes, per_card_bytes=(per_card,) * count, resident=ok,
                     why=why)
