#!/usr/bin/env python3
"""P2b: the supervisor's own CPU while its engine serves — CPU seconds / wall seconds of the
supervisor process alone (its threads; not the engine's tree) during a concurrency sweep.

    python bench/supervisor_cpu.py [--model smollm2|tiny|PATH] [--max-streams 64] [--tokens 64]
                                   [--threads 2] [--scrape-s 5] [--probe-s 0] [--idle-s 20] [--out FILE]
    on a GPU:  ... --prefix DIR --gpu                   (a CUDA llama-server, autofit placement)
               ... --engine vllm --vllm BIN --model DIR (vLLM, --max-model-len 4096)

A real supervisor (`python -m supervisor run`, under $KILN_BENCH_PYTHON when set) runs the real
llama-server with `--parallel <max-streams> --kv-unified`, the selftest off, the TCP relay on and
idle (clients talk to the engine's port, as they do on a pod). A monitor scrapes it as one would:
/status and /metrics every --scrape-s seconds (issue 28's definition of P2b), and with --probe-s N
/ready every N seconds as well (a load balancer's probe; off by default). The supervisor's CPU is psutil's cpu_times() of its process (user +
system of all its threads, children excluded), read before and after:

  idle   --idle-s seconds of serving nothing, the monitor only
  sweep  bench/serve.py's sweep (1, 2, 4, ... --max-streams streams of --tokens tokens each, raw
         completions tagged per stream, ignore_eos), the monitor on

and prints each share, the engine's CPU over the sweep for scale, the supervisor's threads by CPU
(Linux: per-thread times; Python names are not visible from outside, so threads are told apart by
what they cost), then `P2b supervisor_cpu_share=<sweep share>` (goal: <= 0.002). A measurement,
not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from common import (REPO, SUPERVISOR_PYTHON, deploy_toml, env_without_kiln, free_port, llama_prefix, rung_toml, spawn,
                    status_code, stop, stop_on_term, wait_until)
from serve import levels, run_level

from supervisor.selftest.client import Client

GOAL = 0.002


class Monitor(threading.Thread):
    """Scrapes the supervisor's status port as a monitor and a load balancer would."""

    def __init__(self, base: str, scrape_s: float, probe_s: float) -> None:
        super().__init__(name="monitor", daemon=True)
        self.base, self.scrape_s, self.probe_s = base, scrape_s, probe_s
        self.stopped = threading.Event()
        self.counts = {"/status": 0, "/metrics": 0, "/ready": 0, "errors": 0}

    def get(self, path: str) -> None:
        try:
            with urllib.request.urlopen(self.base + path, timeout=5) as r:
                r.read()
            self.counts[path] += 1
        except OSError:
            self.counts["errors"] += 1

    def run(self) -> None:
        next_scrape = next_probe = time.monotonic()
        while not self.stopped.is_set():
            now = time.monotonic()
            if now >= next_scrape:
                self.get("/status")
                self.get("/metrics")
                next_scrape = now + self.scrape_s
            if self.probe_s > 0 and now >= next_probe:
                self.get("/ready")
                next_probe = now + self.probe_s
            wake = min(next_scrape, next_probe if self.probe_s > 0 else next_scrape)
            self.stopped.wait(max(0.0, wake - time.monotonic()))

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def tree_cpu_s(p: psutil.Process) -> float:
    total = 0.0
    for c in p.children(recursive=True):
        try:
            total += cpu_s(c)
        except psutil.NoSuchProcess:
            pass
    return total


def threads(p: psutil.Process) -> dict[int, float]:
    return {t.id: t.user_time + t.system_time for t in p.threads()}


