#!/usr/bin/env python3
"""P19: plan's decode estimate against measured decode, on shapes the fit did not see (issue 52).

Reads the decode sweeps under images/plan/decode-sweeps/ (bench/decode_sweep.py on a lent GPU: dense
f16 GGUFs made by kiln_dev.models, served by the pinned llama-server with `-c 4096 -ngl 999 -np 8`,
layout `split`, and with `--kv-unified`, layout `unified`). Each shape is read the way `plan` reads a
model (images/plan/source.py on a GGUF whose header is the sweep's and whose tensors are a sparse
hole), so the bytes and layers are plan's own. Then, per layout and stream count, it fits
images/plan/decode.py's three coefficients by least squares, and:

    leave one shape out   fit on the others, predict it: the error P19 reports (one stream and 8
                          streams; median and worst absolute %)
    MoE check             the dense fit predicting a random MoE GGUF of the same sweep (touched experts)
    vLLM                  per-step costs from the field notes' Qwen3-Coder-30B-A3B AWQ rows (1 to 32
                          streams on one A40), the bandwidth efficiency borrowed from llama.cpp's fit

`--write` saves the fits (on every shape) to images/plan/decode-calibration.json, which plan reads.
Every run appends its figures to bench/out/plan_decode.jsonl.

    python bench/plan_decode.py [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import REPO

from images import gpus                                         # noqa: E402 - common put the repo on sys.path
from images.plan import decode, seed, source                    # noqa: E402
from supervisor.plan import memory                              # noqa: E402
from supervisor.plan.shape import Shape, from_config            # noqa: E402

SWEEPS = REPO / "images" / "plan" / "decode-sweeps"
OUT = REPO / "bench" / "out"
LAYOUTS = {"np8": "split", "np8-kvu": "unified"}
SWEEP_POSITION = 72          # the sweeps' mean position: a prompt of a few tokens, then 128 decoded


def gpu_id(row: dict) -> str:
    return row["gpu"].split(",")[0].strip()


def shape_of(row: dict, tmp: Path) -> Shape:
    from kiln_dev.models import make_tiny_gguf

    path = tmp / f"{row['shape']}.gguf"
    if not path.exists():
        make_tiny_gguf(path, n_layers=row["n_layers"], width=row["width"], n_ff=row["n_ff"], n_vocab=row["n_vocab"],
                       n_expert=row.get("n_expert", 0), n_expert_used=row.get("n_expert_used", 2), data=False)
    s = source.read(str(path)).shape
    if abs(s.weights_bytes - row["file_bytes"]) > 0.01 * row["file_bytes"]:
        raise SystemExit(f"{row['shape']}: plan reads {s.weights_bytes} weight bytes, the measured file had "
                         f"{row['file_bytes']}: not the same shape")
    return s


def measured(row: dict, n: int) -> float:
    return row["decode_1"] if n == 1 else row["streams"][str(n)]["aggregate"]


def features(s: Shape, n: int, engine: str, bw_gbs: float, position: int) -> list[float]:
    kv = float(memory.kv_bytes_per_token(s, engine, "f16"))
    reads = decode.touched_bytes(s, n, engine) + n * kv * position
    return [1.0, float(s.n_layers), reads / (bw_gbs * 1e9)]


def least_squares(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares over three columns: a coefficient that comes out negative is held at 0."""
    keep = [0, 1, 2]
    while True:
        x = np.zeros(3)
        x[keep] = np.linalg.lstsq(A[:, keep], y, rcond=None)[0]
        bad = [i for i in keep if x[i] < 0 and i != 2]
        if not bad:
            return x
        keep.remove(bad[0])


def fit(rows: list[dict], shapes: dict[str, Shape], counts: list[int], engine: str = "llamacpp") -> dict[int, decode.Coefficients]:
    out = {}
    for n in counts:
        A = np.array([features(shapes[r["shape"]], n, engine, r["bw_gbs"], SWEEP_POSITION) for r in rows])
        y = np.array([n / measured(r, n) for r in rows])
        a, b, x = least_squares(A, y)
        out[n] = decode.Coefficients(fixed_s=float(a), per_layer_s=float(b), efficiency=float(1 / x))
    return out


