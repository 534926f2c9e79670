#!/usr/bin/env python3
"""P4: fetching verified prebuilt binaries vs compiling them, same binaries, one run.

Compile path: Kiln's compile script, cold (fresh work dir, no cache), for cpu-llamacpp from the
pinned sdist, on this host. Fetch path: those same binaries, packed and published to a Hub repo
(the local stand-in that speaks the Hub's HTTP protocol to the real huggingface_hub client: the
public Hub is unreachable here), then fetched into an empty cache -> sha256 -> manifest vs target
-> extract -> per-file sha256 -> `llama-server --version` smoke. The field notes: 8m34s to compile vs
2 s to extract a 46 MB CUDA tarball (0.004).

    python bench/binaries.py [--jobs N]      (takes ~10-16 min on 2 cores: it really compiles)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import stop_on_term  # importing common also puts the repo on sys.path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    from images.binaries import artifacts, obtain as binaries
    from images.pins.lock import load_lock, pins_for
    from images.binaries.stores import HubStore
    from images.target import load_target
    from kiln_dev.hub import HubServer, client_env

    target = load_target("cpu-llamacpp")
    pins = pins_for(target, load_lock())
    spec = binaries.expected_spec(target, pins, artifacts.os_identity())
    with tempfile.TemporaryDirectory(prefix="kiln-bench-binaries-") as t:
        tmp = Path(t)
        argv = binaries.compile_args(target, pins, tmp / "prefix", tmp / "work", patch_files={}, jobs=args.jobs)
        t0 = time.monotonic()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        compile_s = time.monotonic() - t0
        packed = artifacts.pack(tmp / "prefix", spec, tmp / "packed")
        size_mb = packed.tarball.stat().st_size / 1e6
        with HubServer(tmp / "hub") as hub, client_env(hub, tmp / "hf-home") as env:
            store = HubStore("kiln-bench/llama-server-binaries", token=env.token, endpoint=env.endpoint)
            store.put(packed)
            t1 = time.monotonic()
            tarball, manifest = store.fetch(spec.name(), tmp / "fetched")
            man = artifacts.verify(tarball, manifest, spec)
            artifacts.extract_and_smoke(tarball, man, tmp / "engine")
            fetch_s = time.monotonic() - t1
    print(f"compile path (cold, -j{args.jobs})                 {compile_s:8.1f} s")
    print(f"fetch path (Hub stand-in, {size_mb:.1f} MB: verify+extract+smoke) {fetch_s:8.3f} s")
    print("field notes: 514 s compile vs 2 s extract (0.004)")
    print(f"P4 fetch_over_compile={fetch_s / compile_s:.5f}")
    return 0


if __name__ == "__main__":
    stop_on_term()
    sys.exit(main())
