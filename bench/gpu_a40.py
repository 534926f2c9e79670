#!/usr/bin/env python3
"""The A40 build proven on the lent H200 (issue 13 item 4): the binary build.sh compiled with
Kiln's compile script for CUDA arch 86, examined and served.

    python3 bench/gpu_a40.py [--root ROOT] --out $OUT [--prefix ROOT/a40] [--model GGUF]

  listing  cuobjdump --list-elf / --list-ptx of bin/llama-server: sm_86 machine code and
           compute_86 PTX must both be there (an H200 is sm_90: it can run only the PTX, JIT-compiled)
  smoke    `llama-server --version` against the driver stub, exactly as the image's fetch path
           runs it (a dir holding libcuda.so.1 -> the toolkit's stubs/libcuda.so, on LD_LIBRARY_PATH)
  floor    the CUDA the binary needs, measured by images/pins/cudafloor.py (share/kiln/cuda.json)
  serve    llama-server -ngl 99 on the model three times: JIT cache empty (CUDA_CACHE_PATH in the
           state volume), the same cache again (warm), and with CUDA_CACHE_DISABLE=1 (no cache,
           a second cold JIT as the control). Each: seconds to /health 200, one 256-token greedy
           completion's decode tok/s (llama.cpp's own timings), the cache directory's size after.
The figures go to OUT/gpu-a40.json; the last lines printed are the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_device_root, status_code  # noqa: E402

RESULTS: dict = {"date": time.strftime("%Y-%m-%d")}


def sh(argv: list[str], **kw) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=kw.pop("timeout", 120), **kw)
    except (OSError, subprocess.TimeoutExpired) as e:       # no cuobjdump here: say so in the record
        return subprocess.CompletedProcess(argv, 127, "", f"{type(e).__name__}: {e}")


def dir_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.exists() else 0


def health(port: int) -> int:
    return status_code(f"http://127.0.0.1:{port}/health")


def complete(port: int, n: int = 256) -> dict:
    body = json.dumps({"prompt": "The history of the printing press begins", "n_predict": n, "temperature": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        t = json.load(r).get("timings", {})
    return {"predicted_n": t.get("predicted_n"), "decode_tok_s": t.get("predicted_per_second"),
            "prompt_tok_s": t.get("prompt_per_second")}


def serve(binary: Path, model: Path, env: dict, log: Path, port: int, deadline_s: float) -> dict:
    t0 = time.monotonic()
    with open(log, "w") as f:
        p = subprocess.Popen([str(binary), "-m", str(model), "-ngl", "99", "-c", "4096", "--host", "127.0.0.1",
                              "--port", str(port)], env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        rec: dict = {}
        while time.monotonic() - t0 < deadline_s and p.poll() is None and health(port) != 200:
            time.sleep(0.1)
        rec["ready_s"] = round(time.monotonic() - t0, 2) if p.poll() is None and health(port) == 200 else None
        if rec["ready_s"] is not None:
            t1 = time.monotonic()
            rec["first_request"] = complete(port)
            rec["first_request_wall_s"] = round(time.monotonic() - t1, 2)
            rec["second_request"] = complete(port)
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)
    rec["exit"] = p.returncode
    rec["cuda_lines"] = [ln.strip() for ln in log.read_text(errors="replace").splitlines()
                         if "CUDA" in ln or "compute capability" in ln][:8]
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_root(ap)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--prefix", type=Path)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--port", type=int, default=18280)
    ap.add_argument("--wait-build-s", type=float, default=240, help="how long to wait for build.sh to finish")
    ap.add_argument("--deadline-s", type=float, default=300)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    prefix = a.prefix or a.root / "a40"
    model = a.model or next(iter(sorted((a.root / "models").glob("*.gguf"))), None)
    done = a.root / "build.done"
    t0 = time.monotonic()
    while not done.exists() and time.monotonic() - t0 < a.wait_build_s:
        time.sleep(2)
    RESULTS["build"] = done.read_text().strip() if done.exists() else f"not done after {a.wait_build_s:g} s"
    RESULTS["waited_for_build_s"] = round(time.monotonic() - t0, 1)
    shutil.copy(a.root / "build.log", a.out / "build.log") if (a.root / "build.log").exists() else None
    binary = prefix / "bin" / "llama-server"
    if not binary.is_file():
        print(json.dumps(RESULTS, indent=1))
        return 1
    elf, ptx = sh(["cuobjdump", "--list-elf", str(binary)]), sh(["cuobjdump", "--list-ptx", str(binary)])
    (a.out / "cuobjdump.txt").write_text(elf.stdout + elf.stderr + "\n---- ptx ----\n" + ptx.stdout + ptx.stderr)
    elves = [ln for ln in elf.stdout.splitlines() if ".cubin" in ln]
    ptxs = [ln for ln in ptx.stdout.splitlines() if ".ptx" in ln]
    RESULTS["cuobjdump"] = {"elf": len(elves), "elf_sm_86": sum("sm_86" in ln for ln in elves),
                            "elf_other": sorted({w for ln in elves for w in ln.split(".") if w.startswith("sm_")} - {"sm_86"}),
                            "ptx": len(ptxs), "ptx_compute_86": sum("sm_86" in ln or "compute_86" in ln for ln in ptxs)}
    stub = Path(RESULTS["build"].split("stubs=")[-1].strip()) / "libcuda.so" if "stubs=" in RESULTS["build"] else None
    sdir = a.root / "smoke-stubs"
    shutil.rmtree(sdir, ignore_errors=True)
    sdir.mkdir()
    if stub and stub.exists():
        (sdir / "libcuda.so.1").symlink_to(stub)
    smoke = sh([str(binary), "--version"], env={**os.environ, "LD_LIBRARY_PATH": str(sdir)})
    RESULTS["smoke_with_stub"] = {"rc": smoke.returncode, "stub": str(stub), "output": (smoke.stdout + smoke.stderr).strip()[-400:]}
    floor = prefix / "share/kiln/cuda.json"
    RESULTS["floor"] = json.loads(floor.read_text()) if floor.exists() else None
    why = a.root / "a40-floor.txt"      # cudafloor.py's stderr (build.sh): on 2026-12-01 the floor was null, why unknown
    RESULTS["floor_stderr"] = why.read_text(errors="replace")[-1200:] if why.exists() else None
    cache = a.root / "state-a40" / "cache" / "cuda-jit"
    shutil.rmtree(cache, ignore_errors=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_CACHE")}
    runs = {}
    for name, extra in (("cold", {"CUDA_CACHE_PATH": str(cache), "CUDA_CACHE_MAXSIZE": "4294967296"}),
                        ("warm", {"CUDA_CACHE_PATH": str(cache), "CUDA_CACHE_MAXSIZE": "4294967296"}),
                        ("no-cache", {"CUDA_CACHE_DISABLE": "1"})):
        runs[name] = serve(binary, model, {**base, **extra}, a.out / f"llama-a40-{name}.log", a.port, a.deadline_s)
        runs[name]["cache_bytes_after"] = dir_bytes(cache)
        (a.out / "gpu-a40.json").write_text(json.dumps({**RESULTS, "serve": runs}, indent=1))
    RESULTS["serve"] = runs
    RESULTS["model"] = str(model)
    (a.out / "gpu-a40.json").write_text(json.dumps(RESULTS, indent=1))
    print(json.dumps({k: RESULTS[k] for k in ("build", "cuobjdump", "smoke_with_stub")}, indent=1))
    for name, r in runs.items():
        fr = r.get("first_request") or {}
        sr = r.get("second_request") or {}
        print(f"{name:>9}: ready {r['ready_s']} s, first request {r.get('first_request_wall_s')} s, decode "
              f"{fr.get('decode_tok_s')} -> {sr.get('decode_tok_s')} tok/s, JIT cache {r['cache_bytes_after'] / 1e6:.1f} MB")
    cold, warm = runs["cold"].get("ready_s"), runs["warm"].get("ready_s")
    if cold and warm:
        print(f"JIT first-load cost: cold {cold} s, warm (cache reused) {warm} s: warm/cold={warm / cold:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
