#!/usr/bin/env python3
"""P1: ready time under the supervisor / bare llama-server (same model, same flags; selftest excluded).

Bare: Popen(llama-server ...) -> GET /health answers 200.
Supervised: Popen(python -m supervisor run) -> GET /ready on the status port answers 200
(the supervisor's own readiness: it has started the engine and seen /health 200).
Both are polled every 5 ms by this script; runs alternate so drift hits both alike.

    python bench/startup.py [--runs 5] [--model smollm2|tiny|big] [--threads 1]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (REPO, SUPERVISOR_PYTHON, deploy_toml, env_without_kiln, free_port, llama_prefix, median, rung_toml,
                    spawn, status_code, stop, stop_on_term, wait_until)


def model_path(kind: str, tmp: Path) -> Path:
    from kiln_dev.models import make_tiny_gguf, smollm2_gguf

    if kind == "smollm2":
        return smollm2_gguf()
    if kind == "big":   # ~1 GB of f16 weights: load time that dwarfs process start-up
        return make_tiny_gguf(tmp / "big.gguf", n_layers=8, width=2048, n_ff=5632, n_vocab=32000)
    return make_tiny_gguf(tmp / "tiny.gguf")


def engine_args(model: Path, port: int, threads: int) -> list[str]:
    return ["--model", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
            "-c", "2048", "-ngl", "0", "--metrics"]


def bare(binary: Path, model: Path, threads: int) -> float:
    port = free_port()
    t0 = time.monotonic()
    p = spawn([str(binary), *engine_args(model, port, threads)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t1 = wait_until(lambda: status_code(f"http://127.0.0.1:{port}/health") == 200, 300)
    finally:
        stop(p, 30)
    return t1 - t0


def supervised(binary: Path, model: Path, threads: int, tmp: Path) -> float:
    port, sport = free_port(), free_port()
    cfg = tmp / f"deploy-{port}.toml"
    args = engine_args(model, port, threads)[6:]   # the flags after model/host/port
    args = [a for a in args if a not in ("-ngl", "0", "--metrics")]
    cfg.write_text(deploy_toml(model=model, binary=binary, port=port, status_port=sport, state_dir=tmp / "state",
                               rungs=rung_toml("cpu", args)))
    t0 = time.monotonic()
    p = spawn([SUPERVISOR_PYTHON, "-m", "supervisor", "run", "--config", str(cfg)], death_signal=signal.SIGTERM,
              cwd=REPO, env=env_without_kiln(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t1 = wait_until(lambda: status_code(f"http://127.0.0.1:{sport}/ready") == 200, 300)
    finally:
        stop(p, 60)
    return t1 - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--model", choices=("tiny", "smollm2", "big"), default="big")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    binary = llama_prefix() / "bin" / "llama-server"
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as t:
        tmp = Path(t)
        model = model_path(args.model, tmp)
        size_mb = model.stat().st_size / 1e6
        bare(binary, model, args.threads)          # warm the page cache for both sides alike
        b, s = [], []
        for _ in range(args.runs):
            b.append(bare(binary, model, args.threads))
            s.append(supervised(binary, model, args.threads, tmp))
    mb, ms = median(b), median(s)
    print(f"model {args.model} ({size_mb:.0f} MB), {args.runs} runs each, medians:")
    print(f"  bare llama-server ready      {mb:.3f} s   (runs: {', '.join(f'{x:.3f}' for x in b)})")
    print(f"  supervised /ready            {ms:.3f} s   (runs: {', '.join(f'{x:.3f}' for x in s)})")
    print(f"  added by the supervisor      {ms - mb:+.3f} s")
    print(f"P1 overhead_s={ms - mb:.3f}")
    print(f"P1 supervised_over_bare={ms / mb:.3f}")
    return 0


if __name__ == "__main__":
    stop_on_term()
    sys.exit(main())
