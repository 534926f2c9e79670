"""`python -m supervisor selftest --url` when there is no server to test: exit 2 and one line,
not exit 1 (which says the server was tested and failed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kiln_dev.supervised import free_port

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "selftest", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})


def closed_port() -> int:
    return free_port()          # never handed out before, nothing listens there: connecting is refused


def test_nothing_listening_is_exit_2_with_one_line_not_a_failed_selftest():
    # Was: exit 1, the same as a server that answered badly.
    port = closed_port()
    r = run_cli("--url", f"http://127.0.0.1:{port}/v1")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == f"cannot reach the server at http://127.0.0.1:{port}: connection refused\n"
    assert r.stdout == ""


def test_credentials_in_the_url_are_not_echoed():
    port = closed_port()
    r = run_cli("--url", f"http://kiln:s3cret-pw@127.0.0.1:{port}")
    assert r.returncode == 2 and "s3cret-pw" not in r.stderr and "cannot reach the server" in r.stderr


def test_a_bad_option_is_named_as_the_option_the_user_typed():
    # Was: "--probes: is not a known value (got 'nope-x')": the option is --family, and the value was
    # rewritten (every "_" turned into "-").
    r = run_cli("--url", f"http://127.0.0.1:{closed_port()}", "--family", "nope_x", "--min-probe-pass", "3")
    assert r.returncode == 2 and r.stdout == ""
    assert "  - --family: is not a known value (got 'nope_x'); allowed: generic," in r.stderr
    assert "  - --min-probe-pass: is out of range (got 3.0)" in r.stderr
    assert "probes" not in r.stderr and "deploy config" not in r.stderr
