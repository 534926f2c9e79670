#!/usr/bin/env python3
"""P12: a fleet converging on a published config. Three supervisors (`python -m supervisor run`,
each with its own llama-server, ports and volume, all watching one repo on the Hub stand-in
kiln_dev/hub/ through the real huggingface_hub client, each reporting to the fleet branch) against
one bare reload measured in the same run (same model, same flags; selftest off on both sides).

Bare reload: stop a running llama-server (TERM, reaped) -> start it -> GET /health answers 200
(bench/reload.py's measurement).
Publish: a config is committed to the repo's main branch at t0 (straight into the stand-in's
store, as bench/reload.py's Hub runs do, so t0 is the instant the commit exists); converged when
all three /status show that revision live, SERVING and decided. Expected: about one poll interval
(each pod sees the commit within one) plus one reload, the pods reloading side by side.
Canary: `python build.py publish-config --canary 1 --wait` run as a user would: t0 when the
command starts, converged when it exits 0 (the canary applied it, its verdict reached the Hub, the
commit was promoted to main, the other two applied it and their verdicts reached the Hub). That
adds the command's own start, one reload done alone first, and two verdict writes to the above.

    python bench/fleet.py [--runs 3] [--model smollm2|tiny] [--threads 1] [--poll-s 1.0]
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

from common import (REPO, SUPERVISOR_PYTHON, deploy_toml, env_without_kiln, free_port, llama_prefix, median,
                    rung_toml, spawn, stop, stop_on_term, wait_until)
from reload import bare_restart, engine_args, model_path

HUB_REPO = "kiln-bench/fleet"


def status(sport: int) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{sport}/status", timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return {}


class Pod:
    def __init__(self, n: int, binary: Path, model: Path, threads: int, tmp: Path, watch: str, env: dict[str, str]):
        self.binary, self.model, self.threads, self.watch = binary, model, threads, watch
        self.dir = tmp / f"pod-{n}"
        self.dir.mkdir(parents=True)
        self.port, self.sport = free_port(), free_port()
        self.env = {**env, "RUNPOD_POD_ID": f"pod-{n}", "KILN_SERVER_PORT": str(self.port)}
        self.proc = None

    def text(self, ctx: int) -> str:
        return deploy_toml(model=self.model, binary=self.binary, port=self.port, status_port=self.sport,
                           state_dir=self.dir / "state", rungs=rung_toml("cpu", engine_args(ctx, self.threads)),
                           extra=self.watch)

    def start(self) -> None:
        cfg = self.dir / "boot.toml"
        cfg.write_text(self.text(2048))
        self.proc = spawn([SUPERVISOR_PYTHON, "-m", "supervisor", "run", "--config", str(cfg)],
                          death_signal=signal.SIGTERM, cwd=REPO, env=self.env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)

    def serves(self, revision: str) -> bool:
        st = status(self.sport)
        last = (st.get("reload") or {}).get("last") or {}
        return (st.get("state") == "SERVING" and (st.get("config") or {}).get("revision") == revision
                and last.get("revision") == revision)

    def close(self) -> None:
        if self.proc is not None:
            stop(self.proc, 60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--poll-s", type=float, default=1.0)
    args = ap.parse_args()
    from kiln_dev.hub import HubServer, client_env
    from kiln_dev.supervised import fleet_published

    binary = llama_prefix() / "bin" / "llama-server"
    watch = f'[watch]\nrepo = "{HUB_REPO}"\npoll_s = {args.poll_s}\nreport_s = {max(10.0, args.poll_s)}\n'
    bare: list[float] = []
    converge: list[float] = []
    detect: list[float] = []              # the slowest pod's: commit -> seen
    reload_s: list[float] = []            # the slowest pod's: seen -> decided (serving it)
    canary: list[float] = []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-fleet-") as t:
        tmp = Path(t)
        model = model_path(args.model, tmp)
        size_mb = model.stat().st_size / 1e6
        bare_restart(binary, model, args.threads)                     # warm the page cache
        with HubServer(tmp / "hub") as hub, client_env(hub, tmp / "home") as ce:
            env = {**env_without_kiln(), **ce.env}
            pods = [Pod(n, binary, model, args.threads, tmp, watch, env) for n in (1, 2, 3)]
            first = hub.seed(HUB_REPO, {"deploy.toml": fleet_published(pods[0].text(2048)).encode()})
            try:
                for p in pods:
                    p.start()
                wait_until(lambda: all(p.serves(first) for p in pods), 300)
                for i in range(args.runs):
                    bare.append(bare_restart(binary, model, args.threads))
                    text = fleet_published(pods[0].text(1024 if i % 2 == 0 else 2048))
                    commit = hub.seed(HUB_REPO, {"deploy.toml": text.encode()}, message=f"bench {i}")
                    t0, wall0 = time.monotonic(), time.time()         # the commit exists now
                    converge.append(wait_until(lambda: all(p.serves(commit) for p in pods), 300) - t0)
                    lasts = [status(p.sport)["reload"]["last"] for p in pods]
                    detect.append(max(x["detected_at"] for x in lasts) - wall0)
                    reload_s.append(max(x["t"] - x["detected_at"] for x in lasts))
                for i in range(args.runs):
                    f = tmp / "canary.toml"
                    f.write_text(fleet_published(pods[0].text(1536 if i % 2 == 0 else 2048)))
                    t0 = time.monotonic()
                    r = subprocess.run([SUPERVISOR_PYTHON, str(REPO / "build.py"), "publish-config", str(f), "--repo",
                                        HUB_REPO, "--canary", "1", "--wait", "--timeout", "300"],
                                       cwd=REPO, env=env, capture_output=True, text=True, timeout=700)
                    if r.returncode != 0:
                        sys.exit(f"publish-config --canary 1 --wait exited {r.returncode}:\n{r.stdout}{r.stderr}")
                    canary.append(time.monotonic() - t0)
            finally:
                for p in pods:
                    p.close()
    b = median(bare)
    print(f"model {args.model} ({size_mb:.0f} MB), 3 pods, poll_s {args.poll_s:g}, {args.runs} runs each, medians:")
    print(f"  bare llama-server reload                 {b:.3f} s   (runs: {', '.join(f'{x:.3f}' for x in bare)})")
    print(f"  publish -> all 3 serving it              {median(converge):.3f} s   (runs: "
          f"{', '.join(f'{x:.3f}' for x in converge)})")
    print(f"    of which the slowest pod's detection   {median(detect):.3f} s, its reload {median(reload_s):.3f} s "
          f"(three engines loading at once on this machine's cores)")
    print(f"  --canary 1 --wait: start -> all 3 took it {median(canary):.3f} s   (runs: "
          f"{', '.join(f'{x:.3f}' for x in canary)})")
    print(f"P12-canary converge_s={median(canary):.3f} over_bare={median(canary) / b:.2f}")
    print(f"P12 converge_s={median(converge):.3f} bare_reload_s={b:.3f} over_bare={median(converge) / b:.2f}")
    return 0


if __name__ == "__main__":
    stop_on_term()
    sys.exit(main())