def predict(coef: dict[int, decode.Coefficients], s: Shape, n: int, bw_gbs: float, layout: str) -> float:
    f = decode.Fit("llamacpp", layout, coef, basis="")
    kv = float(memory.kv_bytes_per_token(s, "llamacpp", "f16"))
    t, _ = decode.step_s(f, s, bandwidth_gbs=bw_gbs, cards_read_at_once=1, streams=n, kv_bytes_per_token=kv,
                         position=SWEEP_POSITION)
    return n / t


def vllm_fit(llama_eff: float) -> tuple[decode.Fit, list[str]]:
    """Per-step costs of vLLM from the field notes' Qwen3-Coder-30B-A3B AWQ rows on one A40."""
    total_b, active_b, experts, used = 30.5, 3.3, 128, 8           # Qwen's model card (see seed.QWEN3_CODER_PARAMS)
    routed_share = (total_b - active_b) / (1 - used / experts) / total_b
    cfg = dict(seed.QWEN3_CODER_CONFIG, num_experts=experts, num_experts_per_tok=used)
    w = seed.QWEN3_CODER_AWQ_BYTES
    s = from_config(cfg, weights_bytes=w, weights_by_kind={"routed_experts": int(w * routed_share),
                                                           "other": w - int(w * routed_share)})
    bw = gpus.facts(seed.A40_ID).bandwidth_gbs or seed.BANDWIDTH_GB_S[seed.A40_ID]
    lines, coef = [], {}
    for r in (r for r in seed.SPEED_ROWS if r.engine == "vllm" and "qwen3-coder-30b-a3b" in r.match):
        t = r.streams / r.decode_tok_s
        reads = decode.touched_bytes(s, r.streams, "vllm")
        fixed = max(0.0, t - reads / (llama_eff * bw * 1e9))
        coef[r.streams] = decode.Coefficients(fixed_s=fixed, per_layer_s=0.0, efficiency=llama_eff)
        lines.append(f"  vLLM {r.streams:>2} streams: step {t * 1e3:6.2f} ms, of it reads {reads / 1e9:5.2f} GB "
                     f"-> fixed {fixed * 1e3:6.2f} ms")
    basis = (f"vLLM 0.27.1, Qwen3-Coder-30B-A3B AWQ at 1-32 streams on one {seed.A40_ID} (the field notes), "
             f"bandwidth efficiency {llama_eff:.2f} from llama.cpp's sweep")
    return decode.Fit("vllm", "", coef, basis=basis, checked="not checked on a model it was not fitted on"), lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="save the fits to images/plan/decode-calibration.json")
    args = ap.parse_args()
    rows = [json.loads(line) for f in sorted(SWEEPS.glob("*.jsonl")) for line in f.read_text().splitlines() if line]
    for r in rows:
        facts = gpus.facts(gpu_id(r))
        if facts is None or not facts.bandwidth_gbs:
            raise SystemExit(f"{gpu_id(r)}: no bandwidth in images/gpus.toml")
        r["bw_gbs"] = facts.bandwidth_gbs
    print(f"{time.strftime('%Y-%m-%d %H:%M')}  {platform.node()}  load {os.getloadavg()[0]:.2f}  "
          f"{len(rows)} rows from {', '.join(sorted({gpu_id(r) for r in rows}))} "
          f"(bandwidth in images/gpus.toml: {', '.join(sorted({format(r['bw_gbs'], 'g') for r in rows}))} GB/s)")
    with tempfile.TemporaryDirectory(prefix="kiln-p19-") as d:
        shapes = {r["shape"]: shape_of(r, Path(d)) for r in rows}
    results: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": len(rows)}
    fits_out = []
    for variant, layout in LAYOUTS.items():
        mine = [r for r in rows if r["variant"] == variant]
        dense = [r for r in mine if not r.get("n_expert")]
        counts = sorted({int(n) for r in dense for n in r["streams"]})
        errs: dict[int, list[float]] = {n: [] for n in counts}
        print(f"\n{layout} KV (served with {' '.join(dense[0]['argv'][-3:] if layout == 'unified' else dense[0]['argv'][-2:])}):"
              f" leave one shape out")
        for name in sorted({r["shape"] for r in dense}):
            coef = fit([r for r in dense if r["shape"] != name], shapes, counts)
            for r in (r for r in dense if r["shape"] == name):
                line = []
                for n in counts:
                    p = predict(coef, shapes[name], n, r["bw_gbs"], layout)
                    e = (p / measured(r, n) - 1) * 100
                    errs[n].append(abs(e))
                    line.append(f"{n}: {measured(r, n):7.1f} vs {p:7.1f} ({e:+5.1f}%)")
                print(f"  {name:<10} " + "  ".join(line))
        for n in counts:
            print(f"  {n} stream(s): median {statistics.median(errs[n]):.1f}%, worst {max(errs[n]):.1f}% over {len(errs[n])}")
        coef = fit(dense, shapes, counts)
        p19 = sorted(errs[1] + errs[8])
        results[layout] = {"median_pct": round(statistics.median(p19), 2), "worst_pct": round(max(p19), 2),
                           "by_streams": {n: [round(statistics.median(errs[n]), 2), round(max(errs[n]), 2)]
                                          for n in counts}}
        moe_line = ""
        for r in (r for r in mine if r.get("n_expert")):
            got = [(n, predict(coef, shapes[r["shape"]], n, r["bw_gbs"], layout), measured(r, n)) for n in counts]
            moe_line = "; ".join(f"{n}: {m:.1f} vs {p:.1f} ({(p / m - 1) * 100:+.1f}%)" for n, p, m in got)
            bound = r["bw_gbs"] * 1e9 / shapes[r["shape"]].weights_bytes
            print(f"  MoE {r['shape']} (not fitted on; {r['n_expert_used']} of {r['n_expert']} experts): {moe_line}"
                  f"  [every expert counted as read, the old bound: {bound:.1f} tok/s]")
            results[layout]["moe"] = {n: round((p / m - 1) * 100, 1) for n, p, m in got}
        for n, c in coef.items():
            print(f"  fit on all, {n} stream(s): fixed {c.fixed_s * 1e6:7.1f} us + {c.per_layer_s * 1e6:6.2f} us/layer,"
                  f" efficiency {c.efficiency:.3f}")
        gpu = ", ".join(sorted({gpu_id(r) for r in dense}))
        fits_out.append(decode.Fit(
            "llamacpp", layout, coef,
            basis=f"llama.cpp 11434, {layout} KV, {len({r['shape'] for r in dense})} dense f16 shapes of "
                  f"{min(r['file_bytes'] for r in dense) / 1e9:.1f}-{max(r['file_bytes'] for r in dense) / 1e9:.0f} GB "
                  f"at 1-{max(counts)} streams on one {gpu}",
            checked=f"off by {results[layout]['median_pct']:.1f}% (median), {results[layout]['worst_pct']:.1f}% "
                    "(worst) on a shape left out").to_json())
    eff = fits_out[1]["by_streams"]["1"]["efficiency"]
    vfit, lines = vllm_fit(eff)
    print("\nvLLM (the field notes' rows):")
    print("\n".join(lines))
    fits_out.append(vfit.to_json())
    split, unified = results["split"], results["unified"]
    print(f"\nP19 plan_decode_error_pct={split['median_pct']:.1f} worst={split['worst_pct']:.1f} "
          f"(leave one shape out, -np 8 as P19 serves, 1 and 8 streams; goal median <= 15, worst <= 30); "
          f"with --kv-unified: median {unified['median_pct']:.1f}, worst {unified['worst_pct']:.1f}")
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "plan_decode.jsonl", "a") as f:
        f.write(json.dumps(results) + "\n")
    if args.write:
        decode.DATA.write_text(json.dumps({"written_by": "python bench/plan_decode.py --write",
                                           "fits": fits_out}, indent=1) + "\n")
        print(f"wrote {decode.DATA.relative_to(REPO)}")


if __name__ == "__main__":
    sys.exit(main())
