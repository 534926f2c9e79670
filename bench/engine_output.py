#!/usr/bin/env python3
"""The supervisor's CPU per line of engine output (P2b's largest part on a GPU: llama-server logs
~10 lines a request, and the reader thread took 0.82 of the supervisor's 1.03 CPU s in a 203 s
64-stream sweep on the H200, 2026-12-02).

    python3 bench/engine_output.py [--lines 10000] [--repeat 3] [--pace-ms 1]

A child prints llama-server's request lines into a real ManagedProcess, one write and flush a line
as a line-buffered logger does, `--pace-ms` apart (a GPU serving many streams finishes requests at
different moments: its lines come one by one, not ten together), wired three ways in the same run,
each `--repeat` times, interleaved:
  per-line   each line its own log record (the loop's wiring before 2026-12-02: on_line ->
             ENGINE_LOG.info); the reader's other work (redaction, tail, log file) as it is now
  per-read   one record per read, every line still prefixed (on_lines; on_line: the boot
             timeline's watch, done once the engine serves): the wiring of 2026-12-02
  supervisor per-read, and the output gathered for ENGINE_OUTPUT_BATCH_S into each read, as the
             loop does once the engine serves (ManagedProcess.batch_output)
All write the engine log file and the tail as the supervisor does; stderr goes to /dev/null. The
reader thread's CPU is read by the callback itself (it runs on that thread) after the last line.

  engine_output_us_per_line[...]=   CPU microseconds per line
  engine_output_lines_per_read[...]= lines each read brought
  engine_output_over_per_line=      supervisor / per-line (< 1: cheaper)
  engine_output_over_per_read=      supervisor / per-read
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from supervisor.run import logs, serving  # noqa: E402
from supervisor.process.managed import ManagedProcess  # noqa: E402

LINES = [   # one request's lines from llama-server 11434 (tests/fixtures/engine-logs), as served
    "slot launch_slot_: id  3 | task 1234 | processing task",
    "slot update_slots: id  3 | task 1234 | new prompt, n_ctx_slot = 256, n_keep = 0, task.n_tokens = 31",
    "slot update_slots: id  3 | task 1234 | n_tokens = 0, memory_seq_rm [0, end)",
    "slot update_slots: id  3 | task 1234 | prompt processing progress, n_tokens = 31, batch.n_tokens = 31, progress = 1.000000",
    "slot update_slots: id  3 | task 1234 | prompt done, n_tokens = 31, batch.n_tokens = 31",
    "slot print_timing: id  3 | task 1234 | ",
    "prompt eval time =       4.12 ms /    31 tokens (    0.13 ms per token,  7524.27 tokens per second)",
    "       eval time =     123.45 ms /   128 tokens (    0.96 ms per token,  1036.88 tokens per second)",
    "slot      release: id  3 | task 1234 | stop processing: n_tokens = 159, truncated = 0",
    "srv  log_server_r: request: POST /v1/chat/completions 127.0.0.1 200",
]


def child(n: int, pace_s: float) -> list[str]:
    code = (f"import sys, time\nL = {LINES!r}\nfor i in range({n} // len(L)):\n"
            "    for l in L:\n        sys.stdout.write(l + '\\n'); sys.stdout.flush()\n"
            f"        time.sleep({pace_s!r})\n"
            "sys.stdout.write('done\\n')\n")
    return [sys.executable, "-c", code]


def one(n: int, wiring: str, tmp: Path, pace_s: float) -> tuple[float, float]:
    """(CPU microseconds a line, lines a read) of the reader thread for this wiring."""
    seen = {"cpu": 0.0, "lines": 0, "reads": 0}

    def per_line(line: str) -> None:
        logs.ENGINE_LOG.info("%s", line)
        seen["lines"] += 1
        seen["reads"] += 1          # as many records as lines: what a read brought is not seen here
        seen["cpu"] = time.thread_time()

    def batch(lines: list[str]) -> None:
        logs.engine_lines(lines)
        seen["lines"] += len(lines)
        seen["reads"] += 1
        seen["cpu"] = time.thread_time()

    done_watch = lambda line: None  # noqa: E731 - the timeline's watch once done: returns at once
    kw = {"on_line": per_line} if wiring == "per-line" else {"on_lines": batch, "on_line": done_watch}
    p = ManagedProcess.start(child(n, pace_s), log_file=str(tmp / f"engine-{wiring}.log"), log_max_bytes=64 << 20,
                             redact=["hf_not-a-real-token-but-as-long-as-one"], **kw)
    if wiring == "supervisor":
        p.batch_output(serving.ENGINE_OUTPUT_BATCH_S)
    p.wait(n * pace_s * 3 + 120)
    p.stop(5)
    if seen["lines"] < n // len(LINES) * len(LINES):
        raise SystemExit(f"{wiring}: {seen['lines']} lines seen of {n}")
    return seen["cpu"] / seen["lines"] * 1e6, seen["lines"] / max(seen["reads"], 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pace-ms", type=float, default=1.0, help="between two lines (default 1)")
    a = ap.parse_args()
    if a.lines < len(LINES) or a.repeat < 1 or not 0 <= a.pace_ms <= 1000:
        raise SystemExit(f"--lines at least {len(LINES)}, --repeat at least 1, --pace-ms 0..1000")
    logs.setup_logging()
    logging.getLogger("kiln").handlers[0].setStream(open(os.devnull, "w"))
    runs: dict[str, list[float]] = {"per-line": [], "per-read": [], "supervisor": []}
    per_read: dict[str, list[float]] = {k: [] for k in runs}
    with tempfile.TemporaryDirectory(prefix="kiln-engine-output-") as d:
        for _ in range(a.repeat):                 # interleaved: a machine that gets busier slows all
            for wiring in runs:
                us, lpr = one(a.lines, wiring, Path(d), a.pace_ms / 1000)
                runs[wiring].append(us)
                per_read[wiring].append(lpr)
                print(f"  {wiring:10} {us:6.2f} us/line  {lpr:6.2f} lines/read", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    for k, v in med.items():
        print(f"engine_output_us_per_line[{k}]={v:.2f}   (median of {a.repeat}, {a.lines} lines each, "
              f"{a.pace_ms} ms apart)")
    for k in ("per-read", "supervisor"):
        print(f"engine_output_lines_per_read[{k}]={statistics.median(per_read[k]):.2f}")
    print(f"engine_output_over_per_line={med['supervisor'] / med['per-line']:.3f}")
    print(f"engine_output_over_per_read={med['supervisor'] / med['per-read']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
