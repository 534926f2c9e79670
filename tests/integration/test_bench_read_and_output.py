"""bench/prefetch_read.py and bench/engine_output.py run end to end on a small input and print their
ratio lines; bad arguments are refused before anything is made or started."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)


def test_prefetch_read_measures_each_stream_count_against_one_sequential_read(tmp_path):
    r = run(str(BENCH / "prefetch_read.py"), "--gib", "0.02", "--dir", str(tmp_path), "--streams", "1,3",
            "--repeat", "2")
    assert r.returncode == 0, r.stderr
    for n in (1, 3):
        assert re.search(rf"^prefetch_over_read\[streams={n}\]=\d+\.\d{{3}}", r.stdout, re.M), r.stdout
    assert r.stdout.count("resident before:") == 2 * 3         # every read says how cold it started
    assert list(tmp_path.iterdir()) == []                      # the file it made is gone


def test_prefetch_read_leaves_a_given_file_and_refuses_bad_streams(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 100000)
    assert run(str(BENCH / "prefetch_read.py"), "--file", str(model), "--streams", "1", "--repeat", "1").returncode == 0
    assert model.read_bytes() == b"x" * 100000
    bad = run(str(BENCH / "prefetch_read.py"), "--file", str(model), "--streams", "0")
    assert bad.returncode != 0 and "--streams" in bad.stderr and "Traceback" not in bad.stderr


def test_engine_output_compares_the_supervisors_wiring_with_a_record_per_line():
    r = run(str(BENCH / "engine_output.py"), "--lines", "2000", "--repeat", "1")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^engine_output_us_per_line\[per-line\]=\d", r.stdout, re.M)
    assert re.search(r"^engine_output_us_per_line\[supervisor\]=\d", r.stdout, re.M)
    assert re.search(r"^engine_output_over_per_line=\d+\.\d{3}$", r.stdout, re.M), r.stdout
