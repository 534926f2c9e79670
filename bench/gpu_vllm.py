#!/usr/bin/env python3
"""Kiln's supervisor boots a real vLLM on the lent H200 (issue 14, items 2, 5 and 6's P2/P11).

    python3 bench/gpu_vllm.py [--root ROOT] --out $OUT [--vllm ROOT/bin/vllm] [--model DIR]

One call, in this order (every boot's /status, the engine logs and the GPU's process list land in
--out; the last lines printed are the figures):
  A  supervised boot, empty state volume (emptied first). Rung "too-long" asks --max-model-len 20,000,000
     (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, --enforce-eager so it fails without compiling): its KV cache
     (~23 KB a token for SmolLM2-135M: 460 GB) cannot fit the card. vLLM 0.26.0 fails before its
     KV-cache check: pinning a host buffer of max_num_reqs x max_model_len tokens, "CUDA error: out
     of memory" (2026-12-01). Kiln classifies it from vLLM's words, waits at the reclaim barrier,
     falls through to rung "fits". The
     selftest runs on real vLLM output (probes, decode tok/s, prefill); then five 512-token greedy
     requests to the engine's port, tok/s from the stream and from vLLM's own /metrics, the median
     taken (P2, supervised).
  stop  SIGTERM to the supervisor; then no process may hold GPU memory (vLLM #55510: orphans hold VRAM).
  bare  the same argv as rung "fits", without Kiln, caches on the same volume (warm): the same
        five 512-token requests (P2, bare).
  B  supervised boot again on the same state volume: the ladder starts at the remembered rung and
     vLLM's torch.compile / Inductor / Triton caches are warm (supervisor/engines/caches.py).
     P11 warm_boot_over_cold = B's engine load time / A's load time of the same rung.
  C  (optional) A again: the volume emptied once more, so the cold figure is taken twice and the
     page cache, warm by then, is not what makes B fast (P11 is also printed against C).
Steps may repeat (--steps bare,B,bare,B,...: each boot keeps its own files, keyed B#2 ...); P2 is
printed for boot A against bare, and pooled over every request of every supervised boot against
every bare one (one argv's boots differed by up to 50 % on 2026-12-01: one boot a side is no P2).
On a machine without a GPU the same steps run against any `vllm`-shaped executable (--vllm), to
check the driver's flow; such figures mean nothing (docs/research/device-plan-2026-12-01.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common import add_device_root  # noqa: E402
from supervisor.selftest.client import Client, ClientError  # noqa: E402
from supervisor.selftest.metrics import Counters  # noqa: E402

KEY = "kiln-device-run-key"
RESULTS: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "steps": {}}


def log(msg: str) -> None:
    print(f"[gpu_vllm {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError:
        return 0, ""


def final_status(sport: int) -> tuple[dict[str, Any], str | None]:
    """A boot's /status once it is over, and why not when it could not be read: three tries of 10 s
    (a loaded machine can take seconds to answer, and a lost read is not a figure)."""
    code = 0
    for _ in range(3):
        code, text = get(f"http://127.0.0.1:{sport}/status", timeout=10.0)
        if code == 200:
            return json.loads(text), None
    return {}, f"/status did not answer 200 (last: {code})"


def gpu_apps() -> list[str]:
    """Processes holding GPU memory, as nvidia-smi sees them ([] on a machine without one)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.splitlines() if line.strip() and "No running" not in line]


def wait(cond, deadline_s: float, poll: float = 0.2) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if cond():
            return time.monotonic() - t0
        time.sleep(poll)
    return None