def wakeups(p: psutil.Process) -> int:
    """Voluntary context switches summed over the process's threads (Linux): how often it slept and
    woke; 0 where /proc does not say."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{p.pid}/task"):
            with open(f"/proc/{p.pid}/task/{tid}/status") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches")), 0)
    except OSError:
        pass
    return total


# A lone Python thread that sleeps a second at a time, five times: the CPU share it is charged is the
# floor under every thread of the supervisor that waits with a timeout, on this machine, measured in
# the same run. On the CPU machine's VM (2026-12-02) it was ~0.005 however long each sleep (0.5 ms a
# wake-up after 0.1 s, 4.7 ms after 1 s, ~24 ms after 5 s); on the H200's machine each of the idle
# supervisor's three waking threads was charged 0.0005 (its P2b run, 2026-12-02).
_WAKER = ("import time\nst=lambda: int(open('/proc/self/schedstat').read().split()[0])\n"
          "time.sleep(1); c=st(); t=time.monotonic()\nfor _ in range(5): time.sleep(1)\n"
          "print((st()-c)/1e9/(time.monotonic()-t))\n")


def sleeper_share() -> float | None:
    try:
        r = subprocess.run([sys.executable, "-c", _WAKER], capture_output=True, text=True, timeout=30)
        return round(float(r.stdout.strip()), 6)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None                     # no schedstat here: the figure is left out


def window(sup: psutil.Process, work: Any) -> dict[str, Any]:
    """Run work() and return the supervisor's CPU over its wall time, the engine's, per thread, and
    how many times the supervisor woke."""
    th0, c0, e0, w0, t0 = threads(sup), cpu_s(sup), tree_cpu_s(sup), wakeups(sup), time.monotonic()
    out = work()
    t1, c1, e1, th1, w1 = time.monotonic(), cpu_s(sup), tree_cpu_s(sup), threads(sup), wakeups(sup)
    wall = t1 - t0
    per = sorted(((tid, th1[tid] - th0.get(tid, 0.0)) for tid in th1), key=lambda x: -x[1])
    return {"wall_s": round(wall, 3), "supervisor_cpu_s": round(c1 - c0, 4),
            "share": round((c1 - c0) / wall, 6) if wall > 0 else None,
            "engine_cpu_s": round(e1 - e0, 3), "threads": [{"tid": tid, "cpu_s": round(s, 4)} for tid, s in per if s > 0],
            "wakeups": w1 - w0, "result": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2 | tiny | a GGUF path (default smollm2)")
    ap.add_argument("--max-streams", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="the engine's -t (default 2)")
    ap.add_argument("--ctx-per-stream", type=int, default=256)
    ap.add_argument("--min-sweep-s", type=float, default=0.0,
                    help="run the whole sweep again until this long has passed (a fast GPU finishes one in "
                         "seconds: too few of the kernel's 10 ms CPU ticks to tell 0.002 from 0.004)")
    ap.add_argument("--scrape-s", type=float, default=5.0, help="/status and /metrics every N s (default 5)")
    ap.add_argument("--probe-s", type=float, default=0.0, help="/ready every N s as well (default 0: off)")
    ap.add_argument("--idle-s", type=float, default=20.0, help="the idle window before the sweep (default 20)")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    ap.add_argument("--engine", choices=("llamacpp", "vllm"), default="llamacpp")
    ap.add_argument("--prefix", type=Path, help="llama.cpp: the llama-server prefix (default: the CPU build)")
    ap.add_argument("--gpu", action="store_true", help="llama.cpp: autofit placement, no -t (a CUDA build)")
    ap.add_argument("--vllm", help="vLLM: the `vllm` executable")
    ap.add_argument("--vllm-env", type=json.loads, default={"VLLM_USE_FLASHINFER_SAMPLER": "0"},
                    help="vLLM: the rung's environment (JSON; default: the device run's, no FlashInfer sampler)")
    args = ap.parse_args()
    if args.engine == "llamacpp" and args.tokens + 64 > args.ctx_per_stream:   # the prompt takes some too
        ap.error(f"--tokens {args.tokens} does not fit --ctx-per-stream {args.ctx_per_stream} (each stream's share of "
                 f"the engine's context): give --ctx-per-stream {args.tokens + 64} or more")
    with tempfile.TemporaryDirectory(prefix="kiln-bench-supcpu-") as t:
        tmp = Path(t)
        port, sport, tcp = free_port(), free_port(), free_port()
        cfg = tmp / "deploy.toml"
        cfg.write_text(config_text(args, tmp, port, sport))
        env = {**env_without_kiln(), "KILN_TCP_PORT": str(tcp)}       # the relay on, and idle
        log = open(tmp / "supervisor.log", "w")
        proc = spawn([SUPERVISOR_PYTHON, "-m", "supervisor", "run", "--config", str(cfg)], death_signal=signal.SIGTERM,
                     cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        mon = None
        try:
            wait_until(lambda: proc.poll() is not None or status_code(f"http://127.0.0.1:{sport}/ready") == 200, 300, 0.02)
            if proc.poll() is not None:
                sys.exit(f"the supervisor exited {proc.returncode}: {(tmp / 'supervisor.log').read_text()[-2000:]}")
            sup = psutil.Process(proc.pid)
            mon = Monitor(f"http://127.0.0.1:{sport}", args.scrape_s, args.probe_s)
            mon.start()
            print(f"idle {args.idle_s:g} s (the monitor only) ...", file=sys.stderr)
            idle = window(sup, lambda: mon.stopped.wait(args.idle_s))
            client = Client(f"http://127.0.0.1:{port}", None, timeout_s=300)
            client.detect()
            client.model()
            params = client.greedy()
            tag = f"{time.time_ns():x}"

            def sweep() -> list[dict[str, Any]]:
                out: list[dict[str, Any]] = []
                t0 = time.monotonic()
                while not out or time.monotonic() - t0 < args.min_sweep_s:
                    for n in levels(args.max_streams):
                        print(f"sweep: {n} streams", file=sys.stderr)
                        lv = run_level(client, n, args.tokens, tag, params, 300.0, _NoBar())
                        out.append({"streams": n, "tokens": lv.tokens, "wall_s": round(lv.wall_s, 3),
                                    "errors": sum(1 for s in lv.results if s.error)})
                return out

            served = window(sup, sweep)
            scrapes = dict(mon.counts)
            status = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{sport}/status", timeout=5).read())
        finally:
            if mon is not None:
                mon.stop()
            stop(proc, 30)
            log.close()
    import platform

    wake = sleeper_share()
    data = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "supervisor": status.get("version"),
            "engine_argv": status.get("engine", {}).get("argv"), "args": {k: str(v) for k, v in vars(args).items()},
            "idle": idle, "sweep": served, "scrapes": scrapes, "boot": status.get("boot"), "sleeper_share": wake}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=2) + "\n")
    tokens = sum(lv["tokens"] for lv in served["result"])
    print(f"monitor: {scrapes['/status']} /status, {scrapes['/metrics']} /metrics, {scrapes['/ready']} /ready, "
          f"{scrapes['errors']} errors")
    for name, w in (("idle", idle), ("sweep", served)):
        top = ", ".join(f"{x['tid']}: {x['cpu_s']:.3f}" for x in w["threads"][:6])
        print(f"{name:>5}: {w['wall_s']:8.2f} s wall, supervisor {w['supervisor_cpu_s']:.3f} CPU s "
              f"(share {w['share']:.5f}), engine tree {w['engine_cpu_s']:.1f} CPU s; threads (tid: CPU s) {top}")
    print(f"sweep: {tokens} tokens over {len(served['result'])} levels "
          f"(up to {args.max_streams} streams), {sum(lv['errors'] for lv in served['result'])} errors")
    ticks = os.sysconf("SC_CLK_TCK")
    if served["supervisor_cpu_s"] * ticks < 20:
        print(f"note: the supervisor's CPU over the sweep is {served['supervisor_cpu_s'] * ticks:.0f} clock ticks "
              f"(1/{ticks} s each): too few to resolve the share; run longer (--min-sweep-s 300)")
    for name, w in (("idle", idle), ("sweep", served)):
        print(f"{name:>5}: the supervisor woke {w['wakeups'] / w['wall_s']:.1f} times a second")
    if wake is not None:
        print(f"floor: a lone thread sleeping 1 s at a time was charged a share of {wake:.5f} on this machine "
              f"(each of the supervisor's threads that waits with a timeout pays about that)")
    print(f"P2b idle_share={idle['share']:.5f}")
    print(f"P2b supervisor_cpu_share={served['share']:.5f}   (goal <= {GOAL})")
    return 0 if tokens else 1          # no token served: the sweep measured nothing


def config_text(args: argparse.Namespace, tmp: Path, port: int, sport: int) -> str:
    """The deploy config: the engine with --max-streams slots, the selftest off, no API key."""
    if args.engine == "vllm":
        if not args.vllm or args.model in ("smollm2", "tiny"):
            sys.exit("--engine vllm needs --vllm BIN and --model DIR (a model directory)")
        env = "".join(f'{k} = "{v}"\n' for k, v in args.vllm_env.items())
        snapshot = tmp / "vllm-serve-help.txt"        # the lint's flag snapshot, from this vLLM itself
        with open(snapshot, "w") as f:
            subprocess.run([args.vllm, "serve", "--help=all"], stdout=f, stderr=subprocess.DEVNULL, timeout=300)
        return (f'engine = "vllm"\nstate_dir = "{tmp / "state"}"\n[model]\nsource = "{args.model}"\n'
                f'entry = "config.json"\n[server]\nhost = "127.0.0.1"\nport = {port}\nbinary = "{args.vllm}"\n'
                f'flag_snapshot = "{snapshot}"\napi_key = "none"\n[ladder]\nremember = false\n[[ladder.rungs]]\nname = "serve"\n'
                f'args = ["--max-model-len", "4096", "--max-num-seqs", "{max(args.max_streams, 1)}"]\n'
                + (f"[ladder.rungs.env]\n{env}" if env else "")
                + f'[selftest]\nenabled = false\n[status]\nhost = "127.0.0.1"\nport = {sport}\n')
    from kiln_dev.models import make_tiny_gguf, smollm2_gguf

    binary = (args.prefix or llama_prefix()) / "bin" / "llama-server"
    model = {"smollm2": smollm2_gguf, "tiny": lambda: make_tiny_gguf(tmp / "tiny.gguf")}.get(args.model)
    path = Path(model()) if model else Path(args.model)
    ctx = args.max_streams * args.ctx_per_stream
    flags = ["--parallel", str(args.max_streams), "--kv-unified", "-c", str(ctx)]
    rung = rung_toml("serve", flags if args.gpu else ["-t", str(args.threads), *flags],
                     "autofit" if args.gpu else "cpu")
    return deploy_toml(model=path, binary=binary, port=port, status_port=sport, state_dir=tmp / "state", rungs=rung)


class _NoBar:
    def update(self, n: int) -> None:
        pass


if __name__ == "__main__":
    stop_on_term()
    sys.exit(main())
