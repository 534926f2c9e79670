#!/usr/bin/env python3
"""Decode rates of dense f16 GGUFs on one GPU, for calibrating `plan`'s decode estimate (issue 52).

Each shape is a random llama GGUF made by `python -m kiln_dev.models tiny` (the bytes do not change
the speed of an f16 model; its size and layout do). Each is served by the real llama-server the way
P19 serves it, `-c 4096 -ngl 999 -np 8` (variant `np8`), and again with `--kv-unified` added
(variant `np8-kvu`: an explicit -np turns the unified KV cache off in the pinned build). At 1, 2, 4
and 8 concurrent streams, each a short prompt and 128 generated tokens with ignore_eos, temperature 0:

    decode_1    one stream: llama.cpp's own timings.predicted_per_second (median of --reps)
    aggregate   N streams: the tokens generated / the longest request's predicted_ms (the engine's own
                decode span; the prompts are a few tokens), median of --reps; `wall_aggregate` beside
                it counts the whole wall time from the first request sent to the last answer

Also the GPU's device-to-device copy bandwidth (torch, 2 GiB, read + write counted), the ceiling a
decode that reads every weight once per token cannot pass. Rows are appended to --out as JSON lines
(one per shape and variant; a shape already there is skipped, so a later call resumes), and nothing
stops past --deadline (epoch seconds).

    python3 bench/decode_sweep.py --make --models DIR                 # the model files, in parallel
    python3 bench/decode_sweep.py --binary PREFIX/bin/llama-server --models DIR --out FILE [--deadline T]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import free_port, spawn, status_code, stop, stop_on_term, wait_until  # noqa: E402

# name: (n_layers, width, n_ff, n_vocab); sizes are f16 bytes, the embeddings and output included.
SHAPES = {
    "L24-w1024": (24, 1024, 4096, 32000),      # ~0.94 GB: fixed costs dominate
    "L12-w2048": (12, 2048, 5632, 32000),      # ~1.5 GB
    "L64-w1536": (64, 1536, 4096, 32000),      # ~3.8 GB: many thin layers
    "L27-w3072": (27, 3072, 8192, 32000),      # ~6.5 GB: the P9 model's shape
    "L32-w4096": (32, 4096, 11008, 32000),     # ~13.5 GB: a 7B-like layout
    "L24-w6144": (24, 6144, 16384, 32000),     # ~22.6 GB
}
VARIANTS = {"np8": ["-np", "8"], "np8-kvu": ["-np", "8", "--kv-unified"]}
STREAMS = (1, 2, 4, 8)


def gguf_bytes(shape: tuple[int, int, int, int]) -> int:
    layers, w, ff, vocab = shape
    return 2 * (layers * (4 * w * w + 3 * w * ff) + 2 * vocab * w) + layers * 2 * w * 4 + w * 4


def copy_bandwidth_gbs() -> float | None:
    try:
        import torch
    except ImportError:
        return None
    n = 1 << 30                                           # 2 GiB of f16
    a = torch.empty(n, dtype=torch.float16, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    del a, b
    torch.cuda.empty_cache()
    return 2 * 2 * n / min(times) / 1e9


def complete(port: int, out: list, i: int) -> None:
    body = json.dumps({"prompt": f"Stream {i} says:", "n_predict": 128, "ignore_eos": True, "temperature": 0,
                       "cache_prompt": False}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        out[i] = json.loads(r.read())["timings"]


def streams_once(port: int, n: int) -> tuple[float, float, float]:
    """(aggregate tok/s by the engine's own decode span, by the wall, one request's predicted_per_second)."""
    out: list = [None] * n
    threads = [threading.Thread(target=complete, args=(port, out, i)) for i in range(n)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    if any(o is None for o in out):
        raise RuntimeError("a request failed")
    tokens = sum(o["predicted_n"] for o in out)
    span_s = max(o["predicted_ms"] for o in out) / 1000
    return tokens / span_s, tokens / wall, statistics.median(o["predicted_per_second"] for o in out)


def measure(binary: Path, model: Path, extra: list[str], reps: int) -> dict:
    port = free_port()
    argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "4096", "-ngl", "999",
            *extra]
    log = open(model.with_suffix(f".{'-'.join(extra)}.log"), "w")
    p = spawn(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        wait_until(lambda: status_code(f"http://127.0.0.1:{port}/health") == 200, 600, interval=0.1)
        load_s = time.monotonic() - t0
        streams_once(port, 8)                                  # warm-up: every slot, the kernels, the graphs
        rows = {}
        for n in STREAMS:
            runs = [streams_once(port, n) for _ in range(reps)]
            rows[str(n)] = {"aggregate": round(statistics.median(r[0] for r in runs), 2),
                            "wall_aggregate": round(statistics.median(r[1] for r in runs), 2),
                            "per_stream": round(statistics.median(r[2] for r in runs), 2),
                            "runs": [[round(x, 2) for x in r] for r in runs]}
        return {"argv": argv[1:], "load_s": round(load_s, 2), "streams": rows,
                "decode_1": rows["1"]["per_stream"]}
    finally:
        stop(p, 60)
        log.close()


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.memory",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        return "unknown"


def make_models(models: Path, names: list[str], python: str) -> None:
    """Every missing <shape>.gguf, made in parallel by `python -m kiln_dev.models tiny`, while the disk
    keeps 4 GB free beyond them (the largest shapes are left out first)."""
    import shutil

    models.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(models).free - 4e9
    procs = []
    for name in sorted(names, key=lambda n: gguf_bytes(SHAPES[n])):
        path = models / f"{name}.gguf"
        if path.is_file():
            continue
        size = gguf_bytes(SHAPES[name])
        if size > free:
            print(f"{name}: {size / 1e9:.1f} GB does not fit ({free / 1e9:.1f} GB free): not made", flush=True)
            continue
        free -= size
        layers, w, ff, vocab = SHAPES[name]
        procs.append((name, subprocess.Popen([python, "-m", "kiln_dev.models", "tiny", str(path), "--n-layers",
                                              str(layers), "--width", str(w), "--n-ff", str(ff), "--n-vocab",
                                              str(vocab)], stdout=subprocess.DEVNULL)))
    for name, p in procs:
        print(f"{name}: made (exit {p.wait()})", flush=True)


def main() -> None:
    stop_on_term()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", type=Path, help="llama-server (required but with --make)")
    ap.add_argument("--models", type=Path, required=True, help="the directory holding <shape>.gguf")
    ap.add_argument("--out", type=Path, help="the JSON lines file (required but with --make)")
    ap.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds: start nothing after")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES))
    ap.add_argument("--per-model-s", type=float, default=120, help="what one shape is expected to take")
    ap.add_argument("--make", action="store_true", help="only make the missing model files, then exit")
    args = ap.parse_args()
    if args.make:
        make_models(args.models, args.shapes, sys.executable)
        return
    done = set()
    if args.out.is_file():
        done = {(r["shape"], r["variant"]) for r in map(json.loads, args.out.read_text().splitlines()) if r.get("shape")}
    gpu = gpu_name()
    bw = copy_bandwidth_gbs()
    print(f"{gpu}; device-to-device copy {bw and round(bw)} GB/s", flush=True)
    for name in args.shapes:
        model = args.models / f"{name}.gguf"
        if not model.is_file():
            print(f"{name}: no model file, skipped", flush=True)
            continue
        for variant, extra in VARIANTS.items():
            if (name, variant) in done:
                continue
            if time.time() + args.per_model_s / 2 > args.deadline:
                print(f"{name} {variant}: past the deadline, left for the next call", flush=True)
                return
            row = measure(args.binary, model, extra, args.reps)
            layers, w, ff, vocab = SHAPES[name]
            row.update(shape=name, variant=variant, n_layers=layers, width=w, n_ff=ff, n_vocab=vocab,
                       file_bytes=model.stat().st_size, gpu=gpu, copy_gbs=bw and round(bw, 1),
                       date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
            s = row["streams"]
            print(f"{name:<10} {variant:<8} {row['file_bytes'] / 1e9:6.2f} GB  load {row['load_s']:5.1f} s  "
                  + "  ".join(f"{n}:{s[n]['aggregate']:8.1f}" for n in s), flush=True)


if __name__ == "__main__":
    main()
