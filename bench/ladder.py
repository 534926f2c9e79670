#!/usr/bin/env python3
"""P6: rung switch time, from a failing rung's exit to the next rung's launch.

The supervisor walks a ladder whose first rung is the stand-in replaying the CUDA OOM that
llama-server printed on an H200 (kiln_dev/fake_llama_server.py; a CPU cannot run out of
GPU memory) and whose second rung execs the real llama-server. The supervisor measures the
switch on its own monotonic clock (engine exit as reaped -> next engine process started) and
reports it on /status; this script also times the whole walk from the outside.

    python bench/ladder.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import (REPO, SUPERVISOR_PYTHON, deploy_toml, env_without_kiln, free_port, llama_prefix, median, rung_toml,
                    spawn, status_code, stop, stop_on_term, wait_until)

FAKE = REPO / "kiln_dev" / "fake_llama_server.py"


def one(binary: Path, model: Path, tmp: Path) -> tuple[float, float, dict]:
    port, sport = free_port(), free_port()
    cfg = tmp / f"deploy-{port}.toml"
    rungs = (rung_toml("all-vram", ["-t", "1", "-c", "2048"], env={"KILN_FAKE_SCENARIO": "cuda-oom-h200"})
             + rung_toml("fallback", ["-t", "1", "-c", "2048"], env={"KILN_FAKE_SCENARIO": "real"}))
    cfg.write_text(deploy_toml(model=model, binary=FAKE, port=port, status_port=sport, state_dir=tmp / f"state-{port}",
                               rungs=rungs, snapshot=binary.parent.parent / "share/kiln/llama-server.help.txt"))
    env = env_without_kiln()
    env["KILN_FAKE_REAL_BINARY"] = str(binary)
    t0 = time.monotonic()
    p = spawn([SUPERVISOR_PYTHON, "-m", "supervisor", "run", "--config", str(cfg)], death_signal=signal.SIGTERM,
              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t1 = wait_until(lambda: status_code(f"http://127.0.0.1:{sport}/ready") == 200, 120)
        with urllib.request.urlopen(f"http://127.0.0.1:{sport}/status", timeout=5) as r:
            st = json.load(r)
    finally:
        stop(p, 60)
    return st["timings"]["last_rung_switch_s"], t1 - t0, st


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    from kiln_dev.models import make_tiny_gguf

    binary = llama_prefix() / "bin" / "llama-server"
    switches, walks = [], []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as t:
        tmp = Path(t)
        model = make_tiny_gguf(tmp / "tiny.gguf")
        for _ in range(args.runs):
            sw, walk, st = one(binary, model, tmp)
            assert st["rung"]["name"] == "fallback" and st["failures"] == {"oom": 1}, st
            switches.append(sw)
            walks.append(walk)
    print(f"{args.runs} runs: rung 1 OOM (recorded H200 text) -> rung 2 real llama-server")
    print(f"  rung switch (exit -> next launch)   median {median(switches):.4f} s  "
          f"(runs: {', '.join(f'{x:.4f}' for x in switches)})")
    print(f"  supervisor start -> /ready          median {median(walks):.3f} s")
    print("  baseline: anchors that wait out a fixed health timeout take up to 1200 s to move on")
    print(f"P6 rung_switch_s={median(switches):.4f}")
    return 0


if __name__ == "__main__":
    stop_on_term()
    sys.exit(main())
