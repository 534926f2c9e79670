#!/usr/bin/env python3
"""P10: Kiln's model fetch vs huggingface_hub's own download paths, same repo, same link, one run.

The repo: four LFS shards (--shard-mb each, 80 MB by default) on the Hub stand-in
(kiln_dev/hub/, which stands for huggingface.co and its CDN: resolve answers 302 to a
CDN origin, ranges answer 206). Three ways, alternating round by round, each into an empty cache:

  kiln      supervisor.model.fetch.parent.fetch() with the defaults a pod has (model.fetch_connections = 32,
            segments sized from the model), its child process included
  hf_hub    hf_hub_download, file by file (one connection at a time), in a fresh process
  snapshot  snapshot_download (its default max_workers = 8: one connection per file), in a fresh process

over two links: loopback unthrottled, and a relay that caps each connection at --rate-mbps MB/s
(kiln_dev/throttle.py; 5 MB/s by default, what this machine's CPU can serve at Kiln's full
fan-out: a CDN limits per connection). Ends with

    P10 fetch_over_library=<kiln's time / the faster library path's, on the throttled link>

    python bench/fetch.py [--runs 2] [--shard-mb 80] [--rate-mbps 5]
    python bench/fetch.py --sweep 8 16 32 64     Kiln alone on the throttled link, by connection count:
                                                 what this machine can serve at each fan-out
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO

BENCH_REPO = "kiln-bench/four-shards"
LIBRARY = {
    "hf_hub": ("from huggingface_hub import HfApi, hf_hub_download\n"
               "for f in HfApi().list_repo_files({repo!r}):\n"
               "    hf_hub_download({repo!r}, f)\n"),
    "snapshot": "from huggingface_hub import snapshot_download\nsnapshot_download({repo!r})\n",
}


def kiln_once(tmp: Path, endpoint: str, token: str, tails: list[float], connections: int | None = None) -> float:
    from supervisor.model.fetch.parent import fetch
    from supervisor.config import parse_config

    state = tmp / "kiln-state"
    fan = f"fetch_connections = {connections}\n" if connections else ""     # None: the default a pod has
    cfg = parse_config(f'state_dir = "{state}"\n[model]\nsource = "hf://{BENCH_REPO}"\nentry = "*-00001-of-*"\n'
                       f'{fan}[ladder]\n[[ladder.rungs]]\nname = "a"\n', env={})
    env = {**os.environ, "HF_ENDPOINT": endpoint}
    done: list[dict] = []
    t0 = time.monotonic()
    fetch(cfg, env, token=token, should_stop=lambda: False, sleep=time.sleep,
          report=lambda ev: done.append(ev) if ev.get("event") == "done" else None)
    took = time.monotonic() - t0
    tails.append(done[-1]["verified_after_last_byte_s"])
    shutil.rmtree(state)
    return took


def library_once(way: str, tmp: Path, endpoint: str, token: str) -> float:
    cache = tmp / f"{way}-cache"
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp / "hf-home"),
           "HF_TOKEN": token, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "HF_XET_TELEMETRY_ENABLED": "false"}
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", LIBRARY[way].format(repo=BENCH_REPO)], env=env, check=True, cwd=REPO)
    took = time.monotonic() - t0
    shutil.rmtree(cache)
    return took


def hash_s(n: int) -> float:
    """What one sha256 over n bytes costs here (the hash-afterwards alternative), measured on 64 MB."""
    import hashlib

    block = os.urandom(64 * 10**6)
    t0 = time.monotonic()
    hashlib.sha256(block).hexdigest()
    return (time.monotonic() - t0) * n / len(block)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2, help="rounds per link (each round runs all three ways)")
    ap.add_argument("--shard-mb", type=int, default=80)
    ap.add_argument("--rate-mbps", type=float, default=5.0, help="per-connection cap of the throttled link, MB/s")
    ap.add_argument("--sweep", type=int, nargs="+", metavar="N", help="only Kiln, throttled, at these connection counts")
    args = ap.parse_args()
    from kiln_dev.hub import HubServer
    from kiln_dev.throttle import Throttle

    ways = ("kiln", "hf_hub", "snapshot")
    with tempfile.TemporaryDirectory(prefix="kiln-bench-fetch-") as t, HubServer(Path(t) / "hub") as hub:
        tmp = Path(t)
        shards = {f"model-0000{i}-of-00004.gguf": os.urandom(args.shard_mb * 10**6) for i in range(1, 5)}
        hub.seed(BENCH_REPO, shards, storage="lfs")
        total = sum(map(len, shards.values()))
        del shards
        times: dict[tuple[str, str], list[float]] = {}
        tails: list[float] = []
        port = int(hub.url.rsplit(":", 1)[1])
        if args.sweep:
            with Throttle(port, int(args.rate_mbps * 1e6)) as slow:
                for n in args.sweep:
                    took = statistics.median(kiln_once(tmp, slow.url, hub.token, [], n) for _ in range(args.runs))
                    print(f"connections {n:3d}: {took:6.2f} s  {total / took / 1e6:7.1f} MB/s  "
                          f"(the link allows {n * args.rate_mbps:g} MB/s)", flush=True)
            return 0
        with Throttle(port, int(args.rate_mbps * 1e6)) as slow:
            for link, endpoint in (("unthrottled", hub.url), ("throttled", slow.url)):
                for n in range(args.runs):
                    for way in ways[n % 3:] + ways[:n % 3]:          # alternate who goes first
                        took = (kiln_once(tmp, endpoint, hub.token, tails) if way == "kiln"
                                else library_once(way, tmp, endpoint, hub.token))
                        times.setdefault((link, way), []).append(took)
                        print(f"  {link:11s} {way:8s} run {n + 1}: {took:7.2f} s  {total / took / 1e6:7.1f} MB/s",
                              flush=True)
    print(f"\nrepo: 4 shards, {total / 1e6:.0f} MB; throttled link: {args.rate_mbps:g} MB/s per connection; "
          f"median of {args.runs} run(s)")
    med = {k: statistics.median(v) for k, v in times.items()}
    for link in ("unthrottled", "throttled"):
        row = "  ".join(f"{w} {med[(link, w)]:6.2f} s" for w in ways)
        best_lib = min(med[(link, "hf_hub")], med[(link, "snapshot")])
        print(f"{link:11s}  {row}   kiln / faster library = {med[(link, 'kiln')] / best_lib:.3f}")
    print(f"kiln: every file verified {max(tails):.3f} s or less after its last byte arrived (sha256 while "
          f"downloading; hashing {total / 1e6:.0f} MB afterwards would add ~{hash_s(total):.2f} s on this machine)")
    throttled_lib = min(med[("throttled", "hf_hub")], med[("throttled", "snapshot")])
    print(f"P10 fetch_over_library={med[('throttled', 'kiln')] / throttled_lib:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
