#!/usr/bin/env python3
"""P14: a cache-aware router against round robin in front of the same replicas, and what the router
adds to a request. Three replicas under Kiln's supervisor (SmolLM2-135M Q4_1, `-t 1 -c 4096 -np 1`,
their selftest passed) and two routers under supervisors of their own (smg, fed by the replicas'
/ready, with Kiln's default smg arguments: supervisor/engines/router.py), one `cache_aware`, one
`round_robin`, on loopback.

The workload, an agent team's (issue 37 item 11: the old one, one request at a time in a fixed
order, made round robin session-sticky by arithmetic whenever the session count was a multiple of
the replica count): --sessions sessions (default 5: not a multiple of 3), each with its own long
system prompt (a tool list and a reference list, ~--system-words words) and a history that grows by
one user turn and the reply each turn. Sessions arrive at seeded random times (exponential gaps,
mean --arrival-s) and each waits a seeded random think time (mean --think-s) after a reply before its
next turn, so sessions overlap and several requests are in flight at once; the order in which turns
reach the router is whatever the replies' speed makes it. Both policies get the same schedule (the
same seed), one policy after the other in the same run, and every workload (each session count, each
policy) has sessions of its own (system prompts no other workload sends), so none finds another's
prefixes in a cache.

Figures: time to first token (the first streamed content chunk; queueing at a busy replica
included), mean and p95; prefix hits by the engine's own counters (`timings.cache_n` per request);
each replica's share of the load, the prompt tokens it was sent (its `llamacpp:prompt_tokens_total`
plus `llamacpp:prompt_tokens_cached_total`), against a fair share of 1/3. The load each workload put on
the machine: one cold session prompt sent alone to an idle replica first gives the machine's prefill
rate on one thread, and each workload's computed prompt tokens at that rate, over its wall time and
the cores the replicas can use, say how much of the machine its prefills asked for (above 1: more
than it has, and time to first token is mostly queueing); with the same rate, an estimate of the
ratio were nothing queued (no_queueing_ratio). --rows keeps every request.

Router's added latency: a short request (max_tokens 1), the same one through the cache-aware router
and straight to the replica that served it, alternated, --pairs times; the median of the differences.

    python bench/router.py [--sessions 5] [--turns 4] [--seed 1] [--arrival-s 2] [--think-s 1] [--pairs 30] [--slots 1]
                           [--rows requests.json]

Ends with `P14 ttft_cache_aware_over_round_robin=X p95_ratio=P max_share_over_fair=S router_added_ms_p50=Y`
(goals: X <= 0.5, P <= 1, S <= 1.5, Y <= 5).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from common import REPO, llama_prefix, stop_on_term  # noqa: F401 - REPO puts the checkout on sys.path

from kiln_dev.models import smollm2_gguf
from kiln_dev.router import KEY, Fleet, router_config, router_python
from kiln_dev.supervised import Supervised, free_port, http, wait_for

TOOLS = ["read_file(path)", "write_file(path, text)", "run_tests(pattern)", "search(query)", "list_dir(path)",
         "git_diff()", "apply_patch(diff)", "ask_user(question)"]
TOPICS = ["rivers", "violins", "glaciers", "compilers", "bees", "lighthouses", "orchards", "comets", "tides",
          "looms", "kilns", "ferns"]
REPLICAS = 3
DEFAULTS = {"sessions": [5], "turns": 4, "seed": 1, "arrival_s": 2.0, "think_s": 1.0}


# -- the schedule: pure, seeded ------------------------------------------------------------------
@dataclass(frozen=True)
class SessionPlan:
    arrival_s: float                 # when its first turn is sent, from the phase's start
    think_s: tuple[float, ...]       # the wait after each reply before the next turn


def schedule(sessions: int, turns: int, *, seed: int, arrival_s: float, think_s: float) -> list[SessionPlan]:
    """Seeded random arrivals (exponential gaps, mean `arrival_s`; the first at 0) and think times
    (exponential, mean `think_s`)."""
    rng = random.Random(seed)
    at, plans = 0.0, []
    for s in range(sessions):
        if s:
            at += rng.expovariate(1.0 / arrival_s)
        plans.append(SessionPlan(round(at, 3), tuple(round(rng.expovariate(1.0 / think_s), 3)
                                                     for _ in range(turns - 1))))
    return plans


def send_order(plans: list[SessionPlan], reply_s: float) -> list[tuple[float, int, int]]:
    """(sent at, session, turn) in the order the router would see them if every reply took `reply_s`:
    what round robin's choices follow. Measured replies vary; this is for checking the workload."""
    sent = []
    for s, p in enumerate(plans):
        t = p.arrival_s
        for turn in range(len(p.think_s) + 1):
            sent.append((t, s, turn))
            if turn < len(p.think_s):
                t += reply_s + p.think_s[turn]
    return sorted(sent)


