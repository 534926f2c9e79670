#!/usr/bin/env python3
"""P20: the time to first token of a long cached prompt right after a restart Kiln makes, over the
same request's warm time before it (issue 51). Three restarts:

    reload      a published config (a [sampler] change: a new engine, the same computation)
    restart     the supervisor stopped (TERM) and started again on the same state dir
    serverless  a fresh Serverless worker of the same endpoint (another pod id, the same volume)

Each over `warm`: the same request answered from the engine's own prompt cache before the restart
(the median of --warm-runs). Beside them, `cold`: the same request with nothing cached, which is
what every restart gave before Kiln kept the cache ([cache] keep = false gives it still; measured on
the restart path in this run as `restart_keep_off`).

TTFT is measured from the request sent to the first streamed token (llama-server's /completion,
stream, temperature 0, n_predict 8). Engine: the pinned CPU llama-server (build 11434); model
SmolLM2-135M-Instruct Q8_0; prompt at least 4,000 tokens (the engine's prompt_n says how many).
Every run appends a JSON line to bench/out/prompt_cache.jsonl (kept, never overwritten).

    python bench/prompt_cache.py [--facts 320] [--threads 2] [--warm-runs 3]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from common import (REPO, SUPERVISOR_PYTHON, deploy_toml, env_without_kiln, free_port, llama_prefix, median,
                    rung_toml, spawn, stop, stop_on_term, wait_until)

OUT = REPO / "bench" / "out"


def prompt(facts: int) -> str:
    return " ".join(f"Fact {i}: the number {i} is {'even' if i % 2 == 0 else 'odd'}." for i in range(facts))


def ttft(port: int, text: str) -> tuple[float, int, str]:
    """Seconds from the request sent to the first streamed token; the prompt tokens the engine computed
    (prompt_n: 1-4 when its cache held the prompt); the answer's text."""
    body = json.dumps({"prompt": text, "n_predict": 8, "temperature": 0, "cache_prompt": True, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    t0 = time.monotonic()
    conn.request("POST", "/completion", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"/completion answered {resp.status}: {resp.read()[:300]!r}")
    first, prompt_n, content = None, -1, []
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        chunk = json.loads(line[5:])
        if first is None and chunk.get("content"):
            first = time.monotonic() - t0
        content.append(chunk.get("content", ""))
        if chunk.get("stop"):
            prompt_n = int((chunk.get("timings") or {}).get("prompt_n", -1))
            break
    conn.close()
    if first is None:
        raise RuntimeError("the engine streamed no token")
    return first, prompt_n, "".join(content)


def status(sport: int) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{sport}/status", timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return {}


class Supervisor:
    """One `python -m supervisor run` on `state`, its engine on `port`."""

    def __init__(self, home: Path, text: str, env: dict[str, str], sport: int):
        home.mkdir(parents=True, exist_ok=True)
        (home / "boot.toml").write_text(text)
        self.sport = sport
        self.log = open(home / "supervisor.log", "ab")
        self.proc = spawn([SUPERVISOR_PYTHON, "-m", "supervisor", "run", "--config", str(home / "boot.toml")],
                          death_signal=signal.SIGTERM, cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def serving(self, launches: int = 1, timeout: float = 600) -> dict:
        wait_until(lambda: (s := status(self.sport)).get("state") == "SERVING" and s.get("launches", 0) >= launches,
                   timeout, interval=0.05)
        return status(self.sport)

    def close(self) -> None:
        stop(self.proc, 120)          # TERM: the supervisor saves the slot before its engine stops
        self.log.close()


class Bench:
    def __init__(self, tmp: Path, facts: int, threads: int):
        prefix = llama_prefix()
        from kiln_dev.models import smollm2_gguf

        self.binary, self.model, self.threads, self.tmp = prefix / "bin" / "llama-server", smollm2_gguf(), threads, tmp
        self.prompt = prompt(facts)
        self.port, self.sport = free_port(), free_port()
        self.published = tmp / "published"
        self.published.mkdir()

    def text(self, state: Path, *, temperature: float = 0.0, keep: bool = True) -> str:
        args = ["-t", str(self.threads), "-c", "8192", "-np", "1"]
        extra = (f"[sampler]\ntemperature = {temperature}\n[cache]\nkeep = {'true' if keep else 'false'}\n"
                 f'min_tokens = 256\n[watch]\ndir = "{self.published}"\ndebounce_s = 0.2\n')
        return deploy_toml(model=self.model, binary=self.binary, port=self.port, status_port=self.sport,
                           state_dir=state, rungs=rung_toml("cpu", args), extra=extra)

    def start(self, name: str, state: Path, env: dict[str, str] | None = None, keep: bool = True) -> Supervisor:
        return Supervisor(self.tmp / name, self.text(state, keep=keep), {**env_without_kiln(), **(env or {})},
                          self.sport)

    def ask(self, what: str, results: dict) -> tuple[float, int, str]:
        t, n, content = ttft(self.port, self.prompt)
        results.setdefault("requests", []).append({"what": what, "ttft_s": round(t, 4), "prompt_n": n})
        print(f"  {what:<34} ttft {t:8.3f} s   prompt_n {n}")
        return t, n, content

    def warm(self, runs: int, results: dict, what: str) -> tuple[float, float, str]:
        cold, _, answer = self.ask(f"{what}: cold (nothing cached)", results)
        return cold, median([self.ask(f"{what}: warm", results)[0] for _ in range(runs)]), answer


def run(args: argparse.Namespace, results: dict) -> None:
    with tempfile.TemporaryDirectory(prefix="kiln-p20-") as d:
        b = Bench(Path(d), args.facts, args.threads)
        state = b.tmp / "state"
        same = {}
        # reload, then a restart on the same state dir
        sup = b.start("pod", state)
        try:
            sup.serving()
            cold, warm, answer = b.warm(args.warm_runs, results, "pod")
            (b.published / "deploy.toml").write_text(b.text(state, temperature=0.5))
            sup.serving(launches=2)
            reload_t, reload_n, reload_answer = b.ask("after a hot reload", results)
            same["reload"] = reload_answer == answer
        finally:
            sup.close()
        (b.published / "deploy.toml").unlink()
        sup = b.start("pod-again", state)
        try:
            sup.serving()
            restart_t, restart_n, restart_answer = b.ask("after a supervisor restart", results)
            same["restart"] = restart_answer == answer
        finally:
            sup.close()
        # today's behaviour: the same restart with [cache] keep = false
        sup = b.start("pod-keep-off", state, keep=False)
        try:
            sup.serving()
            off_t, off_n, _ = b.ask("after a restart, keep = false", results)
        finally:
            sup.close()
        # a Serverless endpoint: worker one serves and is scaled down; worker two starts on the volume
        volume = b.tmp / "volume"
        endpoint = {"PORT": str(b.port), "PORT_HEALTH": str(b.sport), "RUNPOD_ENDPOINT_ID": "ep-p20"}
        one = b.start("worker-one", volume, {**endpoint, "RUNPOD_POD_ID": "worker-one"})
        try:
            one.serving()
            w_cold, w_warm, w_answer = b.warm(args.warm_runs, results, "worker one")
        finally:
            one.close()
        two = b.start("worker-two", volume, {**endpoint, "RUNPOD_POD_ID": "worker-two"})
        try:
            two.serving()
            sl_t, sl_n, sl_answer = b.ask("a fresh serverless worker", results)
            same["serverless"] = sl_answer == w_answer
        finally:
            two.close()
    ratios = {"reload": reload_t / warm, "restart": restart_t / warm, "serverless": sl_t / w_warm}
    results.update(warm_s=round(warm, 4), cold_s=round(cold, 4), worker_warm_s=round(w_warm, 4),
                   worker_cold_s=round(w_cold, 4), restart_keep_off_s=round(off_t, 4),
                   prompt_n_after={"reload": reload_n, "restart": restart_n, "serverless": sl_n,
                                   "keep_off": off_n},
                   same_answer=same, ratios={k: round(v, 3) for k, v in ratios.items()},
                   cold_over_warm=round(cold / warm, 2), keep_off_over_warm=round(off_t / warm, 2))
    print(f"\nwarm {warm:.3f} s (pod), {w_warm:.3f} s (worker one); cold {cold:.3f} s; "
          f"a restart with keep = false {off_t:.3f} s")
    print("the same answer as before the restart, token for token (temperature 0): "
          + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in same.items()))
    print(f"today's cost of a restart (cold over warm): {cold / warm:.1f}x; keep = false over warm: {off_t / warm:.1f}x")
    print(f"P20 ttft_after_restart_over_warm={max(ratios.values()):.3f} "
          + " ".join(f"{k}={v:.3f}" for k, v in ratios.items()) + "  (goal: each <= 2)")


def main() -> None:
    stop_on_term()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--facts", type=int, default=320, help="prompt length in facts (~13 tokens each)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warm-runs", type=int, default=3)
    args = ap.parse_args()
    load0 = os.getloadavg()
    results: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(),
                     "cpus": os.cpu_count(), "load_start": round(load0[0], 2), "facts": args.facts,
                     "threads": args.threads}
    print(f"{results['date']}  {platform.node()}  {os.cpu_count()} CPUs  load {load0[0]:.2f}  "
          f"llama-server (pinned CPU build), SmolLM2-135M-Instruct, {args.threads} threads")
    run(args, results)
    results["load_end"] = round(os.getloadavg()[0], 2)
    print(f"load average {results['load_start']:.2f} at the start, {results['load_end']:.2f} at the end")
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "prompt_cache.jsonl", "a") as f:
        f.write(json.dumps(results) + "\n")
    print(f"kept in {OUT / 'prompt_cache.jsonl'}")


if __name__ == "__main__":
    main()
