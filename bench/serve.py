#!/usr/bin/env python3
"""P8: a serving bench in the shape of the field notes' tables -- concurrency sweep, $/1M output,
cold/warm prefill, speculative-decoding acceptance -- with the client checked against the
server's own counters.

    python bench/serve.py [--model smollm2|tiny|PATH] [--max-streams 64] [--tokens 64]
                          [--threads 2] [--hourly-usd 0.44] [--prefill-tokens 3000] [--out DIR]
    python bench/serve.py --url http://host:port [--api-key-env NAME] ...   (any OpenAI-compatible server)

Without --url it starts its own llama-server (the CPU build kiln_dev/engine.py finds) with
`--parallel <max-streams> --kv-unified -t <threads> --metrics`, context max-streams x
--ctx-per-stream (at least the prefill prompt), and stops it at the end.

- Sweep: 1, 2, 4, ... --max-streams concurrent streams (the last level is --max-streams itself).
  Every stream is a raw completion whose prompt *starts* with its own run/level/stream tag, so
  no stream rides another's prompt cache (not even a chat template's shared system prefix), and
  asks for exactly --tokens tokens (`ignore_eos`, which llama.cpp and vLLM both accept).
  Aggregate tok/s = all tokens of the level / the level's wall time; per-stream tok/s = each
  stream's decode steps over its own first-to-last-token time, averaged; $/1M output tokens =
  --hourly-usd / 3600 / aggregate x 1e6 (default 0.44: the field notes' A40 price, to compare shapes).
- Client overhead (P8): per stream, the client's first-to-last-token time per decode step against
  the engine's own (llama.cpp `timings`: predicted_ms over predicted_n - 1), summed over the
  level: how much slower the client saw the streams than the server produced them. The level's
  /metrics deltas must count the same tokens. The client's CPU share of the wall is printed too.
- Prefill: the selftest's own measurement (cold: a fresh --prefill-tokens prompt built in chunks
  under --request-wall-s; warm: the same prompt again).
- Spec decode: accepted/drafted tokens from /metrics (llama.cpp `llamacpp:spec_decode_*`, vLLM
  `vllm:spec_decode_*`) when the engine drafts at all; "none drafted" otherwise.

Writes results.json, summary.md and sweep.png to --out (default bench/out/serve-<UTC time>/) and
ends with `P8 client_overhead_pct=<percent>` at the highest concurrency. On a 2-core machine keep
the server's -t at 2 (or 1 when something else runs) and --max-streams modest; the defaults
(SmolLM2, 64 streams x 64 tokens) finish in a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import REPO, free_port, llama_prefix, spawn, status_code, stop, stop_on_term, wait_until

from supervisor.selftest.client import Client, ClientError, Reply
from supervisor.selftest.measure import measure_prefill
from supervisor.selftest.metrics import Counters

TOPICS = ("Once upon a time, in a harbour town,", "The history of bread begins", "A good database index",
          "The printing press changed", "On a clear autumn morning the forest", "The water cycle starts when")


@dataclass
class Stream:
    reply: Reply | None = None
    error: str | None = None

    @property
    def steps(self) -> int:
        """Tokens decoded after the first chunk (several a chunk under speculation: Reply.decode_steps)."""
        return self.reply.decode_steps if self.reply else 0

    @property
    def client_span(self) -> float:
        return self.reply.decode_span_s if self.reply else 0.0

    @property
    def engine(self) -> tuple[int, float] | None:
        t = (self.reply.timings or {}) if self.reply else {}
        n, ms = t.get("predicted_n"), t.get("predicted_ms")
        if isinstance(n, (int, float)) and isinstance(ms, (int, float)) and n > 1 and ms > 0:
            return int(n) - 1, ms / 1000.0
        return None

    @property
    def tokens(self) -> int:
        if not self.reply:
            return 0
        return self.reply.completion_tokens or len(self.reply.chunk_times)


@dataclass
class Level:
    streams: int
    wall_s: float = 0.0
    client_cpu_s: float = 0.0
    results: list[Stream] = field(default_factory=list)
    metrics: Counters | None = None

    @property
    def ok(self) -> list[Stream]:
        return [s for s in self.results if s.reply is not None]

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.ok)

    @property
    def aggregate(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def per_stream_client(self) -> float | None:
        rates = [s.steps / s.client_span for s in self.ok if s.steps and s.client_span > 0]
        return sum(rates) / len(rates) if rates else None

    @property
    def per_stream_engine(self) -> float | None:
        rates = [e[0] / e[1] for s in self.ok if (e := s.engine)]
        return sum(rates) / len(rates) if rates else None

    @property
    def overhead_pct(self) -> float | None:
        """Client time per decode step over the engine's, summed over streams, minus one.

        The engine's side is llama.cpp's per-reply `timings`; a server without them (vLLM) is read
        from the level's /metrics delta instead: summed per-request decode time over decode steps
        (every request's first token comes from prefill, so steps = tokens - requests)."""
        pairs = [(s, s.engine) for s in self.ok if s.steps and s.engine]
        if pairs:
            client = sum(s.client_span for s, _ in pairs) / sum(s.steps for s, _ in pairs)
            engine = sum(e[1] for _, e in pairs) / sum(e[0] for _, e in pairs)
            return (client / engine - 1.0) * 100.0
        m = self.metrics
        streamed = [s for s in self.ok if s.steps]
        if not (m and m.decode_seconds and m.decode_tokens and streamed):
            return None
        engine_steps = m.decode_tokens - len(self.ok)
        if engine_steps <= 0:
            return None
        client = sum(s.client_span for s in streamed) / sum(s.steps for s in streamed)
        return (client / (m.decode_seconds / engine_steps) - 1.0) * 100.0

    def usd_per_m(self, hourly: float) -> float | None:
        return hourly / 3600.0 / self.aggregate * 1e6 if self.aggregate > 0 else None

    def to_dict(self, hourly: float) -> dict[str, Any]:
        m = self.metrics
        return {"streams": self.streams, "ok": len(self.ok), "errors": [s.error for s in self.results if s.error],
                "tokens": self.tokens, "wall_s": round(self.wall_s, 4), "aggregate_tok_s": round(self.aggregate, 3),
                "per_stream_client_tok_s": _r(self.per_stream_client), "per_stream_engine_tok_s": _r(self.per_stream_engine),
                "usd_per_m_output": _r(self.usd_per_m(hourly), 4), "client_overhead_pct": _r(self.overhead_pct, 3),
                "client_cpu_share": round(self.client_cpu_s / self.wall_s, 4) if self.wall_s else None,
                "metrics_delta": m.to_dict() if m else None,
                "metrics_tokens_agree": None if not m or m.decode_tokens is None else m.decode_tokens == self.tokens}


def levels(max_streams: int) -> list[int]:
    out, n = [], 1
    while n < max_streams:
        out.append(n)
        n *= 2
    return out + [max_streams]


def run_level(client: Client, n: int, tokens: int, tag: str, params: dict[str, Any], wall_s: float, bar: Any) -> Level:
    lvl = Level(streams=n, results=[Stream() for _ in range(n)])
    prompts = [f"[{tag} | {n} streams | stream {i}] {TOPICS[i % len(TOPICS)]}" for i in range(n)]
    start = threading.Barrier(n + 1)

    def one(i: int) -> None:
        start.wait()
        try:
            lvl.results[i].reply = client.complete(prompts[i], max_tokens=tokens, stream=True, timeout_s=wall_s,
                                                   ignore_eos=True, **params)
        except ClientError as e:
            lvl.results[i].error = str(e)
        bar.update(1)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    before = Counters.from_text(client.metrics())
    cpu0 = time.process_time()
    start.wait()
    for t in threads:
        t.join()
    lvl.client_cpu_s = time.process_time() - cpu0
    sent = [s.reply.t_sent for s in lvl.results if s.reply]
    done = [s.reply.t_done for s in lvl.results if s.reply]
    lvl.wall_s = (max(done) - min(sent)) if sent else 0.0
    after = Counters.from_text(client.metrics())
    lvl.metrics = after.minus(before) if before.decode_tokens is not None else None
    return lvl


def start_server(args: argparse.Namespace, tmp: Path) -> tuple[Any, str, list[str]]:
    import subprocess

    from kiln_dev.models import make_tiny_gguf, smollm2_gguf

    model = {"smollm2": smollm2_gguf, "tiny": lambda: make_tiny_gguf(tmp / "tiny.gguf")}.get(args.model)
    path = Path(model()) if model else Path(args.model)
    port = free_port()
    ctx = max(args.max_streams * args.ctx_per_stream, args.prefill_tokens + 1024)
    argv = [str(llama_prefix() / "bin" / "llama-server"), "--model", str(path), "--host", "127.0.0.1",
            "--port", str(port), "-t", str(args.threads), "--parallel", str(args.max_streams), "--kv-unified",
            "-c", str(ctx), "--metrics"]
    log = open(tmp / "llama-server.log", "w")
    proc = spawn(argv, stdout=log, stderr=subprocess.STDOUT)  # dies with this bench, however it ends
    try:
        wait_until(lambda: proc.poll() is not None or status_code(f"http://127.0.0.1:{port}/health") == 200, 300, 0.02)
    except TimeoutError:
        stop(proc, 0)
        raise
    if proc.poll() is not None:
        sys.exit(f"llama-server exited {proc.returncode}: see {tmp / 'llama-server.log'}")
    return proc, f"http://127.0.0.1:{port}", argv


def write_outputs(out: Path, data: dict[str, Any], lvls: list[Level], hourly: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(data, indent=2) + "\n")
    base = lvls[0].aggregate if lvls and lvls[0].aggregate else None
    rows = ["| streams | tokens | duration (s) | aggregate tok/s | per stream tok/s (client) | per stream (engine) "
            "| speed-up | $/1M output | client overhead |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for lv in lvls:
        speed = f"{lv.aggregate / base:.2f}x" if base else "—"
        rows.append(f"| {lv.streams} | {lv.tokens} | {lv.wall_s:.2f} | {lv.aggregate:.2f} | {_f(lv.per_stream_client)} "
                    f"| {_f(lv.per_stream_engine)} | {speed} | {_f(lv.usd_per_m(hourly), 3, '$')} "
                    f"| {_f(lv.overhead_pct, 2, suffix=' %')} |")
    p = data["prefill"]
    lines = [f"# Serving bench: {data['server']['url']}", "", f"{data['when']}; {data['server']['describe']}; "
             f"{data['tokens_per_stream']} tokens per stream, hourly price ${hourly:g}.", "", *rows, ""]
    if p:
        lines += [f"Prefill: cold {_f(p['cold_tok_s'])} tok/s on {p['chunked']['total_tokens'] if p['chunked'] else '?'} "
                  f"tokens ({len(p['chunked']['chunks']) if p['chunked'] else 0} chunk(s), engine "
                  f"{_f(p['cold_engine_tok_s'])} tok/s); warm {p['warm_new_tokens']} token(s) reprocessed in "
                  f"{_f(p['warm_wall_s'], 3)} s ({_f(p['warm_tok_s'])} tok/s effective)"
                  + (f"; error: {p['error']}" if p["error"] else ""), ""]
    s = data["spec_decode"]
    lines += [f"Speculative decoding: {s['describe']}", ""]
    (out / "summary.md").write_text("\n".join(lines))
    plot(out / "sweep.png", lvls, hourly, data["server"]["describe"])


def plot(path: Path, lvls: list[Level], hourly: float, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [lv.streams for lv in lvls]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.plot(xs, [lv.aggregate for lv in lvls], "o-", label="aggregate tok/s")
    ax.plot(xs, [lv.per_stream_client or 0 for lv in lvls], "s--", label="per-stream tok/s")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("output tokens / s")
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(xs, [lv.usd_per_m(hourly) or 0 for lv in lvls], "^:", color="tab:red", label=f"\\$/1M output @ \\${hourly:g}/h")
    ax2.set_ylabel("\\$ per 1M output tokens")
    ax2.set_ylim(bottom=0)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an OpenAI-compatible server (else a local llama-server is started)")
    ap.add_argument("--api-key-env", metavar="NAME", help="environment variable holding the server's API key")
    ap.add_argument("--model", default="smollm2", help="local server: smollm2 | tiny | a GGUF path (default smollm2)")
    ap.add_argument("--max-streams", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64, help="output tokens per stream (default 64, as the field notes)")
    ap.add_argument("--threads", type=int, default=2, help="local server's -t (default 2: this machine's cores)")
    ap.add_argument("--ctx-per-stream", type=int, default=256)
    ap.add_argument("--hourly-usd", type=float, default=0.44, help="price of the machine per hour (default: an A40)")
    ap.add_argument("--prefill-tokens", type=int, default=3000, help="cold/warm prefill prompt; 0 skips")
    ap.add_argument("--request-wall-s", type=float, default=100.0)
    ap.add_argument("--out", type=Path, help="default bench/out/serve-<UTC time>/")
    args = ap.parse_args()
    if args.max_streams < 1 or args.tokens < 2:
        ap.error("--max-streams >= 1 and --tokens >= 2")
    from tqdm import tqdm

    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out = args.out or REPO / "bench" / "out" / f"serve-{when.replace(':', '')}"
    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    with tempfile.TemporaryDirectory(prefix="kiln-bench-serve-") as t:
        proc, argv = None, None
        if args.url:
            url, describe = args.url, args.url
        else:
            proc, url, argv = start_server(args, Path(t))
            describe = (f"local llama-server, model {args.model}, -t {args.threads}, --parallel {args.max_streams}, "
                        f"{os.cpu_count()} cores")
        try:
            client = Client(url, key, timeout_s=args.request_wall_s)
            engine = client.detect()
            client.model()
            params = client.greedy()
            start_counters = Counters.from_text(client.metrics())
            prefill = None
            if args.prefill_tokens:
                print(f"prefill: {args.prefill_tokens} tokens cold (chunks under {args.request_wall_s:g} s), then warm",
                      file=sys.stderr)
                prefill = measure_prefill(client, args.prefill_tokens, wall_s=args.request_wall_s, params=params)
            lv_list = levels(args.max_streams)
            tag = f"{time.time_ns():x}"
            results: list[Level] = []
            with tqdm(total=sum(lv_list), unit="stream", desc="sweep", file=sys.stderr) as bar:
                for n in lv_list:
                    bar.set_postfix_str(f"{n} streams")
                    results.append(run_level(client, n, args.tokens, tag, params, args.request_wall_s, bar))
            total = Counters.from_text(client.metrics()).minus(start_counters)
        finally:
            if proc is not None:
                # 10 s: a llama-server in the middle of a long prefill may finish its batch before it
                # heeds TERM; 30 s here was as long as a caller (timeout -k, the test) waits for the bench
                stop(proc, 10)
    acc = total.spec_acceptance
    spec = {"drafts": total.spec_drafts, "draft_tokens": total.spec_draft_tokens,
            "accepted_tokens": total.spec_accepted_tokens, "acceptance": acc,
            "describe": (f"{acc:.1%} of {total.spec_draft_tokens:.0f} drafted tokens accepted" if acc is not None else
                         "none drafted (no draft model / speculation off)" if total.spec_draft_tokens == 0 else
                         "not exposed by this server's /metrics")}
    data = {"when": when, "server": {"url": url, "engine": engine, "describe": describe, "argv": argv},
            "tokens_per_stream": args.tokens, "hourly_usd": args.hourly_usd,
            "levels": [lv.to_dict(args.hourly_usd) for lv in results],
            "prefill": prefill.to_dict() if prefill else None, "spec_decode": spec}
    write_outputs(out, data, results, args.hourly_usd)
    print((out / "summary.md").read_text())
    base = results[0].aggregate or 1.0
    print("streams  aggregate  per-stream  speed-up  $/1M    overhead  client CPU  /metrics tokens")
    for lv in results:
        d = lv.to_dict(args.hourly_usd)
        print(f"{lv.streams:>7}  {lv.aggregate:>9.2f}  {_f(lv.per_stream_client):>10}  {lv.aggregate / base:>7.2f}x  "
              f"{_f(lv.usd_per_m(args.hourly_usd), 3):>6}  {_f(lv.overhead_pct, 2):>7} %  {d['client_cpu_share']:>9.1%}  "
              f"{'agree' if d['metrics_tokens_agree'] else d['metrics_tokens_agree']}")
    print(f"wrote {out}/results.json, summary.md, sweep.png")
    top = results[-1]
    errors = sum(1 for s in top.results if s.error)
    if errors:
        print(f"{errors} of {top.streams} streams failed at the highest concurrency: {top.results[0].error}",
              file=sys.stderr)
    print(f"P8 client_overhead_pct={_f(top.overhead_pct, 3)}")
    return 0 if top.overhead_pct is not None else 1


def _r(v: float | None, nd: int = 3) -> float | None:
    return None if v is None else round(v, nd)


def _f(v: float | None, nd: int = 2, prefix: str = "", suffix: str = "") -> str:
    return "—" if v is None else f"{prefix}{v:.{nd}f}{suffix}"


if __name__ == "__main__":
    stop_on_term()
    sys.exit(main())