def config(a: argparse.Namespace, state: Path, port: int, sport: int, *, remember: bool = True) -> str:
    # flashinfer is not carried (docs/research/device-plan-2026-12-01.md): without this, vLLM 0.26.0's
    # sampler imports its FlashInfer backend on CUDA and fails (v1/sample/ops/topk_topp_sampler.py)
    no_fi = 'VLLM_USE_FLASHINFER_SAMPLER = "0"\n'
    oom_env = '[ladder.rungs.env]\nVLLM_ALLOW_LONG_MAX_MODEL_LEN = "1"\n' + no_fi
    return f"""# written by bench/gpu_vllm.py
engine = "vllm"
state_dir = "{state}"
[model]
source = "{a.model}"
entry = "config.json"
family = "smollm2"
[server]
host = "127.0.0.1"
port = {port}
binary = "{a.vllm}"
flag_snapshot = "{a.snapshot}"
api_key = "env:KILN_API_KEY"
[ladder]
fall_through = ["oom", "config_rejected"]
remember = {str(remember).lower()}
[[ladder.rungs]]
name = "too-long"
placement = "engine"
args = ["--max-model-len", "20000000", "--enforce-eager"]
{oom_env}
[[ladder.rungs]]
name = "fits"
placement = "engine"
args = {json.dumps(a.fits)}
[ladder.rungs.env]
{no_fi}[health]
stall_s = {a.stall_s}
[selftest]
enabled = {str(a.selftest).lower()}
decode_tokens = 256
prefill_tokens = 3000
[status]
host = "127.0.0.1"
port = {sport}
"""


def decode(port: int, tokens: int = 512, runs: int = 5) -> dict[str, Any]:
    """`runs` greedy requests of `tokens` tokens to the engine, each rated from the stream and from
    /metrics; the median is the figure. On 2026-12-01 one request a boot was taken, and two
    consecutive requests of one engine differed by 27 % (409 and 520 tok/s): one is not a P2."""
    c = Client(f"http://127.0.0.1:{port}", KEY, engine="vllm", timeout_s=120)
    samples = []
    for _ in range(runs):
        before = Counters.from_text(c.metrics())
        r = c.complete("The history of the printing press begins", max_tokens=tokens, stream=True,
                       ignore_eos=True, **c.greedy())
        delta = Counters.from_text(c.metrics()).minus(before)
        steps, span = r.decode_steps, r.decode_span_s
        samples.append({"tokens": r.completion_tokens, "client_tok_s": round(steps / span, 2) if span else None,
                        "metrics_tok_s": round(delta.decode_tok_s, 2) if delta.decode_tok_s else None,
                        "metrics": delta.to_dict()})
    return {"client_tok_s": median(s["client_tok_s"] for s in samples),
            "metrics_tok_s": median(s["metrics_tok_s"] for s in samples), "samples": samples}


def decode_or_error(port: int) -> dict[str, Any]:
    """decode(), or the reason it failed: one failed request must not cost the call's later steps."""
    try:
        return decode(port)
    except (ClientError, OSError) as e:
        return {"error": str(e)[:600]}


def median(values) -> float | None:
    xs = sorted(v for v in values if v is not None)
    return xs[len(xs) // 2] if xs else None


def supervised(a: argparse.Namespace, name: str, state: Path) -> dict[str, Any]:
    port, sport = a.port, a.port + 1
    if get(f"http://127.0.0.1:{sport}/status")[0] or get(f"http://127.0.0.1:{port}/health")[0]:
        # figures read from a server left over from before would be that server's
        return {"error": f"port {sport} or {port} already answers: something from an earlier run is still up"}
    cfg = a.out / f"deploy-{name}.toml"
    cfg.write_text(config(a, state, port, sport))
    env = {**os.environ, "KILN_API_KEY": KEY, "PYTHONPATH": str(REPO), "KILN_EXIT_ON_FAILURE": "1"}
    logf = open(a.out / f"supervisor-{name}.log", "w")
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(cfg)], cwd=str(REPO),
                            env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    snaps: list[dict[str, Any]] = []

    def ready() -> bool:
        code, text = get(f"http://127.0.0.1:{sport}/status")
        if code == 200:
            snaps.append(json.loads(text))
        return proc.poll() is not None or get(f"http://127.0.0.1:{sport}/ready")[0] == 200

    try:
        rec = observe(a, name, proc, t0, ready, snaps, port, sport)
    finally:
        rec_stop = stop(proc, a)     # also when observing failed: nothing of this boot outlives it
        logf.close()
    rec["stop"] = rec_stop
    return rec


