#!/usr/bin/env python3
"""vLLM against Kiln's CUDA llama-server on one card and one model (issue 14 item 4).

    python3 bench/gpu_compare.py [--root ROOT] --out $OUT --hourly-usd 3.59

  llamacpp  llama-server (ROOT/h200 if build.sh made an sm_90 one, else the arch-86 A40 build,
            JIT cache warm from bench/gpu_a40.py) on the SmolLM2 Q4_1 GGUF, -ngl 99 --parallel 64
            --kv-unified; bench/serve.py --url: streams 1..64, aggregate and per-stream tok/s,
            $/1M at --hourly-usd, client overhead (P8).
  vllm      vLLM 0.26.0 on the same weights dequantized to bf16 (bench/gpu_model.py); the same
            bench/serve.py sweep; then the two regimes below, no speculation.
  ngram     vLLM again with n-gram speculative decoding (5 tokens, the field notes' method); the regimes,
            with vLLM's acceptance counters read from /metrics (drafts, drafted, accepted, per position).
  regimes   single stream, greedy, at most 256 tokens, 3 runs each, code editing (the reply re-emits
            a given function with one name changed: output that repeats its input) and prose (nothing
            to copy): tokens/s from the usage count and chunks/s on the client's clock, and tokens/s
            from /metrics' decode time.
The field notes' claims to reproduce or refute: vLLM's aggregate keeps growing with streams where
llama.cpp's flattens; n-gram speculation +86 % on editing, -43 % on prose, 68.2 % acceptance.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from common import add_device_root, status_code  # noqa: E402
from supervisor.selftest.client import Client  # noqa: E402
from supervisor.selftest.metrics import Counters, parse  # noqa: E402

CODE = '''def process(items, limit):
    """Return the first `limit` items that are not None, in order."""
    out = []
    for item in items:
        if item is None:
            continue
        out.append(item)
        if len(out) >= limit:
            break
    return out


def summarize(items):
    kept = process(items, 10)
    total = sum(len(str(x)) for x in kept)
    return {"count": len(kept), "chars": total}
'''
REGIMES = {
    "code-edit": [{"role": "user", "content": "Here is a Python module:\n\n" + CODE + "\nRewrite the whole module "
                   "with the function `process` renamed to `take_valid` everywhere. Output only the code."}],
    "prose": [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a message "
               "in a bottle."}],
}
SPEC = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
RESULTS: dict = {"date": time.strftime("%Y-%m-%d")}


def log(msg: str) -> None:
    print(f"[gpu_compare {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def health(port: int) -> int:
    return status_code(f"http://127.0.0.1:{port}/health")


def start(argv: list[str], env: dict, port: int, log_path: Path, deadline_s: float) -> tuple[subprocess.Popen, float | None]:
    t0 = time.monotonic()
    p = subprocess.Popen(argv, env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    while time.monotonic() - t0 < deadline_s and p.poll() is None and health(port) != 200:
        time.sleep(0.2)
    return p, (round(time.monotonic() - t0, 2) if p.poll() is None and health(port) == 200 else None)


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def sweep(a: argparse.Namespace, port: int, name: str) -> dict:
    out = a.out / f"serve-{name}"
    r = subprocess.run([sys.executable, str(HERE / "serve.py"), "--url", f"http://127.0.0.1:{port}",
                        "--max-streams", str(a.max_streams), "--tokens", str(a.tokens), "--hourly-usd", str(a.hourly_usd),
                        "--prefill-tokens", "3000", "--out", str(out)], capture_output=True, text=True, timeout=540)
    (a.out / f"serve-{name}.log").write_text(r.stdout + r.stderr)
    data = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    return {"rc": r.returncode, "levels": data.get("levels"), "p8": next((ln for ln in r.stdout.splitlines()
                                                                          if ln.startswith("P8 ")), None)}


def regimes(port: int, runs: int = 3) -> dict:
    c = Client(f"http://127.0.0.1:{port}", None, engine="vllm", timeout_s=120)
    out = {}
    for name, messages in REGIMES.items():
        rates, chunk_rates = [], []
        before = c.metrics()
        for _ in range(runs):
            r = c.chat(messages, max_tokens=256, stream=True, **c.greedy())
            steps, span = len(r.chunk_times) - 1, r.decode_span_s     # chunk steps, and their span
            # A speculating vLLM streams one chunk per engine step, holding every token accepted in it:
            # chunks/s is steps/s, tokens/s needs the usage count (2026-12-01 recorded chunks/s only)
            chunk_rates.append(round(steps / span, 2) if span else None)
            rates.append(round(r.decode_steps / span, 2) if span else None)
        after = c.metrics()
        d = Counters.from_text(after).minus(Counters.from_text(before))
        per_pos = {}
        for name2, samples in parse(after or "").items():
            if name2 == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                per_pos = {lbl.get("position"): v for lbl, v in samples}
        out[name] = {"tok_s": rates, "chunks_per_s": chunk_rates, "engine_tok_s": d.decode_tok_s,
                     "metrics": d.to_dict(), "acceptance": d.spec_acceptance,
                     "accepted_per_position_cumulative": per_pos, "sample": r.text[:300]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_root(ap)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--hourly-usd", type=float, required=True)
    ap.add_argument("--max-streams", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--port", type=int, default=18380)
    ap.add_argument("--steps", default="llamacpp,vllm,ngram")
    ap.add_argument("--deadline-s", type=float, default=300)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    k = a.root
    gguf = next(iter(sorted((k / "models").glob("*.gguf"))))
    h200 = k / "h200" / "bin" / "llama-server"
    llama = h200 if h200.is_file() else k / "a40" / "bin" / "llama-server"
    vllm_env = {**os.environ, **{v: str(k / "state-vllm" / "cache" / d) for v, d in (
        ("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"), ("TRITON_CACHE_DIR", "triton"),
        ("CUDA_CACHE_PATH", "cuda-jit"))}, "VLLM_USE_FLASHINFER_SAMPLER": "0"}   # flashinfer is not carried
    vllm_argv = [str(k / "bin" / "vllm"), "serve", str(k / "models" / "smollm2-bf16"), "--host", "127.0.0.1",
                 "--port", str(a.port), "--served-model-name", "smollm2", "--max-model-len", "4096",
                 "--gpu-memory-utilization", "0.85"]
    for step in a.steps.split(","):
        log(step)
        if step == "llamacpp":
            env = {**os.environ, "CUDA_CACHE_PATH": str(k / "state-a40" / "cache" / "cuda-jit"),
                   "CUDA_CACHE_MAXSIZE": "4294967296"}
            argv = [str(llama), "-m", str(gguf), "-ngl", "99", "--parallel", str(a.max_streams), "--kv-unified",
                    "-c", str(a.max_streams * 512), "--metrics", "--host", "127.0.0.1", "--port", str(a.port)]
            p, ready = start(argv, env, a.port, a.out / "llama-server.log", a.deadline_s)
            RESULTS[step] = {"binary": str(llama), "argv": argv, "ready_s": ready,
                             **(sweep(a, a.port, step) if ready else {})}
            stop(p)
        else:
            argv = vllm_argv + (["--speculative-config", json.dumps(SPEC)] if step == "ngram" else [])
            p, ready = start(argv, vllm_env, a.port, a.out / f"vllm-{step}.log", a.deadline_s)
            rec: dict = {"argv": argv, "ready_s": ready}
            if ready and step == "vllm":
                rec.update(sweep(a, a.port, step))
            if ready:
                rec["regimes"] = regimes(a.port)
            RESULTS[step] = rec
            stop(p)
        (a.out / "gpu-compare.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    for step in ("llamacpp", "vllm"):
        for lv in (RESULTS.get(step) or {}).get("levels") or []:
            print(f"{step:>8} {lv['streams']:>3} streams: aggregate {lv['aggregate_tok_s']:>9.1f} tok/s, per stream "
                  f"{lv['per_stream_client_tok_s']}, $/1M {lv['usd_per_m_output']}")
        print(f"{step}: {(RESULTS.get(step) or {}).get('p8')}")
    base, spec = (RESULTS.get("vllm") or {}).get("regimes") or {}, (RESULTS.get("ngram") or {}).get("regimes") or {}
    for name in REGIMES:
        b, s = base.get(name, {}).get("tok_s") or [], spec.get(name, {}).get("tok_s") or []
        mb = sorted(x for x in b if x)[len(b) // 2] if any(b) else None
        ms = sorted(x for x in s if x)[len(s) // 2] if any(s) else None
        print(f"ngram {name}: {mb} -> {ms} tok/s ({'%+.0f %%' % ((ms / mb - 1) * 100) if mb and ms else '?'}), "
              f"acceptance {spec.get(name, {}).get('acceptance')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
