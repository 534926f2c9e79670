"""bench/serve.py end to end, small: its own llama-server (tiny model), a 1-2-4 stream sweep,
prefill cold and warm; it must write its JSON, Markdown table and plot, and end with P8. And when
it is stopped from outside (SIGTERM, SIGKILL, or both as `timeout -k` does) its llama-server, the
real one, must not outlive it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from kiln_dev.engine import require_prefix
from kiln_dev.supervised import http, wait_for

pytestmark = [pytest.mark.llama, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_a_small_sweep_writes_its_table_and_plot(tmp_path):
    require_prefix()
    out = tmp_path / "serve"
    r = subprocess.run([sys.executable, "bench/serve.py", "--model", "tiny", "--max-streams", "4", "--tokens", "16",
                        "--threads", "1", "--prefill-tokens", "300", "--request-wall-s", "30", "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"P8 client_overhead_pct=-?\d+\.\d+", last), last
    assert "sweep" in r.stderr                                            # the progress bar

    data = json.loads((out / "results.json").read_text())
    levels = data["levels"]
    assert [lv["streams"] for lv in levels] == [1, 2, 4]
    for lv in levels:
        assert lv["ok"] == lv["streams"] and lv["tokens"] == 16 * lv["streams"]   # ignore_eos: exactly 16 each
        assert lv["aggregate_tok_s"] > 0 and lv["usd_per_m_output"] > 0
        assert lv["metrics_tokens_agree"] is True                           # the server counted the same tokens
        assert lv["client_overhead_pct"] is not None
    assert float(last.split("=")[1]) == pytest.approx(levels[-1]["client_overhead_pct"], abs=1e-3)
    p = data["prefill"]
    assert p["chunked"]["total_tokens"] >= 300 and p["prefix_cache"] is True and p["warm_new_tokens"] <= 4
    assert data["spec_decode"]["describe"].startswith("none drafted")

    table = (out / "summary.md").read_text()
    assert "| streams | tokens | duration (s) | aggregate tok/s |" in table
    assert len([ln for ln in table.splitlines() if re.match(r"\| [124] \|", ln)]) == 3
    png = (out / "sweep.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


# -- stopped from outside: nothing left running (issue 18, item 11) ------------------------------
# `timeout -k K T bench/serve.py` sends SIGTERM to the bench's process group at T and SIGKILL at
# T+K. Before the fix its llama-server (own session, no parent-death signal) outlived both, with
# parent PID 1. The bench runs a workload far longer than the test waits, so the signals always
# arrive mid-run; each test signals as soon as the bench's own llama-server answers /health.

STOP_DEADLINE_S = 30.0


def _gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE   # nobody may reap it; it is dead all the same
    except psutil.NoSuchProcess:
        return True


def _engine_of(bench: subprocess.Popen[bytes]) -> psutil.Process | None:
    """The bench's llama-server, once it answers /health (None before)."""
    if bench.poll() is not None:
        raise AssertionError(f"bench/serve.py exited {bench.returncode} before its llama-server was up")
    try:
        kids = psutil.Process(bench.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for k in kids:
        try:
            argv = k.cmdline()
        except psutil.Error:
            continue
        if argv and Path(argv[0]).name == "llama-server" and "--port" in argv:
            port = argv[argv.index("--port") + 1]
            return k if http(f"http://127.0.0.1:{port}/health", timeout=2)[0] == 200 else None
    return None


@pytest.mark.parametrize("how", ["term-then-kill", "kill", "term"])
def test_bench_serve_stopped_from_outside_leaves_no_llama_server(tmp_path, how):
    require_prefix()
    bench = subprocess.Popen([sys.executable, "bench/serve.py", "--model", "tiny", "--max-streams", "64",
                              "--tokens", "512", "--threads", "1", "--prefill-tokens", "3000",
                              "--out", str(tmp_path / "serve")],
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    engine = None
    try:
        engine = wait_for(lambda: _engine_of(bench), 120, "bench/serve.py's llama-server to answer /health")
        if how == "kill":                                       # killed outright: only the death signal helps
            os.killpg(bench.pid, signal.SIGKILL)
        else:
            os.killpg(bench.pid, signal.SIGTERM)                # timeout's first signal, to the group
            if how == "term-then-kill":
                try:
                    bench.wait(2)                               # timeout -k 2
                except subprocess.TimeoutExpired:
                    os.killpg(bench.pid, signal.SIGKILL)
        code = bench.wait(STOP_DEADLINE_S)
        wait_for(lambda: _gone(engine), STOP_DEADLINE_S, f"llama-server {engine.pid} to be gone after the bench ({how})")
        if how == "term":                                       # it unwound: its finally stopped the engine
            assert code == 128 + signal.SIGTERM
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait(10)
        if engine is not None and not _gone(engine):
            engine.kill()                                       # the leftover this test exists to catch
