#!/usr/bin/env python3
"""The llama.cpp-vs-vLLM concurrency sweep of one bench/gpu_compare.py run as a plot and a table.

    python3 bench/plot_sweep.py GPU_COMPARE_JSON [--png OUT.png] [--title TEXT]

Reads the levels bench/serve.py measured for each engine (streams, aggregate tok/s, per-stream tok/s,
$/1M output, client overhead) and writes a two-panel PNG (aggregate, per stream; both axes log; a level whose aggregate is below
the one before is labelled, not smoothed over) and prints the markdown table
docs/research/benchmarks-history.md carries. Nothing is measured here: it only draws one
run's JSON, so the plot and the table always come from the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ENGINES = (("llamacpp", "llama.cpp (llama-server)", "o-"), ("vllm", "vLLM 0.26.0", "s-"))


def levels(data: dict, engine: str) -> list[dict]:
    return [lv for lv in (data.get(engine) or {}).get("levels") or [] if lv.get("ok")]


def table(data: dict) -> str:
    rows = ["| streams | llama.cpp aggregate tok/s | per stream | $/1M | vLLM aggregate tok/s | per stream | $/1M |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    by = {e: {lv["streams"]: lv for lv in levels(data, e)} for e, _, _ in ENGINES}
    for n in sorted(set(by["llamacpp"]) | set(by["vllm"])):
        cells = [str(n)]
        for e, _, _ in ENGINES:
            lv = by[e].get(n)
            cells += ([f"{lv['aggregate_tok_s']:.1f}", f"{lv['per_stream_client_tok_s']:.1f}",
                       f"{lv['usd_per_m_output']:.4f}"] if lv else ["—"] * 3)
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(data: dict, png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (agg, per) = plt.subplots(1, 2, figsize=(11, 4.2))
    for engine, label, style in ENGINES:
        lvls = levels(data, engine)
        xs = [lv["streams"] for lv in lvls]
        ys = [lv["aggregate_tok_s"] for lv in lvls]
        agg.plot(xs, ys, style, label=label)
        per.plot(xs, [lv["per_stream_client_tok_s"] for lv in lvls], style, label=label)
        for i in range(1, len(ys)):          # a level below the one before: said, not smoothed over
            if ys[i] < ys[i - 1]:
                agg.annotate(f"{xs[i]} streams: dip\n(see docs/benchmarks.md)", (xs[i], ys[i]), fontsize=7,
                             xytext=(6, -4), textcoords="offset points")
    for ax, what in ((agg, "aggregate tok/s (all streams)"), (per, "per-stream tok/s (client)")):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_yscale("log")
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path)
    ap.add_argument("--png", type=Path, default=Path("docs/img/gpu-sweep-2026-12-01.png"))
    ap.add_argument("--title", default="SmolLM2-135M-Instruct on one NVIDIA H200, 2026-12-01: llama-server (Q4_1, "
                    "arch-86 build via PTX JIT) vs vLLM 0.26.0 (bf16); 128 tokens a stream")
    a = ap.parse_args(argv)
    try:
        data = json.loads(a.json.read_text())
    except (OSError, ValueError) as e:
        print(f"plot_sweep: cannot read {a.json}: {e}", file=sys.stderr)
        return 2
    if not levels(data, "llamacpp") and not levels(data, "vllm"):
        print(f"plot_sweep: {a.json} holds no sweep levels (llamacpp.levels / vllm.levels)", file=sys.stderr)
        return 2
    plot(data, a.png, a.title)
    print(table(data))
    print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
