#!/usr/bin/env python3
"""P14: a cache-aware router against round robin in front of the same replicas, and what the router
adds to a request. Three replicas under Kiln's supervisor (SmolLM2-135M Q4_1, `-t 1 -c 4096 -np 1`,
their selftest passed) and two routers under supervisors of their own (smg 1.13.0, fed by the
replicas' /ready), one with `--policy cache_aware`, one with `round_robin`, on loopback.

The workload, an agent's: --sessions sessions, each with its own long system prompt (a tool list and
a reference list, ~--system-words words) and a history that grows by one user turn and the reply
each turn; --turns turns, interleaved across sessions (s0t0, s1t0, ..., s0t1, ...), one request at a
time (two shared cores). Each policy gets sessions of its own (different system prompts), so
neither finds the other's prefixes in a cache. Time to first token: the first streamed content
chunk. Prefix hits: the engine's own counters, per request `timings.cache_n` (prompt tokens taken
from its KV or prompt cache) in the final chunk, and per replica the growth of its own
`llamacpp:prompt_tokens_total` (prompt tokens it computed) against the prompt tokens it was sent.

Router's added latency: a short request (max_tokens 1), the same one through the cache-aware router
and straight to the replica that served it, alternated, --pairs times; the median of the pairs'
differences.

    python bench/router.py [--sessions 6] [--turns 4] [--system-words 300] [--pairs 30]

Ends with `P14 ttft_cache_aware_over_round_robin=X router_added_ms_p50=Y` (goals: X <= 0.5, Y <= 5).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import REPO, llama_prefix, stop_on_term  # noqa: F401 - REPO puts the checkout on sys.path

from kiln_dev.models import smollm2_gguf
from kiln_dev.router import KEY, Fleet, router_config, router_python
from kiln_dev.supervised import Supervised, free_port, http, wait_for

TOOLS = ["read_file(path)", "write_file(path, text)", "run_tests(pattern)", "search(query)", "list_dir(path)",
         "git_diff()", "apply_patch(diff)", "ask_user(question)"]
TOPICS = ["rivers", "violins", "glaciers", "compilers", "bees", "lighthouses", "orchards", "comets", "tides",
          "looms", "kilns", "ferns"]


def system_prompt(policy: str, s: int, words: int) -> str:
    topic = TOPICS[s % len(TOPICS)]
    ref = " ".join(f"{topic}-{policy[:2]}-{s}-{i}" for i in range(words))
    return (f"You are coding agent {s} working on a project about {topic}. Tools: {', '.join(TOOLS)}. "
            f"Answer briefly. Reference list for this project: {ref}.")


def stream(url: str, model: str, messages: list[dict[str, str]], max_tokens: int) -> dict:
    """One streamed chat request: time to the first content chunk, the text, the engine's timings."""
    body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    t0 = time.monotonic()
    ttft, text, timings = None, [], {}
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = json.loads(line[6:])
            delta = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
            if delta and ttft is None:
                ttft = time.monotonic() - t0
            if delta:
                text.append(delta)
            timings = chunk.get("timings", timings)
    return {"ttft": ttft if ttft is not None else time.monotonic() - t0, "text": "".join(text) or "ok",
            "cache_n": timings.get("cache_n"), "prompt_n": timings.get("prompt_n")}


def workload(fleet: Fleet, url: str, policy: str, args: argparse.Namespace) -> dict:
    history = {s: [{"role": "system", "content": system_prompt(policy, s, args.system_words)}]
               for s in range(args.sessions)}
    computed0 = [r.prompt_tokens() for r in fleet.replicas]
    rows = []
    for turn in range(args.turns):
        for s in range(args.sessions):
            history[s].append({"role": "user", "content": f"Step {turn}: what do you do next? One sentence."})
            before = [r.prompt_tokens() for r in fleet.replicas]
            out = stream(url, fleet.model, history[s], args.max_tokens)
            after = [r.prompt_tokens() for r in fleet.replicas]
            out.update(session=s, turn=turn, replica=[i for i, (a, b) in enumerate(zip(before, after)) if b > a])
            rows.append(out)
            history[s].append({"role": "assistant", "content": out["text"]})
    computed = sum(r.prompt_tokens() for r in fleet.replicas) - sum(computed0)
    sent = sum((r["cache_n"] or 0) + (r["prompt_n"] or 0) for r in rows)
    per_session = {s: sorted({i for r in rows if r["session"] == s for i in r["replica"]})
                   for s in range(args.sessions)}
    return {"rows": rows, "ttft_mean": statistics.fmean(r["ttft"] for r in rows),
            "ttft_later_mean": statistics.fmean(r["ttft"] for r in rows if r["turn"] > 0),
            "cache_n": sum(r["cache_n"] or 0 for r in rows), "prompt_tokens": sent, "computed": computed,
            "per_session": per_session}


