"""`python -m images.ci gate --local` against the real Docker engine, with an image that is no Kiln image
(the local Debian base: its shell exits at once). The gate must answer with a failed verdict that says
why, never a traceback: before, `docker port` of the gone container raised CalledProcessError out of the
CLI. Whether the engine publishes ports (a GPU runner's does; this machine's private one runs with no
bridge) only changes which of the two reasons it names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kiln_dev.docker import docker_cli, local_base_image

ROOT = Path(__file__).resolve().parents[2]


def test_an_image_with_no_supervisor_fails_the_gate_with_a_reason_and_no_traceback():
    base = local_base_image()
    prefix, env = docker_cli()
    r = subprocess.run([sys.executable, "-m", "images.ci", "gate", "--local", "--target", "cpu-llamacpp",
                        "--image", base, "--timeout", "30"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1, r.stdout + r.stderr
    verdict = json.loads(r.stdout)
    assert verdict["passed"] is False and verdict["target"] == "cpu-llamacpp"
    assert ("no status port" in verdict["reason"]) or ("exited before a verdict" in verdict["reason"]), verdict
    left = subprocess.run([*prefix, "ps", "-a", "--filter", "name=kiln-gate-cpu-llamacpp", "-q"],
                          capture_output=True, text=True, env={**os.environ, **env})
    assert left.stdout.strip() == "", "the gate left its container behind"
