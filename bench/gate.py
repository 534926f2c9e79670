#!/usr/bin/env python3
"""P13: the selftest as a Serverless worker runs it (the gate) against today's sequential selftest,
on the CPU quickstart: SmolLM2-135M (kiln_dev.models) on a real llama-server, the quickstart's own
deploy config (images/deploy/cpu-small.toml with KILN_MODEL_FAMILY=smollm2, as scripts/quickstart.sh
starts it: decode_tokens 128, prefill_tokens 1024, no floors).

    full   the probes one after another, decode on 128 tokens, prefill on 1024 (cold, then warm):
           what every supervisor ran before, and what a pod still runs
    gate   what the worker runs ([selftest] mode "auto" on a Serverless worker): the probes as many
           at once as llama-server has slots, measurements sized to the floors (runner.py)

One run of each, each against its own fresh llama-server with the same arguments (the rung's
`--ctx-size 4096`, llama-server's default slots), so neither finds the other's prompts cached:
both start as a cold worker does. P13 is the gate's wall time over the full selftest's. The
engine's own CPU seconds (user + system, psutil) are printed beside it: on a machine shared with
other work the wall time moves with the load, the work the engine was asked to do much less.

    python bench/gate.py [--threads 1] [--order full-first|gate-first]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time
from pathlib import Path

from common import REPO, llama_prefix, stop_on_term

from supervisor.config import load_config
from supervisor.selftest.client import Client
from supervisor.selftest.runner import run_selftest
from supervisor.run.selftest import gate_mode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1,
                    help="llama-server -t (default 1: the steadiest on a shared 2-core machine)")
    ap.add_argument("--order", choices=("full-first", "gate-first"), default="full-first")
    args = ap.parse_args()

    from kiln_dev.llama_server import LlamaServer
    from kiln_dev.models import smollm2_gguf

    model = smollm2_gguf()
    deploy = REPO / "images/deploy/cpu-small.toml"
    quickstart = {"KILN_MODEL_FAMILY": "smollm2", "KILN_MODEL_SOURCE": str(model)}
    pod = load_config(deploy, env=quickstart)
    worker = load_config(deploy, env={**quickstart, "PORT": "8000", "PORT_HEALTH": "8001"})
    assert not gate_mode(pod) and gate_mode(worker), "the worker must run the gate, the pod the full selftest"
    spec, family = worker.selftest, worker.model.family
    rung_args = list(worker.ladder.rungs[0].args)
    prefix = llama_prefix()
    version = subprocess.run([str(prefix / "bin/llama-server"), "--version"], capture_output=True, text=True)
    print(f"{time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, "
          f"Python {platform.python_version()}")
    print(f"llama-server: {' '.join((version.stdout + version.stderr).split())[:120]}")
    print(f"model {Path(model).name}; {deploy.relative_to(REPO)}: probes {family}, decode_tokens "
          f"{spec.decode_tokens}, prefill_tokens {spec.prefill_tokens}, floors decode {spec.min_decode_tok_s:g} "
          f"prefill {spec.min_prefill_tok_s:g}; llama-server {' '.join(rung_args)} -t {args.threads}\n")

    import psutil

    walls: dict[str, float] = {}
    cpu: dict[str, float] = {}
    order = ("full", "gate") if args.order == "full-first" else ("gate", "full")
    for mode in order:
        with LlamaServer(prefix, model, *rung_args, "-t", str(args.threads), ctx=4096) as srv:
            engine = psutil.Process(srv.proc.pid)
            c0 = sum(engine.cpu_times()[:2])
            t0 = time.monotonic()
            report = run_selftest(Client(srv.url, engine="llamacpp"), spec, family=family, gate=mode == "gate")
            walls[mode] = time.monotonic() - t0
            cpu[mode] = sum(engine.cpu_times()[:2]) - c0
        spent = ", ".join(f"{k} {v:.2f} s" for k, v in report.phases.items())
        print(f"{mode}: {walls[mode]:.2f} s ({spent}), engine CPU {cpu[mode]:.2f} s, {report.probe_width} probe(s) at once, "
              f"{'passed' if report.passed else 'FAILED'}; {report.summary}")
        print("\n".join("    " + line for line in report.table().splitlines()[1:]) + "\n")
        if not report.passed:
            raise SystemExit(f"the {mode} selftest failed on an undamaged model: no figure")
    ratio = walls["gate"] / walls["full"]
    print(f"full {walls['full']:.2f} s, gate {walls['gate']:.2f} s; engine CPU full {cpu['full']:.2f} s, "
          f"gate {cpu['gate']:.2f} s (gate/full {cpu['gate'] / cpu['full']:.3f}); load {os.getloadavg()[0]:.2f}")
    print(f"P13 gate_over_sequential={ratio:.3f}")
    return 0


if __name__ == "__main__":
    stop_on_term()
    raise SystemExit(main())
