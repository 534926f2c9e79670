"""A balanced manual split across GPUs, planned from the model's layout and calibrated from
measured shortfalls.

The field notes balanced 2x A40 by hand with explicit `-ot ...=CUDA0 / =CUDA1` layer ranges, in three
calibration rounds each guided by the shortfall (45256 MiB over, then 1038 MiB over, then a fit
at 96 %/94 %): once llama.cpp's autofit is off, `--tensor-split` alone moved nothing. A rung with
`placement = "balanced"` does those rounds itself: plan contiguous layer ranges so every card
fills to the same fraction of its budget, launch, and when a card reports
`allocating X MiB on device N: cudaMalloc failed`, take X off that card's budget and plan again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from ..errors import KilnError
from ..model.gguf_layout import Layout

MIB = 1 << 20
_SHORTFALL = re.compile(r"allocating ([\d.]+) MiB on device (\d+): cudaMalloc failed")


class DoesNotFit(KilnError):
    """No split of the model over the visible GPUs fits their free memory."""


@dataclass(frozen=True)
class Split:
    ranges: tuple[tuple[int, int], ...]     # per device: [first, last] layer, inclusive; (-1, -2) = none
    planned_mib: tuple[int, ...]            # planned bytes per device (layers + their KV), MiB
    budgets_mib: tuple[int, ...]

    def ot_arg(self) -> str:
        """`-ot` value: one explicit layer list per device, e.g. blk\\.(0|1|2)\\.=CUDA0,..."""
        parts = []
        for dev, (lo, hi) in enumerate(self.ranges):
            if hi < lo:
                continue
            layers = "|".join(str(i) for i in range(lo, hi + 1))
            parts.append(rf"blk\.({layers})\.=CUDA{dev}")
        return ",".join(parts)

    def args(self) -> list[str]:
        # -ngl puts every layer on a GPU; -ot says which GPU. Together they replace autofit.
        return ["-ngl", "999", "-ot", self.ot_arg()]

    def describe(self) -> str:
        cards = [f"CUDA{d}: layers {lo}-{hi} ~{mib} MiB of {b} MiB"
                 for d, ((lo, hi), mib, b) in enumerate(zip(self.ranges, self.planned_mib, self.budgets_mib))]
        return "; ".join(cards)


def kv_bytes_per_layer(layout: Layout, n_ctx: int, bytes_per_elem: int = 2) -> int:
    """f16 K and V for one layer at n_ctx (0 when the header does not say enough)."""
    n_embd = layout.meta("embedding_length") or 0
    n_head = layout.meta("attention.head_count") or 0
    n_head_kv = layout.meta("attention.head_count_kv") or n_head
    key_len = layout.meta("attention.key_length") or (n_embd // n_head if n_head else 0)
    val_len = layout.meta("attention.value_length") or key_len
    return int(n_ctx) * int(n_head_kv) * (int(key_len) + int(val_len)) * bytes_per_elem


def plan(layout: Layout, budgets_mib: Sequence[int], *, kv_per_layer: int = 0) -> Split:
    """Contiguous ranges that fill every card to the same fraction of its budget."""
    if not layout.layer_bytes:
        raise DoesNotFit("the model has no blk.N layers to split")
    layers = sorted(layout.layer_bytes)
    cost = [layout.layer_bytes[i] + kv_per_layer for i in layers]
    total = sum(cost)
    capacity = sum(max(b, 0) for b in budgets_mib) * MIB
    if total > capacity:
        raise DoesNotFit(f"layers need {total // MIB} MiB, the cards' budgets total {capacity // MIB} MiB")
    fraction = total / capacity
    ranges: list[tuple[int, int]] = []
    planned: list[int] = []
    i = 0
    for dev, budget in enumerate(budgets_mib):
        last_dev = dev == len(budgets_mib) - 1
        target = fraction * budget * MIB
        start, used = i, 0
        while i < len(layers) and (last_dev or used + cost[i] / 2 <= target) and used + cost[i] <= budget * MIB:
            used += cost[i]
            i += 1
        ranges.append((layers[start], layers[i - 1]) if i > start else (-1, -2))
        planned.append(used // MIB)
    if i < len(layers):
        raise DoesNotFit(f"layers {layers[i]}-{layers[-1]} do not fit in the budgets {list(budgets_mib)} MiB")
    return Split(tuple(ranges), tuple(planned), tuple(int(b) for b in budgets_mib))


def shortfalls(tail: Sequence[str]) -> dict[int, int]:
    """MiB each device failed to allocate, from llama.cpp's cudaMalloc failure lines."""
    out: dict[int, int] = {}
    for line in tail:
        m = _SHORTFALL.search(line)
        if m:
            dev = int(m.group(2))
            out[dev] = max(out.get(dev, 0), int(float(m.group(1)) + 0.999))
    return out


def recalibrate(split: Split, short: dict[int, int], free_mib: Sequence[int], *,
                slack_mib: int = 256) -> list[int]:
    """New per-card budgets after an OOM: what the field notes did by hand, from the engine's own words.

    `short` maps a device to the allocation that failed on it (MiB). If that allocation alone was
    larger than the card's free memory, it was the weights and the card is over by the
    difference. Otherwise the weights we planned there were in and a later buffer (KV cache,
    compute) failed: the card is over by planned + failed - free, or at least by the failed
    allocation when that arithmetic does not explain the failure (our plan under-counted). The
    card's budget drops by that much plus slack; erring large costs a little fill, erring small
    costs another round.
    """
    budgets = list(split.budgets_mib)
    for dev, failed in short.items():
        if dev >= len(budgets):
            continue
        free = free_mib[dev]
        over = failed - free if failed > free else max(split.planned_mib[dev] + failed - free, failed)
        budgets[dev] -= over + slack_mib
    return budgets


class Balancer:
    """One balanced rung's state across launches: the budgets it plans with, its rounds so far."""

    def __init__(self, layout: Layout, free_mib: Sequence[int], *, reserve_mib: int, n_ctx: int,
                 rounds: int, slack_mib: int):
        self.layout = layout
        self.free = [int(f) for f in free_mib]
        self.budgets = [max(f - reserve_mib, 0) for f in self.free]
        self.kv = kv_bytes_per_layer(layout, n_ctx)
        self.rounds_left = rounds
        self.slack = slack_mib
        self.history: list[dict[str, object]] = []
        self.split: Split | None = None

    def plan(self) -> Split:
        self.split = plan(self.layout, self.budgets, kv_per_layer=self.kv)
        self.history.append({"budgets_mib": list(self.budgets), "split": self.split.describe()})
        return self.split

    def calibrate(self, tail: Sequence[str]) -> dict[int, int] | None:
        """New budgets from an OOM's shortfall lines; None when there is nothing to go on."""
        short = shortfalls(tail)
        if not short or self.split is None or self.rounds_left <= 0:
            return None
        self.rounds_left -= 1
        self.history[-1]["shortfall_mib"] = {f"CUDA{d}": mib for d, mib in short.items()}
        self.budgets = recalibrate(self.split, short, self.free, slack_mib=self.slack)
        return short


def context_from_args(args: Sequence[str], layout: Layout) -> int:
    """The context the engine will allocate KV for: -c / --ctx-size, else the model's own."""
    for i, a in enumerate(args):
        if a in ("-c", "--ctx-size") and i + 1 < len(args) and args[i + 1].isdigit() and int(args[i + 1]) > 0:
            return int(args[i + 1])
        if a.startswith("--ctx-size=") and a.split("=", 1)[1].isdigit():
            return int(a.split("=", 1)[1])
    return int(layout.meta("context_length") or 4096)