def added_latency(fleet: Fleet, pairs: int) -> tuple[float, float, float, int]:
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say ok."}]
    body = lambda: json.dumps({"model": fleet.model, "messages": msgs, "max_tokens": 1,  # noqa: E731
                               "temperature": 0}).encode()
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    code, out, served = fleet.served_by(msgs, max_tokens=1)             # warms its cache; which replica
    assert code == 200 and len(served) == 1, (code, out, served)
    direct_url = fleet.replicas[served[0]].url
    diffs, via, direct = [], [], []
    for i in range(pairs):
        times = {}
        for name, url in (("router", fleet.url), ("direct", direct_url))[:: 1 if i % 2 == 0 else -1]:
            t0 = time.monotonic()
            code, _ = http(url + "/v1/chat/completions", headers=headers, data=body(), timeout=60)
            times[name] = time.monotonic() - t0
            assert code == 200, code
        via.append(times["router"])
        direct.append(times["direct"])
        diffs.append(times["router"] - times["direct"])
    return statistics.median(diffs) * 1000, statistics.median(via) * 1000, statistics.median(direct) * 1000, served[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-words", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--pairs", type=int, default=30)
    args = ap.parse_args()
    router_python()
    prefix, model = llama_prefix(), smollm2_gguf()
    with tempfile.TemporaryDirectory(prefix="kiln-bench-router-") as t:
        tmp = Path(t)
        with Fleet(tmp, model=model, prefix=prefix, n=3, policy="cache_aware", poll_s=1.0) as fleet:
            rr_dir = tmp / "router-rr"
            rr_dir.mkdir()
            rr_port = free_port()
            rr = Supervised(rr_dir, router_config(rr_dir, port=rr_port, status_port=free_port(),
                                                  metrics_port=free_port(), policy="round_robin", poll_s=1.0,
                                                  replicas=[(r.url, r.status_url) for r in fleet.replicas]),
                            env={"KILN_API_KEY": KEY})
            try:
                fleet.wait_routed(3, timeout=600)
                wait_for(lambda: (rr.status() or {}).get("router", {}).get("routed") == 3, 60, "the round-robin router")
                fleet.model_id()
                results = {}
                for policy, url in (("cache_aware", fleet.url), ("round_robin", f"http://127.0.0.1:{rr_port}")):
                    results[policy] = workload(fleet, url, policy, args)
                added, via, direct, replica = added_latency(fleet, args.pairs)
            finally:
                rr.__exit__(None, None, None)
    ca, rr_ = results["cache_aware"], results["round_robin"]
    print(f"3 replicas (SmolLM2-135M Q4_1, -t 1 -c 4096 -np 1), {args.sessions} sessions x {args.turns} turns, "
          f"system prompt ~{args.system_words} words, {args.max_tokens} tokens a reply, one request at a time")
    for name, r in (("cache_aware", ca), ("round_robin", rr_)):
        hit = r["cache_n"] / r["prompt_tokens"] if r["prompt_tokens"] else 0.0
        print(f"  {name:12s} TTFT mean {r['ttft_mean'] * 1000:7.1f} ms "
              f"(turns after the first {r['ttft_later_mean'] * 1000:7.1f} ms); "
              f"prompt tokens {r['prompt_tokens']}, from cache (timings.cache_n) {r['cache_n']} = {hit:.1%}; "
              f"computed by the engines (prompt_tokens_total) {r['computed']:.0f}; "
              f"replicas per session {r['per_session']}")
    print(f"  router added: median of {args.pairs} pairs {added:.2f} ms (via the router {via:.1f} ms, straight to "
          f"replica {replica} {direct:.1f} ms; max_tokens 1, its prefix cached)")
    print(f"P14 ttft_cache_aware_over_round_robin={ca['ttft_mean'] / rr_['ttft_mean']:.3f} "
          f"router_added_ms_p50={added:.2f}")
    return 0


if __name__ == "__main__":
    stop_on_term()
    sys.exit(main())
