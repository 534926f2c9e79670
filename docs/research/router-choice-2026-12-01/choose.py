#!/usr/bin/env python3
"""The experiment behind docs/research/router-choice-2026-12-01.md: vllm-router 0.1.17 and smg
1.13.0, each with its cache-aware policy, in front of three real llama-servers (SmolLM2-135M,
`-t 1`, `--api-key K`, `--metrics`) on loopback.

    python choose.py --llama-server BIN --model GGUF --vllm-router BIN --smg BIN [--out FILE]

For each router: (1) a multi-turn workload (4 sessions, each with its own system prompt and a
growing history, turns interleaved, one request at a time) and, per request, the replica that
served it (the replica whose own /metrics `llamacpp:prompt_tokens_total` moved) and the engine's
own `timings.cache_n` (prompt tokens taken from its KV cache); (2) the client key: each route
asked with no key, a wrong key and the right key; (3) the calls the router itself made to the
replicas, recorded by a pass-through (`Tap`) in front of each replica.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

KEY = "choose-key-3141"
SESSIONS = 4
TURNS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, *, key: str | None = None, body: dict | None = None, method: str | None = None,
         timeout: float = 120) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        return 0, str(e).encode()


def wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def prompt_tokens_total(port: int) -> float:
    code, body = http(f"http://127.0.0.1:{port}/metrics", key=KEY, timeout=5)
    if code != 200:
        return -1.0
    m = re.search(rb"^llamacpp:prompt_tokens_total (\S+)$", body, re.M)
    return float(m.group(1)) if m else -1.0


def system_prompt(s: int) -> str:
    topics = ["rivers", "violins", "glaciers", "compilers", "bees", "lighthouses"]
    words = " ".join(f"{topics[s]}-{i}" for i in range(120))
    return f"You are assistant number {s}. You only talk about {topics[s]}. Reference list: {words}."


def workload(router: str, ports: list[int], log, model: str) -> list[dict]:
    history = {s: [{"role": "system", "content": system_prompt(s)}] for s in range(SESSIONS)}
    rows = []
    for turn in range(TURNS):
        for s in range(SESSIONS):
            history[s].append({"role": "user", "content": f"Turn {turn}: say one short sentence."})
            before = [prompt_tokens_total(p) for p in ports]
            t0 = time.monotonic()
            code, body = http(f"{router}/v1/chat/completions", key=KEY,
                              body={"model": model, "messages": history[s], "max_tokens": 8, "temperature": 0})
            dt = time.monotonic() - t0
            after = [prompt_tokens_total(p) for p in ports]
            moved = [i for i, (a, b) in enumerate(zip(before, after)) if b > a]
            row = {"session": s, "turn": turn, "status": code, "s": round(dt, 3), "replica": moved}
            if code == 200:
                out = json.loads(body)
                history[s].append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
                row["prompt_tokens"] = out.get("usage", {}).get("prompt_tokens")
                row["cache_n"] = out.get("timings", {}).get("cache_n")
                row["cached_tokens"] = out.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens")
            else:
                row["body"] = body[:200].decode(errors="replace")
                history[s].append({"role": "assistant", "content": "ok"})
            rows.append(row)
            log(json.dumps(row))
    return rows


def auth_matrix(router: str, log, model: str) -> list[dict]:
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    cases = [("POST", "/v1/chat/completions", chat), ("POST", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2}),
             ("GET", "/v1/models", None), ("POST", "/tokenize", {"content": "hi"}), ("GET", "/metrics", None),
             ("GET", "/slots", None), ("GET", "/health", None), ("GET", "/readiness", None)]
    rows = []
    for method, path, body in cases:
        row = {"route": f"{method} {path}"}
        for label, key in (("none", None), ("wrong", "WRONG"), ("right", KEY)):
            code, out = http(router + path, key=key, body=body, method=method, timeout=60)
            row[label] = code
            if label == "none":
                row["none_body"] = out[:90].decode(errors="replace")
        rows.append(row)
        log(json.dumps(row))
    return rows


def start(argv: list[str], logfile: Path, env: dict | None = None) -> subprocess.Popen:
    f = open(logfile, "w")
    return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "NO_COLOR": "1", **(env or {})})


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


class Tap:
    """A recording pass-through in front of one replica: every call the router makes to it, by
    method, path, whether it carried a Bearer token, and the replica's status (llama-server logs no
    access lines at its default verbosity)."""

    def __init__(self, upstream: int):
        import http.client
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.seen: dict[str, int] = {}
        tap = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=300)
                hdrs = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body, headers=hdrs)
                r = conn.getresponse()
                data = r.read()
                auth = self.headers.get("Authorization")
                k = f"{self.command} {self.path.split('?')[0]} auth={'K' if auth == 'Bearer ' + KEY else auth} -> {r.status}"
                tap.seen[k] = tap.seen.get(k, 0) + 1
                self.send_response(r.status)
                for h, v in r.getheaders():
                    if h.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(h, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = do_DELETE = do_PUT = do_HEAD = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        import threading
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--vllm-router", required=True)
    ap.add_argument("--smg", required=True)
    ap.add_argument("--workdir", default="/tmp/choose")
    ap.add_argument("--out", default="-")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    out = sys.stdout if args.out == "-" else open(args.out, "w")

    def log(line: str) -> None:
        print(line, file=out, flush=True)

    results = {}
    routers = {
        "smg-1.13.0": lambda port, prom, urls: [args.smg, "launch", "--host", "127.0.0.1", "--port", str(port),
                                                  "--policy", "cache_aware", "--api-key", KEY, "--prometheus-port",
                                                  str(prom), "--worker-urls", *urls],
        "vllm-router-0.1.17": lambda port, prom, urls: [args.vllm_router, "--host", "127.0.0.1", "--port", str(port),
                                                         "--policy", "cache_aware", "--api-key", KEY,
                                                         "--prometheus-port", str(prom), "--worker-urls", *urls],
    }
    for name, argv_of in routers.items():
        log(f"## {name}")
        ports = [free_port() for _ in range(3)]
        reps = [start([args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(p), "-t", "1",
                       "-c", "4096", "-np", "1", "--api-key", KEY, "--metrics"], work / f"{name}-r{i}.log")
                for i, p in enumerate(ports)]
        router = None
        try:
            for p in ports:
                wait(lambda p=p: http(f"http://127.0.0.1:{p}/health", timeout=2)[0] == 200, 120, f"replica {p}")
            taps = [Tap(p) for p in ports]
            rport, prom = free_port(), free_port()
            router = start(argv_of(rport, prom, [f"http://127.0.0.1:{t.port}" for t in taps]), work / f"{name}.log")
            base = f"http://127.0.0.1:{rport}"
            wait(lambda: http(base + "/readiness", key=KEY, timeout=2)[0] == 200, 120, f"{name} ready")
            log(f"replicas (index: port): {dict(enumerate(ports))}")
            code, models = http(base + "/v1/models", key=KEY)
            model = json.loads(models)["data"][0]["id"] if code == 200 else "m"
            log(f"model id from the router's /v1/models: {model!r} ({code})")
            for t in taps:
                t.seen.clear()          # the start-up probes are counted apart below
            rows = workload(base, ports, log, model)
            log("calls during the workload: " + json.dumps({f"r{i}": dict(t.seen) for i, t in enumerate(taps)}))
            for t in taps:
                t.seen.clear()
            auth = auth_matrix(base, log, model)
            paths = {f"r{i}": dict(t.seen) for i, t in enumerate(taps)}
            log("calls during the key matrix: " + json.dumps(paths))
            per_session = {s: sorted({tuple(r["replica"]) for r in rows if r["session"] == s}) for s in range(SESSIONS)}
            log("replicas per session: " + json.dumps({str(k): [list(x) for x in v] for k, v in per_session.items()}))
            later = [r for r in rows if r["turn"] > 0 and r["status"] == 200]
            log("later turns: cache_n/prompt_tokens = " +
                json.dumps([(r["session"], r["turn"], r.get("cache_n"), r.get("prompt_tokens")) for r in later]))
            results[name] = {"rows": rows, "auth": auth, "paths": paths}
        finally:
            if router is not None:
                stop(router)
            for r in reps:
                stop(r)
    json.dump(results, open(work / "results.json", "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
