"""Append what a pod booted from a plan measured to the rows the planner reads (issue 39).

    python bench/plan_record.py --status http://POD:8081/status --match qwen3-coder-30b-a3b,awq [--data FILE]

Reads the supervisor's /status once its selftest has passed: the `plan` section (the GPU kind and
count the pod was planned for, each prediction beside its measurement) and the selftest's decode.
Prints predicted against measured for every quantity (the measurement is the baseline of the ratio)
and the load average, then appends a one-stream row to images/plan/measured.json (or --data; a vLLM
pod's row carries the KV cache tokens and GiB vLLM said it has), which
`build.py plan` prefers to a bandwidth bound from then on for models whose source names every --match.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from pathlib import Path

from common import stop_on_term  # noqa: F401 - puts the repo on sys.path

from images.plan import measured  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--status", required=True, help="the supervisor's /status URL")
    ap.add_argument("--match", required=True, help="comma-separated strings every source of this model names")
    ap.add_argument("--data", type=Path, help=f"the rows file (default {measured.DATA})")
    a = ap.parse_args()
    with urllib.request.urlopen(a.status, timeout=10) as r:
        status = json.loads(r.read())
    print(f"# bench/plan_record.py  load {os.getloadavg()[0]:.2f}")
    for name, row in ((status.get("plan") or {}).get("checks") or {}).items():
        m, p = row.get("measured"), row.get("predicted")
        ratio = f"{p / m:.3f}" if m and p is not None else "n/a"
        print(f"  {name:14} predicted {p}  measured {m}  predicted/measured {ratio}  ({row['source']})")
    row = measured.row_from_status(status, match=tuple(t.strip().lower() for t in a.match.split(",") if t.strip()),
                                   where=a.status)
    measured.append(row, a.data)
    kv = f", KV cache {row.kv_tokens} tokens / {row.kv_cache_gib} GiB" if row.kv_tokens or row.kv_cache_gib else ""
    print(f"appended: {row.count}x {row.gpu} {row.engine} decode {row.decode_tok_s} tok/s{kv} ({row.source})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
