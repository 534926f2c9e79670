#!/usr/bin/env python3
"""P3: hot reload. A config change -> the new config serving, minus a bare server restart measured
in the same run (same model, same flags; selftest excluded on both sides).

Bare restart: stop a running llama-server (TERM, reaped) -> start it -> GET /health answers 200.
Local change: the supervisor watches a directory; a new deploy.toml is renamed into it at t0; done
when /status shows the new config hash in state SERVING (polled every 5 ms). The time includes the
watcher's debounce ([watch] debounce_s, default as shipped), validation, stopping the old server,
the reclaim barrier and the new server's load.
Hub change: the supervisor polls a Hub repo branch (the stand-in kiln_dev/hub/, driven
by the real huggingface_hub client) every --poll-s; a config is committed to the repo's main branch
at t0 (straight into the stand-in's store, so t0 is the instant the commit exists: an upload through
the client would blur it by the upload's own duration; tests cover `publish-config` end to end).
detect_s = when the watcher saw the new commit (/status reload.last.detected_at) - t0 (expected:
within one poll interval); reload_overhead_s = detection -> new config serving (reading the file at
that commit, validating, the restart), minus the bare restart.

    python bench/reload.py [--runs 5] [--model smollm2|tiny|big] [--threads 1] [--poll-s 1.0]
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

from common import (REPO, SUPERVISOR_PYTHON, deploy_toml, env_without_kiln, free_port, llama_prefix, median,
                    rung_toml, spawn, status_code, stop, stop_on_term, wait_until)


def model_path(kind: str, tmp: Path) -> Path:
    from kiln_dev.models import make_tiny_gguf, smollm2_gguf

    if kind == "smollm2":
        return smollm2_gguf()
    if kind == "big":
        return make_tiny_gguf(tmp / "big.gguf", n_layers=8, width=2048, n_ff=5632, n_vocab=32000)
    return make_tiny_gguf(tmp / "tiny.gguf")


def engine_args(ctx: int, threads: int) -> list[str]:
    return ["-t", str(threads), "-c", str(ctx)]


def bare_restart(binary: Path, model: Path, threads: int) -> float:
    port = free_port()
    argv = [str(binary), "--model", str(model), "--host", "127.0.0.1", "--port", str(port), "-ngl", "0",
            "--metrics", *engine_args(2048, threads)]
    health = f"http://127.0.0.1:{port}/health"
    p = spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: status_code(health) == 200, 300)
        t0 = time.monotonic()
        stop(p, 30)
        p = spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t1 = wait_until(lambda: status_code(health) == 200, 300)
    finally:
        stop(p, 30)
    return t1 - t0


def status(sport: int) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{sport}/status", timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return {}


class Pod:
    def __init__(self, binary: Path, model: Path, threads: int, tmp: Path, watch: str, env: dict[str, str]):
        self.binary, self.model, self.threads, self.tmp, self.watch = binary, model, threads, tmp, watch
        self.port, self.sport = free_port(), free_port()
        tmp.mkdir(parents=True, exist_ok=True)
        self.cfg_path = tmp / "boot.toml"
        self.cfg_path.write_text(self.text(2048))
        self.proc = spawn([SUPERVISOR_PYTHON, "-m", "supervisor", "run", "--config", str(self.cfg_path)],
                          death_signal=signal.SIGTERM, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
        wait_until(lambda: status(self.sport).get("state") == "SERVING", 300)

    def text(self, ctx: int) -> str:
        return deploy_toml(model=self.model, binary=self.binary, port=self.port, status_port=self.sport,
                           state_dir=self.tmp / "state", rungs=rung_toml("cpu", engine_args(ctx, self.threads)),
                           extra=self.watch)

    def serving(self, cfg_hash: str) -> bool:
        """The new config serves, and its reload is on record (written just after SERVING)."""
        st = status(self.sport)
        last = (st.get("reload") or {}).get("last") or {}
        return (st.get("state") == "SERVING" and st.get("config", {}).get("hash") == cfg_hash
                and last.get("config_hash") == cfg_hash)

    def close(self) -> None:
        stop(self.proc, 60)


def config_hash(text: str) -> str:
    from supervisor.config import parse_config

    return parse_config(text, env={}).hash


def local_runs(binary: Path, model: Path, threads: int, tmp: Path, runs: int, bare: list[float]) -> list[float]:
    watch_dir = tmp / "published"
    watch_dir.mkdir()
    pod = Pod(binary, model, threads, tmp / "local", f'[watch]\ndir = "{watch_dir}"\n', env_without_kiln())
    out = []
    try:
        for i in range(runs):
            bare.append(bare_restart(binary, model, threads))
            text = pod.text(1024 if i % 2 == 0 else 2048)
            want = config_hash(text)
            (watch_dir / ".deploy.toml.tmp").write_text(text)
            t0 = time.monotonic()
            os.replace(watch_dir / ".deploy.toml.tmp", watch_dir / "deploy.toml")
            t1 = wait_until(lambda: pod.serving(want), 120)
            out.append(t1 - t0)
    finally:
        pod.close()
    return out


def hub_runs(binary: Path, model: Path, threads: int, tmp: Path, runs: int, poll_s: float,
             bare: list[float]) -> tuple[list[float], list[float]]:
    from kiln_dev.hub import HubServer, client_env

    detect, overhead = [], []
    with HubServer(tmp / "hub") as hub, client_env(hub, tmp / "home") as ce:
        hub.seed("kiln-bench/deploy", {"README.md": b"bench\n"})
        env = {**env_without_kiln(), **ce.env}
        pod = Pod(binary, model, threads, tmp / "hub-pod", f'[watch]\nrepo = "kiln-bench/deploy"\npoll_s = {poll_s}\n',
                  env)
        try:
            wait_until(lambda: (status(pod.sport).get("reload") or {}).get("last") is not None, 60)  # saw the repo
            for i in range(runs):
                bare.append(bare_restart(binary, model, threads))
                text = pod.text(1024 if i % 2 == 0 else 2048)
                want = config_hash(text)
                hub.seed("kiln-bench/deploy", {"deploy.toml": text.encode()}, message=f"bench {i}")
                published = time.time()           # the commit exists now: a pod may see it from here on
                wait_until(lambda: pod.serving(want), 120)
                served = time.time()
                detected = status(pod.sport)["reload"]["last"]["detected_at"]
                detect.append(detected - published)
                overhead.append(served - detected)
        finally:
            pod.close()
    return detect, overhead


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--model", choices=("tiny", "smollm2", "big"), default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--poll-s", type=float, default=1.0)
    args = ap.parse_args()
    binary = llama_prefix() / "bin" / "llama-server"
    with tempfile.TemporaryDirectory(prefix="kiln-bench-reload-") as t:
        tmp = Path(t)
        model = model_path(args.model, tmp)
        size_mb = model.stat().st_size / 1e6
        bare_restart(binary, model, args.threads)           # warm the page cache
        bare_hub: list[float] = []
        detect, hub_reload = hub_runs(binary, model, args.threads, tmp, args.runs, args.poll_s, bare_hub)
        bare_local: list[float] = []
        local = local_runs(binary, model, args.threads, tmp, args.runs, bare_local)
    bh, bl = median(bare_hub), median(bare_local)
    print(f"model {args.model} ({size_mb:.0f} MB), {args.runs} runs each, medians:")
    print(f"  bare llama-server restart          {bl:.3f} s   (runs: {', '.join(f'{x:.3f}' for x in bare_local)})")
    print(f"  local change -> new config serving {median(local):.3f} s   (runs: {', '.join(f'{x:.3f}' for x in local)})")
    print(f"  Hub: publish -> detected           {median(detect):.3f} s   (poll_s {args.poll_s:g}; runs: "
          f"{', '.join(f'{x:.3f}' for x in detect)})")
    print(f"  Hub: detected -> serving           {median(hub_reload):.3f} s   (runs: "
          f"{', '.join(f'{x:.3f}' for x in hub_reload)}; bare restart {bh:.3f} s)")
    print(f"P3-hub detect_s={median(detect):.3f} reload_overhead_s={median(hub_reload) - bh:.3f}")
    print(f"P3 reload_overhead_s={median(local) - bl:.3f}")
    return 0


if __name__ == "__main__":
    stop_on_term()
    sys.exit(main())
