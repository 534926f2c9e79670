#!/usr/bin/env python3
"""P7: the selftest's decode tok/s against the engine's own count, on SmolLM2 and a real
llama-server.

The selftest times decode on the client: each streamed reply from its first content chunk to
its last, chunks - 1 decode steps, summed over non-degenerate prose replies until at least
--decode-tokens tokens. llama.cpp times the same steps itself (`timings.predicted_ms` over
`predicted_n - 1`: the first token comes from the prompt pass) and counts them in /metrics
(`llamacpp:tokens_predicted_total` / `tokens_predicted_seconds_total`). The error is the
client's figure against the engine's timings, in percent of the engine's; the /metrics figure
is printed beside it as a second witness. One selftest run (probes, then decode; no prefill),
exactly as the supervisor runs it.

    python bench/selftest_accuracy.py [--decode-tokens 256] [--threads 1] [--runs 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from common import llama_prefix, stop_on_term

from supervisor.config import SelftestSpec
from supervisor.selftest.client import Client
from supervisor.selftest.runner import run_selftest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decode-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1, help="llama-server -t (default 1: steadiest on 2 shared cores)")
    ap.add_argument("--runs", type=int, default=1, help="selftest runs (P7 is the first; the rest show the spread)")
    args = ap.parse_args()

    from kiln_dev.llama_server import LlamaServer
    from kiln_dev.models import smollm2_gguf

    model = smollm2_gguf()
    errors: list[float] = []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-p7-"):
        with LlamaServer(llama_prefix(), model, "-t", str(args.threads)) as srv:
            print(f"model {Path(model).name}, llama-server -t {args.threads}, selftest decode on >= "
                  f"{args.decode_tokens} tokens, {args.runs} run(s)")
            for run in range(args.runs):
                spec = SelftestSpec(probes="smollm2", decode_tokens=args.decode_tokens, prefill_tokens=0,
                                    timeout_s=1200)
                report = run_selftest(Client(srv.url), spec)
                d = report.decode
                if d is None or d.error_pct is None:
                    print(report.table())
                    sys.exit("the selftest measured no decode: see the table above")
                print(f"\nrun {run + 1}: selftest {'passed' if report.passed else 'FAILED'}")
                print(f"  {'reply':<52} {'tokens':>6} {'client':>9} {'engine':>9} {'/metrics':>9}  void")
                for s in d.samples:
                    m = s.metrics
                    mt = ((m.decode_tokens - 1) / m.decode_seconds) if m and m.decode_tokens and m.decode_seconds else None
                    print(f"  {s.prompt[:52]:<52} {s.chunks:>6} {_f(s.client_tok_s):>9} {_f(s.engine_tok_s):>9} "
                          f"{_f(mt):>9}  {s.void or ''}")
                print(f"  {'selftest decode (valid replies)':<52} {d.tokens:>6} {_f(d.client_tok_s):>9} "
                      f"{_f(d.engine_tok_s):>9} {_f(d.metrics_tok_s):>9}")
                print(f"  client vs engine timings {d.error_pct:+.3f}%, vs /metrics "
                      f"{(d.client_tok_s / d.metrics_tok_s - 1) * 100:+.3f}%" if d.metrics_tok_s else "")
                errors.append(d.error_pct)
    if len(errors) > 1:
        print(f"\nspread over {len(errors)} runs: min {min(errors):+.3f}%, median {statistics.median(errors):+.3f}%, "
              f"max {max(errors):+.3f}%")
    print(f"P7 decode_error_pct={errors[0]:.3f}")
    return 0


def _f(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


if __name__ == "__main__":
    stop_on_term()
    sys.exit(main())