def observe(a, name, proc, t0, ready, snaps, port, sport) -> dict[str, Any]:
    waited = wait(ready, a.boot_deadline_s, 0.5)
    rec: dict[str, Any] = {"ready_s": None if waited is None or proc.poll() is not None else round(time.monotonic() - t0, 2)}
    status, status_error = final_status(sport)
    (a.out / f"status-{name}.json").write_text(json.dumps(status, indent=1))
    states = []
    for s in snaps + ([status] if status else []):   # a poll read /status just before /ready: add the state after
        st = s.get("state")
        if not states or states[-1] != st:
            states.append(st)
    if status_error:
        rec["status_error"] = status_error
    rec.update(states_seen=states, timings=status.get("timings"), selftest=status.get("selftest"),
               last_failure=status.get("last_failure"), failures=status.get("counters", status.get("failures")),
               history=[e for e in status.get("history", status.get("events", [])) if isinstance(e, dict)][-40:],
               stalled=any("stall" in json.dumps(e).lower() for e in status.get("history", status.get("events", []))),
               gpu_apps_serving=gpu_apps())
    if rec["ready_s"] is not None:
        rec["decode"] = decode_or_error(port)
    return rec


def stop(proc: subprocess.Popen, a: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait(10)
    exited = time.monotonic() - t0
    freed = wait(lambda: not gpu_apps(), 30, 0.5)
    return {"exit": code, "exit_s": round(exited, 2), "gpu_free_after_s": None if freed is None else round(freed, 2),
            "gpu_apps_left": gpu_apps()}


def bare(a: argparse.Namespace, state: Path, tag: str = "bare") -> dict[str, Any]:
    from supervisor.config import load_config
    from supervisor.engines import vllm

    path = a.out / f"deploy-{tag}.toml"     # the supervised boots' config: the same rung "fits"
    path.write_text(config(a, state, a.port, a.port + 1))
    cfg = load_config(path, env={"KILN_API_KEY": KEY})
    rung = next(r for r in cfg.ladder.rungs if r.name == "fits")
    argv = vllm.build_argv(cfg, rung, model_path=str(Path(a.model) / "config.json"))
    env = {**vllm.engine_defaults(cfg, rung), **os.environ, **rung.env, **vllm.engine_env(cfg, rung, KEY)}
    logf = open(a.out / f"vllm-{tag}.log", "w")
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    up = wait(lambda: proc.poll() is not None or get(f"http://127.0.0.1:{a.port}/health")[0] == 200, a.boot_deadline_s, 0.2)
    rec: dict[str, Any] = {"argv": argv, "ready_s": None if up is None or proc.poll() is not None else round(time.monotonic() - t0, 2)}
    if rec["ready_s"] is not None:
        rec["decode"] = decode_or_error(a.port)
    t1 = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    freed = wait(lambda: not gpu_apps(), 30, 0.5)
    rec["stop"] = {"exit_s": round(time.monotonic() - t1, 2), "gpu_free_after_s": freed, "gpu_apps_left": gpu_apps()}
    logf.close()
    return rec


# vLLM 0.26.0's own words for a torch.compile cache hit or miss, and the totals (compilation/backends.py,
# compilation/monitor.py, v1/engine/core.py), as the H200 printed them
COMPILE = re.compile(r"Directly load the compiled graph|Compiling a graph for compile range|torch\.compile took"
                     r"|init engine \(profile")


def compile_lines(log_path: Path) -> list[str]:
    """Per boot in the log: whether torch.compile came from the cache, and how long it and init took."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return [ln.split("] ", 1)[-1][:160] for ln in text.splitlines() if COMPILE.search(ln)]


COLD = ("A", "C")   # the steps that boot on an emptied state volume


def ratio(x: float | None, y: float | None) -> float | None:
    return round(x / y, 4) if x and y else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_root(ap)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--vllm", help="default ROOT/bin/vllm")
    ap.add_argument("--model", help="default ROOT/models/smollm2-bf16")
    ap.add_argument("--snapshot", help="vLLM's --help=all; default: taken now from --vllm")
    ap.add_argument("--fits", type=json.loads, default=["--max-model-len", "4096", "--gpu-memory-utilization", "0.85"])
    ap.add_argument("--port", type=int, default=18180)
    ap.add_argument("--stall-s", type=float, default=120.0)
    ap.add_argument("--boot-deadline-s", type=float, default=420.0)
    ap.add_argument("--steps", default="A,bare,B,C")
    ap.add_argument("--no-selftest", dest="selftest", action="store_false",
                    help="boot without the selftest (a dry run on a stand-in that cannot answer like the model)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    a.vllm = a.vllm or str(a.root / "bin" / "vllm")
    a.model = a.model or str(a.root / "models" / "smollm2-bf16")
    if not a.snapshot:
        a.snapshot = str(a.out / "vllm-serve-help-all.txt")
        with open(a.snapshot, "w") as f:
            subprocess.run([a.vllm, "serve", "--help=all"], stdout=f, stderr=subprocess.DEVNULL, timeout=300)
    state = a.root / "state-vllm"
    steps = a.steps.split(",")
    seen: dict[str, int] = {}
    for name in steps:
        log(f"step {name}")
        if name in COLD:
            # A and C are the cold boots of P11: on 2026-12-01 the volume still held the compile caches
            # of the call before, A loaded its graphs from them and P11 compared two warm boots
            shutil.rmtree(state, ignore_errors=True)
        seen[name] = seen.get(name, 0) + 1
        key = name if seen[name] == 1 else f"{name}#{seen[name]}"
        tag = key.replace("#", "-")    # a step may repeat (bare,B,bare,B): each boot keeps its own files
        RESULTS["steps"][key] = bare(a, state, tag) if name == "bare" else supervised(a, tag, state)
        RESULTS["steps"][key]["torch_compile"] = compile_lines(a.out / (f"vllm-{tag}.log" if name == "bare"
                                                                        else f"supervisor-{tag}.log"))
        (a.out / "gpu-vllm.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    s = RESULTS["steps"]
    A, B, C, bare_run = s.get("A", {}), s.get("B", {}), s.get("C", {}), s.get("bare", {})
    load = lambda r: (r.get("timings") or {}).get("last_load_s")  # noqa: E731
    RESULTS["P2_supervised_over_bare_decode"] = ratio((A.get("decode") or {}).get("client_tok_s"),
                                                      (bare_run.get("decode") or {}).get("client_tok_s"))
    # every request of every boot pooled, supervised against bare: the spread between boots
    # (2026-12-01: medians 388-528 tok/s for one argv) is wider than between two requests
    pool = lambda sup: median(x["client_tok_s"] for k, r in s.items() if (k.split("#")[0] != "bare") == sup  # noqa: E731
                              for x in (r.get("decode") or {}).get("samples", []))
    RESULTS["P2_pooled_supervised_over_bare_decode"] = ratio(pool(True), pool(False))
    RESULTS["P11_warm_boot_over_cold"] = ratio(load(B), load(A))
    RESULTS["P11_warm_boot_over_cold_again"] = ratio(load(B), load(C))
    (a.out / "gpu-vllm.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    for name, r in s.items():
        d = r.get("decode") or {}
        log(f"{name}: ready {r.get('ready_s')} s, load {load(r)} s, states {r.get('states_seen')}, "
            f"failure {(r.get('last_failure') or {}).get('class')}, selftest "
            f"{(r.get('selftest') or {}).get('passed')}, decode {d.get('client_tok_s')} tok/s "
            f"(metrics {d.get('metrics_tok_s')}), stop {r.get('stop')}")
    print(f"P2 supervised_over_bare_decode={RESULTS['P2_supervised_over_bare_decode']}")
    print(f"P2 supervised_over_bare_decode (every request of every boot pooled)="
          f"{RESULTS['P2_pooled_supervised_over_bare_decode']}")
    print(f"P11 warm_boot_over_cold={RESULTS['P11_warm_boot_over_cold']}")
    if C:
        print(f"P11 warm_boot_over_cold (against C, cold again)={RESULTS['P11_warm_boot_over_cold_again']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
