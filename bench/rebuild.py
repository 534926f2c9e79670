#!/usr/bin/env python3
"""P5: a supervisor-only change rebuilds in a small fraction of a cold build.

Cold: `docker build --no-cache` of cpu-llamacpp on the local base, engine binaries taking the
verified-fetch path (every apt and pip step runs). Rebuild: the same context with one line added
to the supervisor, built with the cache. Layer order decides the ratio: the supervisor is the
last layer, so everything above it is reused. (Against a cold *compile* build the ratio would be
far smaller still; the fetch path is the honest baseline for a pod image.)

    python bench/rebuild.py [--base-image kiln-local/debian:bookworm]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from common import stop_on_term  # importing common also puts the repo on sys.path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-image", default="kiln-local/debian:bookworm")
    ap.add_argument("--ca-bundle", type=Path, default=Path("/etc/ssl/certs/ca-certificates.crt"))
    args = ap.parse_args()
    from images.binaries import obtain as binaries
    from images.build import docker as docker_build, render
    from images.pins.lock import load_lock, pins_for
    from images.binaries.stores import LocalStore
    from images.target import load_target

    docker_build.ping()
    target = load_target("cpu-llamacpp")
    pins = pins_for(target, load_lock())
    _, packed = binaries.host_compile(target, pins)
    ctx = render.make_context(target, pins, base_image=args.base_image)
    with tempfile.TemporaryDirectory(prefix="kiln-bench-rebuild-") as t:
        tmp = Path(t)
        store = LocalStore(tmp / "store")
        store.put(packed)
        out = tmp / "ctx"
        render.write_context(ctx, out)
        spec = binaries.expected_spec(target, pins, docker_build.os_identity_of_image(args.base_image))
        tarball, _, sha = binaries.fetch_verified(store, spec, out / "kiln" / "binaries", smoke=True)
        for f in (out / "kiln" / "binaries").iterdir():
            if f.suffix == ".json":
                f.unlink()
        tag = "kiln-bench/rebuild:latest"
        lines: list[str] = []

        def build(no_cache: bool) -> float:
            lines.clear()
            req = docker_build.BuildRequest(context=out, tags=[tag], no_cache=no_cache,
                                            build_args={"ENGINE_FROM": "fetch", "KILN_BINARIES": f"{tarball.name}@sha256:{sha}"},
                                            ca_bundle=args.ca_bundle if args.ca_bundle.is_file() else None)
            t0 = time.monotonic()
            docker_build.build(req, on_line=lines.append)
            return time.monotonic() - t0

        cold = build(no_cache=True)
        cold_steps = sum(1 for ln in lines if " DONE " in ln)
        init = out / "kiln" / "supervisor" / "__init__.py"
        init.write_text(init.read_text() + f"\n# bench/rebuild.py change {time.time()}\n")
        rebuild = build(no_cache=False)
        cached = sum(1 for ln in lines if ln.endswith("CACHED"))
    print(f"cold build (--no-cache, fetch path)   {cold:8.2f} s  ({cold_steps} steps ran)")
    print(f"supervisor-only rebuild               {rebuild:8.2f} s  ({cached} steps cached)")
    print(f"P5 rebuild_over_cold={rebuild / cold:.4f}")
    return 0


if __name__ == "__main__":
    stop_on_term()
    sys.exit(main())