def most_in_flight(order: list[tuple[float, int, int]], reply_s: float) -> int:
    """The most requests in flight at once for this send order."""
    return max(sum(1 for t2, _, _ in order if t2 <= t < t2 + reply_s) for t, _, _ in order)


def round_robin_replicas(order: list[tuple[float, int, int]], replicas: int) -> dict[int, set[int]]:
    """Which replicas each session's turns would reach under round robin in this order."""
    out: dict[int, set[int]] = {}
    for i, (_, s, _) in enumerate(order):
        out.setdefault(s, set()).add(i % replicas)
    return out


def p95(values: list[float]) -> float:
    """The nearest-rank 95th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def no_queueing_ratio(ca_rows: list[dict], rr_rows: list[dict], per_s: float) -> tuple[float, int, int, float]:
    """An estimate of cache-aware's ratio to round robin on the turns this run had, were nothing ever
    queued: a turn that computed most of its prompt (every first turn, and round robin's later turns
    that found their session nowhere) costs its computed tokens at the calibrated rate (one thread,
    an idle replica); every other turn what cache-aware's later turns took (their median, queueing
    included, the same for both). Returns (the estimate, round robin's cold later turns, its later
    turns, the warm turn's seconds). A measured ratio near it is the workload's arithmetic rather than
    the policy: under round robin too a turn often returns to a replica still holding its session's
    prompt (in a slot, or llama-server's host prompt cache)."""
    def cold(r: dict) -> bool:
        return (r["prompt_n"] or 0) > ((r["prompt_n"] or 0) + (r["cache_n"] or 0)) / 2

    later_ca = [r["ttft"] for r in ca_rows if r["turn"] > 0]
    warm = statistics.median(later_ca) if later_ca else 0.0

    def cost(rows: list[dict]) -> float:
        return sum((r["prompt_n"] or 0) / per_s if r["turn"] == 0 or cold(r) else warm for r in rows)

    ca = cost([r for r in ca_rows if r["turn"] == 0]) + len(later_ca) * warm
    rr = cost(rr_rows)
    rr_later = [r for r in rr_rows if r["turn"] > 0]
    return (ca / rr if rr else 0.0), sum(1 for r in rr_later if cold(r)), len(rr_later), warm


def shares(sent: list[float]) -> list[float]:
    """Each replica's share of the prompt tokens sent to all of them."""
    total = sum(sent)
    return [x / total if total else 0.0 for x in sent]


# -- running it ------------------------------------------------------------------------------------
def workloads(session_counts: list[int]) -> list[tuple[int, str, str]]:
    """(sessions, policy, tag) in the order they run; the tag is in every word of the workload's
    reference lists, so no workload finds another's prompts in a replica's cache. (Until 2026-12-05 the
    tag was the policy's first two letters: the 7-session workloads repeated the 5-session ones'
    first five prompts and found them warm.)"""
    return [(n, policy, f"w{i * 2 + j}") for i, n in enumerate(session_counts)
            for j, policy in enumerate(("cache_aware", "round_robin"))]


CALIBRATION_TAG = "k0"          # as long as the workloads' tags: its prompt is a session prompt's size


def system_prompt(tag: str, s: int, words: int) -> str:
    """The tag leads, so no two workloads share even the header."""
    topic = TOPICS[s % len(TOPICS)]
    ref = " ".join(f"{topic}-{tag}-{s}-{i}" for i in range(words))
    return (f"[{tag}] You are coding agent {s} working on a project about {topic}. Tools: {', '.join(TOOLS)}. "
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


def sent_tokens(fleet: Fleet) -> list[float]:
    return [c["computed"] + c["cached"] for c in (r.counters() for r in fleet.replicas)]


class LoadSampler:
    """The machine's 1-minute load average every 5 s while a workload runs (it is shared)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.stop_ = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self.stop_.wait(5.0):
                return

    def __enter__(self) -> "LoadSampler":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_.set()
        self.thread.join()

    def text(self) -> str:
        s = self.samples
        return f"load {statistics.fmean(s):.1f} ({min(s):.1f}-{max(s):.1f})" if s else "load ?"


def workload(fleet: Fleet, url: str, tag: str, plans: list[SessionPlan], args: argparse.Namespace) -> dict:
    with LoadSampler() as load:
        out = _workload(fleet, url, tag, plans, args)
    out["load"] = load.text()
    return out


def _workload(fleet: Fleet, url: str, tag: str, plans: list[SessionPlan], args: argparse.Namespace) -> dict:
    rows: list[dict] = []
    lock = threading.Lock()
    start = time.monotonic()
    sent0 = sent_tokens(fleet)

    def session(s: int, plan: SessionPlan) -> None:
        history = [{"role": "system", "content": system_prompt(tag, s, args.system_words)}]
        time.sleep(max(0.0, start + plan.arrival_s - time.monotonic()))   # the schedule's arrival, not a wait
        for turn in range(len(plan.think_s) + 1):
            history.append({"role": "user", "content": f"Step {turn}: what do you do next? One sentence."})
            out = stream(url, fleet.model, history, args.max_tokens)
            out.update(session=s, turn=turn, at=round(time.monotonic() - start, 2))
            with lock:
                rows.append(out)
            history.append({"role": "assistant", "content": out["text"]})
            if turn < len(plan.think_s):
                time.sleep(plan.think_s[turn])                               # the schedule's think time

    threads = [threading.Thread(target=session, args=(s, p), daemon=True) for s, p in enumerate(plans)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    sent = [b - a for a, b in zip(sent0, sent_tokens(fleet))]
    ttfts = [r["ttft"] for r in rows]
    prompt = sum((r["cache_n"] or 0) + (r["prompt_n"] or 0) for r in rows)
    return {"rows": rows, "ttft_mean": statistics.fmean(ttfts), "ttft_p95": p95(ttfts), "wall_s": wall,
            "cache_n": sum(r["cache_n"] or 0 for r in rows), "prompt_tokens": prompt, "shares": shares(sent),
            "sent": sent}


def cold_prefill(fleet: Fleet, words: int) -> dict:
    """One cold session-shaped prompt straight to a replica while nothing else runs: the machine's
    prefill rate on one thread, to say how much of the machine each workload's prefills asked for."""
    msgs = [{"role": "system", "content": system_prompt(CALIBRATION_TAG, 0, words)},
            {"role": "user", "content": "Step 0: what do you do next? One sentence."}]
    code, out = fleet.chat(msgs, max_tokens=1, url=fleet.replicas[0].url, timeout=600)
    timings = out.get("timings") or {}
    assert code == 200 and timings.get("prompt_n"), (code, out)
    return {"tokens": timings["prompt_n"], "s": timings["prompt_ms"] / 1000,
            "per_s": timings["prompt_n"] / (timings["prompt_ms"] / 1000)}


def usable_cores() -> int:
    """The cores the replicas can use: one thread each (-t 1), at most the machine's."""
    return min(os.cpu_count() or 1, REPLICAS)


def demand(r: dict, per_s: float, cores: int) -> str:
    """The prompt tokens a workload's replicas computed, as core-seconds at the calibrated rate, over
    the usable cores and the workload's wall time: above 1, its prefills asked for more than they had."""
    computed = sum(x["prompt_n"] or 0 for x in r["rows"])
    core_s = computed / per_s
    return f"prefill demand {core_s:.0f} core-s in {r['wall_s']:.0f} s on {cores} cores = {core_s / (cores * r['wall_s']):.2f}"


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


def router_extra(args_text: str) -> str:
    return f"extra_args = {json.dumps(args_text.split())}\n" if args_text.strip() else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=DEFAULTS["sessions"],
                    help="session counts, each a workload of its own in the same run (default 5)")
    ap.add_argument("--turns", type=int, default=DEFAULTS["turns"])
    ap.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    ap.add_argument("--arrival-s", type=float, default=DEFAULTS["arrival_s"],
                    help="mean gap between two sessions' arrivals")
    ap.add_argument("--think-s", type=float, default=DEFAULTS["think_s"],
                    help="mean wait after a reply before the next turn")
    ap.add_argument("--system-words", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--slots", type=int, default=1, help="llama-server slots per replica (-np; -c is 4096 a slot): "
                    "1, a replica serves one request at a time, as in P14's earlier runs")
    ap.add_argument("--rows", type=Path, help="also write every request (session, turn, when it ended, TTFT, "
                    "cache_n, prompt_n, the reply's text) of every workload to this JSON file")
    ap.add_argument("--router-args", default="", help="more smg flags for both routers ([router] extra_args), "
                    "on top of Kiln's defaults: for tuning")
    args = ap.parse_args()
    if len(set(args.sessions)) != len(args.sessions) or min(args.sessions) < 1:
        ap.error(f"--sessions {' '.join(map(str, args.sessions))}: each count once, each at least 1 "
                 "(each is a workload of its own)")
    router_python()
    prefix, model = llama_prefix(), smollm2_gguf()
    extra = router_extra(args.router_args)
    load0, started = os.getloadavg(), time.time()
    results: dict[int, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="kiln-bench-router-") as t:
        tmp = Path(t)
        with Fleet(tmp, model=model, prefix=prefix, n=REPLICAS, policy="cache_aware", poll_s=1.0,
                   router_extra=extra, slots=args.slots) as fleet:
            rr_dir = tmp / "router-rr"
            rr_dir.mkdir()
            rr_port = free_port()
            rr = Supervised(rr_dir, router_config(rr_dir, port=rr_port, status_port=free_port(),
                                                  metrics_port=free_port(), policy="round_robin", poll_s=1.0,
                                                  replicas=[(r.url, r.status_url) for r in fleet.replicas],
                                                  extra=extra),
                            env={"KILN_API_KEY": KEY})
            try:
                fleet.wait_routed(REPLICAS, timeout=600)
                wait_for(lambda: (rr.status() or {}).get("router", {}).get("routed") == REPLICAS, 60,
                         "the round-robin router")
                fleet.model_id()
                calib = cold_prefill(fleet, args.system_words)
                ca_argv = (fleet.router.status() or {}).get("engine", {}).get("argv", [])
                urls = {"cache_aware": fleet.url, "round_robin": f"http://127.0.0.1:{rr_port}"}
                for n, policy, tag in workloads(args.sessions):
                    plans = schedule(n, args.turns, seed=args.seed, arrival_s=args.arrival_s, think_s=args.think_s)
                    results.setdefault(n, {})[policy] = workload(fleet, urls[policy], tag, plans, args)
                added, via, direct, replica = added_latency(fleet, args.pairs)
            finally:
                rr.__exit__(None, None, None)
    load1 = os.getloadavg()
    smg_args = ca_argv[ca_argv.index("--") + 1:] if "--" in ca_argv else ca_argv
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))} to {time.strftime('%H:%M', time.gmtime())}, "
          f"{os.uname().nodename}, {os.cpu_count()} cores; load average {load0[0]:.2f} at the start, {load1[0]:.2f} "
          "at the end (1 min); during each workload: mean (min-max) of 5 s samples")
    print(f"{REPLICAS} replicas (SmolLM2-135M Q4_1, -t 1 -c {4096 * args.slots} -np {args.slots}); "
          f"{args.turns} turns a session, "
          f"seed {args.seed}, arrivals every {args.arrival_s:g} s and think times of {args.think_s:g} s on average, "
          f"system prompt ~{args.system_words} words, {args.max_tokens} tokens a reply")
    print(f"  one cold session prompt alone on an idle replica (one thread): {calib['tokens']} tokens in "
          f"{calib['s']:.2f} s = {calib['per_s']:.0f} tokens/s, the rate each workload's prefill demand is counted at")
    print(f"  cache-aware smg arguments: {' '.join(a for a in smg_args if not a.startswith('/'))}")
    lines = []
    for n, by_policy in results.items():
        ca, rr_ = by_policy["cache_aware"], by_policy["round_robin"]
        flight = most_in_flight(send_order(schedule(n, args.turns, seed=args.seed, arrival_s=args.arrival_s,
                                                    think_s=args.think_s), 1.0), 1.0)
        last = max(p.arrival_s for p in schedule(n, args.turns, seed=args.seed, arrival_s=args.arrival_s,
                                                  think_s=args.think_s))
        firsts = sum(r["prompt_n"] or 0 for r in ca["rows"] if r["turn"] == 0) / calib["per_s"]
        print(f"  {n} sessions (at most {flight} in flight by the schedule, with 1 s replies; their {n} cold first "
              f"turns ask for ~{firsts:.0f} core-s of prefill and arrive within {last:.1f} s, on "
              f"{usable_cores()} usable cores):")
        for name, r in (("cache_aware", ca), ("round_robin", rr_)):
            hit = r["cache_n"] / r["prompt_tokens"] if r["prompt_tokens"] else 0.0
            print(f"    {name:12s} TTFT mean {r['ttft_mean'] * 1000:7.1f} ms, p95 {r['ttft_p95'] * 1000:7.1f} ms; "
                  f"from cache (timings.cache_n) {r['cache_n']} of {r['prompt_tokens']} prompt tokens = {hit:.1%}; "
                  f"each replica's share of the prompt tokens sent "
                  f"{' / '.join(f'{s:.0%}' for s in r['shares'])}; {r['wall_s']:.0f} s, {r['load']}; "
                  f"{demand(r, calib['per_s'], usable_cores())}")
        est, cold, later, warm = no_queueing_ratio(ca["rows"], rr_["rows"], calib["per_s"])
        print(f"    with no queueing: round robin computed {cold} of its {later} later turns cold; at "
              f"{calib['per_s']:.0f} tokens/s and {warm:.2f} s a warm turn, cache-aware's ratio on these turns "
              f"would be about {est:.3f}")
        ratio = ca["ttft_mean"] / rr_["ttft_mean"]
        p95_ratio = ca["ttft_p95"] / rr_["ttft_p95"]
        over_fair = max(ca["shares"]) * REPLICAS
        lines.append(f"P14 sessions={n} ttft_cache_aware_over_round_robin={ratio:.3f} p95_ratio={p95_ratio:.3f} "
                     f"max_share_over_fair={over_fair:.2f}")
    print(f"  router added: median of {args.pairs} pairs {added:.2f} ms (via the router {via:.1f} ms, straight to "
          f"replica {replica} {direct:.1f} ms; max_tokens 1, its prefix cached)")
    for line in lines:
        print(f"{line} router_added_ms_p50={added:.2f}")
    if args.rows:
        args.rows.write_text(json.dumps({str(n): {policy: sorted(r["rows"], key=lambda x: (x["session"], x["turn"]))
                                                  for policy, r in by_policy.items()}
                                         for n, by_policy in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    stop_on_term()
    sys.exit(main())
