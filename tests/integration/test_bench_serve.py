"""bench/serve.py end to end, small: its own llama-server (tiny model), a 1-2-4 stream sweep,
prefill cold and warm; it must write its JSON, Markdown table and plot, and end with P8."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kiln_dev.engine import require_prefix

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
