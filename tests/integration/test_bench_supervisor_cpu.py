"""bench/supervisor_cpu.py (P2b) refuses a sweep that cannot fit before it starts anything: the
2026-12-01 H200 run of --tokens 1024 against 256 tokens of context a stream lost 112 of its 127
requests and still printed a share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "supervisor_cpu.py"


def test_tokens_that_do_not_fit_a_streams_context_are_refused_naming_the_fix():
    r = subprocess.run([sys.executable, str(BENCH), "--tokens", "1024"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "--tokens 1024 does not fit --ctx-per-stream 256" in r.stderr and "1088 or more" in r.stderr
    assert "Traceback" not in r.stderr
