#!/usr/bin/env python3
"""P1: ready time under the supervisor / bare llama-server (same model, same flags; selftest excluded).

Bare: Popen(llama-server ...) -> GET /health answers 200.
Supervised: Popen(python -m supervisor run) -> GET /ready on the status port answers 200
(the supervisor's own readiness: it has started the engine and seen /health 200), started the way
the image starts it (kiln_dev/image_start.py: the image's venv, its compiled bytecode, from outside
the checkout); the same supervisor started from the checkout is printed beside it.
All are polled every 5 ms by this script; runs alternate so drift hits all alike.

The load average is printed; a figure taken above load 1.5 says so on its P-line (on a 2-core
machine a busy neighbour shows up in both sides, but not equally: the supervisor's Python start-up
and the engine's load compete for the same cores).

    python bench/startup.py [--runs 5] [--model smollm2|tiny|big] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (REPO, SUPERVISOR_PYTHON, deploy_toml, env_without_kiln, free_port, llama_prefix, median, rung_toml,
                    spawn, status_code, stop, stop_on_term, wait_until)
from kiln_dev.image_start import ImageStart, image_start


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


def supervised(binary: Path, model: Path, threads: int, tmp: Path, start: ImageStart | None) -> float:
    port, sport = free_port(), free_port()
    cfg = tmp / f"deploy-{port}.toml"
    args = engine_args(model, port, threads)[6:]   # the flags after model/host/port
    args = [a for a in args if a not in ("-ngl", "0", "--metrics")]
    cfg.write_text(deploy_toml(model=model, binary=binary, port=port, status_port=sport, state_dir=tmp / "state",
                               rungs=rung_toml("cpu", args)))
    t0 = time.monotonic()
    if start is None:           # from the checkout, as a developer runs it
        argv, env, cwd = [SUPERVISOR_PYTHON, "-m", "supervisor"], env_without_kiln(), str(REPO)
    else:
        argv, env, cwd = start.argv, start.env(env_without_kiln()), start.cwd
    p = spawn([*argv, "run", "--config", str(cfg)], death_signal=signal.SIGTERM,
              cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as t:
        tmp = Path(t)
        start = image_start(tmp)
        model = model_path(args.model, tmp)
        size_mb = model.stat().st_size / 1e6
        bare(binary, model, args.threads)          # warm the page cache for both sides alike
        supervised(binary, model, args.threads, tmp, start)     # and the venv's files
        b, s, c = [], [], []
        for _ in range(args.runs):
            b.append(bare(binary, model, args.threads))
            s.append(supervised(binary, model, args.threads, tmp, start))
            c.append(supervised(binary, model, args.threads, tmp, None))
    load.append(os.getloadavg()[0])
    mb, ms, mc = median(b), median(s), median(c)
    busy = max(load)
    print(f"model {args.model} ({size_mb:.0f} MB), {args.runs} runs each, {os.cpu_count()} cores, "
          f"load average {load[0]:.2f} at the start, {load[1]:.2f} at the end; medians:")
    print(f"  supervisor started {start.described}")
    print(f"  bare llama-server ready      {mb:.3f} s   (runs: {_runs(b)})")
    print(f"  supervised /ready            {ms:.3f} s   (runs: {_runs(s)})")
    print(f"  from the checkout /ready     {mc:.3f} s   (runs: {_runs(c)}; {SUPERVISOR_PYTHON}, uncompiled "
          f"where PYTHONDONTWRITEBYTECODE is set: not what a pod runs)")
    print(f"  added by the supervisor      {ms - mb:+.3f} s   (from the checkout {mc - mb:+.3f} s)")
    note = f" load={busy:.2f}" + (" (above 1.5: not a figure to report; rerun on an idle machine)" if busy > 1.5 else "")
    print(f"P1 overhead_s={ms - mb:.3f}{note}")
    print(f"P1 supervised_over_bare={ms / mb:.3f}{note}")
    return 0


def _runs(xs: list[float]) -> str:
    return ", ".join(f"{x:.3f}" for x in xs)


if __name__ == "__main__":
    stop_on_term()
    sys.exit(main())
