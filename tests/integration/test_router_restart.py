"""Restarting the router drops no request (issue 37 item 16): smg holds its listener 5 s on TERM for
load balancers, so a stop grace of 5 s ended every stop in SIGKILL with the streams on it cut; and a
new smg answered `404 model_not_found` (final, for a client) until the feeder had given it replicas.
Now a stream in flight finishes through a stop, smg exits by itself, and a starting router holds its
clients on its port until it routes (issue 50 item 7; a 503, retryable, once HOLD_S passes). A real llama-server (a tiny random
model that never stops before max_tokens), the real smg under two supervisors one after the other
on the same ports, and a client that asks all along."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request

import pytest

from kiln_dev.engine import require_prefix
from kiln_dev.llama_server import LlamaServer
from kiln_dev.models import make_tiny_gguf
from kiln_dev.router import KEY, router_config, router_python
from kiln_dev.supervised import Supervised, free_port, http, wait_for

pytestmark = [pytest.mark.llama, pytest.mark.slow]
HEADERS = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


class Asker:
    """Asks the router's clients' port for a 1-token reply, again and again: (when, status) each time
    (0: no connection)."""

    def __init__(self, url: str, model: str):
        self.url, self.model = url, model
        self.seen: list[tuple[float, int, bytes]] = []
        self.stop_ = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 1}).encode()
        while not self.stop_.is_set():
            code, out = http(self.url + "/v1/chat/completions", headers=HEADERS, data=body, timeout=30)
            self.seen.append((time.monotonic(), code, out[:200]))
            self.stop_.wait(0.01)

    def codes(self) -> set[int]:
        return {c for _, c, _ in self.seen}

    def __enter__(self) -> "Asker":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_.set()
        self.thread.join(60)


def stream(url: str, model: str, max_tokens: int, out: dict) -> None:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "go"}], "max_tokens": max_tokens,
                       "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers=HEADERS)
    out["chunks"], out["done"] = 0, False
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            for line in r:
                if line.startswith(b"data: [DONE]"):
                    out["done"] = True
                elif line.startswith(b"data: "):
                    out["chunks"] += 1
                    out["finish"] = (json.loads(line[6:]).get("choices") or [{}])[0].get("finish_reason") \
                        or out.get("finish")
    except Exception as e:  # noqa: BLE001 - a cut stream is what this test looks for: recorded
        out["error"] = repr(e)


def test_a_restarted_router_keeps_its_streams_and_holds_its_clients_until_it_routes(tmp_path):
    router_python()
    model = make_tiny_gguf(tmp_path / "tiny.gguf", ctx_len=16384)
    with LlamaServer(require_prefix(), model, api_key=KEY, ctx=16384) as replica:
        model_id = json.loads(http(replica.url + "/v1/models", headers=HEADERS)[1])["data"][0]["id"]
        port, sport, mport, eport = free_port(), free_port(), free_port(), free_port()

        def router(name: str) -> Supervised:
            d = tmp_path / name
            d.mkdir()
            text = router_config(d, port=port, status_port=sport, metrics_port=mport, engine_port=eport,
                                 replicas=[(replica.url, replica.url + "/health")])
            return Supervised(d, text, env={"KILN_API_KEY": KEY})

        url = f"http://127.0.0.1:{port}"
        with Asker(url, model_id) as asker:
            with router("first") as first:
                wait_for(lambda: http(first.url("/ready"))[0] == 200, 120, "the first router ready")
                wait_for(lambda: any(c == 200 for _, c, _ in asker.seen), 60, "a reply through it")
                # its clients' port held them until it routed (issue 50 item 7; it said 503 before): never
                # smg's 404, never a 503 (0: refused, before the router's port was open at all)
                assert 404 not in asker.codes(), [s for s in asker.seen if s[1] == 404][:3]
                assert 503 not in asker.codes(), [s for s in asker.seen if s[1] == 503][:3]
                assert first.status()["router"]["front"]["held_total"] > 0

                long: dict = {}
                t = threading.Thread(target=stream, args=(url, model_id, 14000, long))
                t.start()
                wait_for(lambda: long.get("chunks", 0) > 20 or "error" in long, 60, "the stream under way")
                stopped = time.monotonic()
                rc = first.stop(signal.SIGTERM, timeout=120)
                t.join(120)
                log = first.log()
                # 14,000 tokens at this machine's ~1,300 a second: the stream outlives smg's 5 s hold and
                # the old 10 s grace, and ends within what the router's grace leaves it
            assert rc == 0, log[-3000:]
            assert long.get("done") and long.get("finish") == "length" and "error" not in long, long
            assert "Process exiting" in log, log[-3000:]            # smg's own clean exit, not a SIGKILL
            during = [(round(at - stopped, 2), c) for at, c, _ in asker.seen if at >= stopped]
            assert 404 not in {c for _, c in during}, during

            with router("second") as second:
                again = len(asker.seen)
                wait_for(lambda: http(second.url("/ready"))[0] == 200, 120, "the second router ready")
                wait_for(lambda: any(c == 200 for _, c, _ in asker.seen[again:]), 60, "a reply through it")
                assert 404 not in {c for _, c, _ in asker.seen[again:]}, asker.seen[again:][:5]
                st = second.status()
                assert st["router"]["front"]["open"] is True and st["router"]["front"]["answered_503_total"] >= 0


def test_across_a_router_restart_under_8_streams_requests_fail_for_at_most_5_s(tmp_path):
    """Issue 50 item 7: a restart failed every request for ~5.5 s (the gate answered 503 from the moment
    the supervisor left SERVING, connections were refused until the new router bound, and the new one
    answered 503 until it routed). 8 clients ask all along; the first router is stopped (TERM) and a
    second started on the same ports, as a pod restart does. Measured: the failed requests and the
    window from the first failure to the last, which must be at most 5 s (the last round's goal); the
    new router holds its clients while it starts instead of answering 503."""
    router_python()
    model = make_tiny_gguf(tmp_path / "tiny.gguf", ctx_len=4096)
    with LlamaServer(require_prefix(), model, api_key=KEY, ctx=4096) as replica:
        model_id = json.loads(http(replica.url + "/v1/models", headers=HEADERS)[1])["data"][0]["id"]
        port, sport, mport, eport = free_port(), free_port(), free_port(), free_port()

        def router(name: str) -> Supervised:
            d = tmp_path / name
            d.mkdir()
            text = router_config(d, port=port, status_port=sport, metrics_port=mport, engine_port=eport,
                                 replicas=[(replica.url, replica.url + "/health")])
            return Supervised(d, text, env={"KILN_API_KEY": KEY})

        url = f"http://127.0.0.1:{port}"
        first = router("first")
        wait_for(lambda: http(first.url("/ready"))[0] == 200, 120, "the first router ready")
        askers = [Asker(url, model_id) for _ in range(8)]
        for a in askers:
            a.__enter__()
        try:
            wait_for(lambda: all(any(c == 200 for _, c, _ in a.seen) for a in askers), 60, "every client served")
            restart = time.monotonic()
            assert first.stop(signal.SIGTERM, timeout=120) == 0
            with router("second") as second:
                wait_for(lambda: http(second.url("/ready"))[0] == 200, 120, "the second router ready")
                back = time.monotonic()
                wait_for(lambda: all(any(at > back and c == 200 for at, c, _ in a.seen) for a in askers), 60,
                         "every client served by the second router")
                held = second.status()["router"]["front"].get("held_total", 0)
        finally:
            for a in askers:
                a.__exit__()
        after = [(at - restart, c) for a in askers for at, c, _ in a.seen if at >= restart]
        failed = sorted(t for t, c in after if c != 200)
        window = (failed[-1] - failed[0]) if failed else 0.0
        print(f"router restart under 8 clients: {len(after)} requests, {len(failed)} failed, failing window "
              f"{window:.2f} s, {held} held by the new router while it started")
        assert window <= 5.0, (window, failed[:5], failed[-5:])
