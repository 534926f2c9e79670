"""Balanced manual splits: GGUF layout from the header, planning, shortfall calibration."""

from pathlib import Path

import gguf
import pytest

from supervisor.model.gguf_layout import Layout, read_layout, shards
from supervisor.ladder.balanced import DoesNotFit, Split, kv_bytes_per_layer, plan, recalibrate, shortfalls
from kiln_dev.models import make_tiny_gguf

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "engine-logs"
MIB = 1 << 20


def test_layout_matches_the_gguf_package_byte_for_byte(tmp_path):
    path = make_tiny_gguf(tmp_path / "m.gguf", n_layers=4, width=128)
    layout = read_layout(path)
    reader = gguf.GGUFReader(path)
    per_layer: dict[int, int] = {}
    for t in reader.tensors:
        if t.name.startswith("blk."):
            n = int(t.name.split(".")[1])
            per_layer[n] = per_layer.get(n, 0) + int(t.n_bytes)
    assert layout.n_layers == 4 and layout.meta("block_count") == 4
    assert all(abs(layout.layer_bytes[n] - b) < 64 for n, b in per_layer.items())   # alignment padding only
    assert "token_embd" in layout.other_bytes and "output" in layout.other_bytes


def test_shard_names_expand():
    assert [p.name for p in shards(Path("/m/x-00001-of-00003.gguf"))] == [
        "x-00001-of-00003.gguf", "x-00002-of-00003.gguf", "x-00003-of-00003.gguf"]


def uniform(n: int, mib: int) -> Layout:
    return Layout(layer_bytes={i: mib * MIB for i in range(n)})


def test_plan_fills_cards_to_the_same_fraction():
    split = plan(uniform(40, 100), [3000, 3000])
    assert split.ranges == ((0, 19), (20, 39)) and split.planned_mib == (2000, 2000)
    split = plan(uniform(40, 100), [1000, 3000])          # a card with a third of the room
    assert split.ranges[0] == (0, 9) and split.ranges[1] == (10, 39)
    assert split.ot_arg().startswith(r"blk\.(0|1|2|3|4|5|6|7|8|9)\.=CUDA0,blk\.(10|")
    assert split.args()[:2] == ["-ngl", "999"]


def test_plan_refuses_what_cannot_fit():
    with pytest.raises(DoesNotFit):
        plan(uniform(40, 100), [1000, 1000])


def test_kv_estimate_from_the_header(tmp_path):
    layout = read_layout(make_tiny_gguf(tmp_path / "m.gguf", width=128))
    # 1 KV head of 64 (width 128 / 2 heads? the generator's head size is 64), f16 K+V
    per = kv_bytes_per_layer(layout, 1024)
    heads_kv = layout.meta("attention.head_count_kv")
    head_dim = layout.meta("embedding_length") // layout.meta("attention.head_count")
    assert per == 1024 * heads_kv * 2 * head_dim * 2


def test_shortfall_read_from_the_real_h200_oom_and_the_seed_text():
    h200 = (LOGS / "llama-server-cuda-oom-h200.log").read_text().splitlines()
    assert shortfalls(h200) == {0: 781250}
    seed = ["ggml_backend_cuda_buffer_type_alloc_buffer: allocating 84790.00 MiB on device 1: cudaMalloc failed: out of memory"]
    assert shortfalls(seed) == {1: 84790}


def test_recalibration_converges_like_the_seeds_three_rounds():
    # Two 46068 MiB cards; the engine needs ~1.2 GiB per card beyond the layers (compute, output).
    layout = uniform(92, 950)
    free = [46068, 46068]
    overhead = 1200

    def engine(split: Split) -> dict[int, int]:
        """A stand-in engine: per card, weights first, then the rest; reports the failing allocation."""
        out = {}
        for dev, planned in enumerate(split.planned_mib):
            if planned > free[dev]:
                out[dev] = planned                          # the weights buffer itself fails
            elif planned + overhead > free[dev]:
                out[dev] = overhead                         # a later buffer fails
        return out

    budgets = list(free)
    rounds = 0
    while True:
        rounds += 1
        split = plan(layout, budgets)
        short = engine(split)
        if not short:
            break
        budgets = recalibrate(split, short, free)
        assert rounds < 4
    fills = [(p + overhead) / f for p, f in zip(split.planned_mib, free)]
    assert rounds <= 3 and all(0.9 < x <= 1.0 for x in fills)
