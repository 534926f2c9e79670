"""bench/gpu_vllm.py's flow on a CPU machine: the device run's driver, with `vllm` standing in as
kiln_dev/fake_vllm.py (vLLM 0.26.0 as it ran on the H200: the real OOM of rung "too-long", then a
real boot's lines). Its figures mean nothing here; what must hold is what the device run relies on,
because device time is per session and a broken driver costs it: the cold steps (A, C) start on an
emptied state volume and fall through the OOM rung, B starts at the remembered rung, a repeated
step keeps its own files, a failed request is recorded instead of ending the run, and nothing it
started is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from kiln_dev.supervised import fake_vllm_bench, free_pair

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

# the scenario is the stand-in's only input beyond argv: rung "too-long" is the recorded OOM
WRAPPER = """#!/bin/sh
case " $* " in *" 20000000 "*) export KILN_FAKE_SCENARIO=vllm-oom-h200;; *) export KILN_FAKE_SCENARIO=vllm-ok;; esac
exec {python} {fake} "$@"
"""


def test_cold_warm_and_repeated_steps(tmp_path):
    # stand-in: bench/gpu_vllm.py measures the H200 (its CUDA OOM rung among them); this checks its plumbing
    vllm, model = fake_vllm_bench(tmp_path, WRAPPER)
    root, out = tmp_path / "root", tmp_path / "out"
    (root / "state-vllm" / "cache").mkdir(parents=True)
    (root / "state-vllm" / "cache" / "left-from-before").write_text("a compile cache of an earlier call")
    port = free_pair()                   # the bench's status port is --port + 1
    r = subprocess.run([sys.executable, "bench/gpu_vllm.py", "--root", str(root), "--out", str(out),
                        "--vllm", str(vllm), "--model", str(model), "--port", str(port), "--no-selftest",
                        "--steps", "A,bare,B,C,B", "--boot-deadline-s", "60"],
                       cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    steps = json.loads((out / "gpu-vllm.json").read_text())["steps"]
    assert list(steps) == ["A", "bare", "B", "C", "B#2"]

    # A and C: the volume emptied first, so the OOM rung ran and fell through
    assert not (root / "state-vllm" / "cache" / "left-from-before").exists()
    for cold in ("A", "C"):
        assert steps[cold].get("last_failure"), steps[cold]
        assert steps[cold]["last_failure"]["class"] == "oom", steps[cold]["last_failure"]
        assert steps[cold]["states_seen"][-1] == "SERVING"
    # B: the ladder's memory on the same volume, no failure on the way
    for warm in ("B", "B#2"):
        assert steps[warm]["last_failure"] is None and steps[warm]["states_seen"][-1] == "SERVING"
    assert (out / "supervisor-B.log").exists() and (out / "supervisor-B-2.log").exists()
    assert (out / "vllm-bare.log").read_text().strip()
    # the stand-in answers no completions: every boot's decode is an error on record, not a crash
    for rec in steps.values():
        assert "error" in rec["decode"] and rec["ready_s"] is not None
    for name in ("A", "B", "C", "B#2"):
        assert steps[name]["stop"]["exit"] == 0
    assert "P11 warm_boot_over_cold=" in r.stdout and "every request of every boot pooled" in r.stdout
    left = [p.info for p in psutil.process_iter(["pid", "cmdline"])
            if any(str(tmp_path) in a for a in (p.info["cmdline"] or []))]
    assert left == []


def test_a_port_that_already_answers_is_refused_not_measured(tmp_path):
    # stand-in: the refusal comes before any engine runs; the stand-in is the bench's plumbing on CPU
    """Figures read from a server left over from before would be that server's (seen in the dry run
    of 2026-12-01: a supervisor from a crashed run answered the next run's boots)."""
    import http.server
    import threading

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        port = srv.server_address[1] - 1          # the bench's status port is --port + 1
        out = tmp_path / "out"
        r = subprocess.run([sys.executable, "bench/gpu_vllm.py", "--root", str(tmp_path / "root"), "--out", str(out),
                            "--vllm", "/bin/false", "--model", str(tmp_path), "--port", str(port),
                            "--snapshot", str(tmp_path / "none.txt"), "--steps", "B"],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
    finally:
        srv.shutdown()
    assert r.returncode == 0, r.stderr[-2000:]
    rec = json.loads((out / "gpu-vllm.json").read_text())["steps"]["B"]
    assert "already answers" in rec["error"]
