"""A router's replicas changed in place (issue 37 item 9): its URL survives a change of its replicas.
`PUT /kiln/router/replicas` on the router's own port, with its key, replaces the list: the new
replicas are routed, the old ones drain (a stream in flight on one finishes), the URL never stops
answering, and a restarted router keeps the list. Real llama-servers (a tiny random model), the real
smg under a real supervisor."""

from __future__ import annotations

import http.client as http_client
import json
import signal
import threading
import urllib.request

import pytest

from kiln_dev.engine import require_prefix
from kiln_dev.llama_server import LlamaServer
from kiln_dev.models import make_tiny_gguf
from kiln_dev.router import KEY, OPERATOR_KEY, router_config, router_python
from kiln_dev.supervised import Supervised, free_port, http, wait_for

pytestmark = [pytest.mark.llama, pytest.mark.slow]
HEADERS = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


def put(url: str, value: object, key: str | None = OPERATOR_KEY) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/kiln/router/replicas", data=json.dumps({"replicas": value}).encode(),
                                 method="PUT", headers={"Content-Type": "application/json",
                                                        **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def routed(sup: Supervised) -> list[str]:
    st = sup.status() or {}
    return [r["url"] for r in st.get("router", {}).get("replicas", []) if r["routed"]]


def test_the_router_takes_new_replicas_in_place_and_keeps_them(tmp_path):
    router_python()
    model = make_tiny_gguf(tmp_path / "tiny.gguf", ctx_len=16384)
    prefix = require_prefix()
    with LlamaServer(prefix, model, api_key=KEY, ctx=16384) as a, LlamaServer(prefix, model, api_key=KEY) as b:
        model_id = json.loads(http(a.url + "/v1/models", headers=HEADERS)[1])["data"][0]["id"]
        port = free_port()
        text = router_config(tmp_path, port=port, status_port=free_port(), metrics_port=free_port(),
                             replicas=[(a.url, a.url + "/health")])
        url = f"http://127.0.0.1:{port}"
        chat = json.dumps({"model": model_id, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 2}).encode()
        with Supervised(tmp_path, text, env={"KILN_API_KEY": KEY, "KILN_OPERATOR_KEY": OPERATOR_KEY}) as router:
            wait_for(lambda: routed(router) == [a.url], 120, "a routed")

            long: dict = {}

            def stream() -> None:
                body = json.dumps({"model": model_id, "messages": [{"role": "user", "content": "go"}],
                                   "max_tokens": 12000, "stream": True}).encode()
                req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers=HEADERS)
                long["chunks"] = 0
                try:
                    with urllib.request.urlopen(req, timeout=300) as r:
                        for line in r:
                            long["done"] = long.get("done") or line.startswith(b"data: [DONE]")
                            long["chunks"] += line.startswith(b"data: {")
                except Exception as e:  # noqa: BLE001 - a cut stream is what this test looks for
                    long["error"] = repr(e)

            t = threading.Thread(target=stream)
            t.start()
            wait_for(lambda: long.get("chunks", 0) > 20 or "error" in long, 60, "the stream under way")

            # Refused without a key, with a stranger's, with the clients' key, with a bad list: nothing changes
            assert put(url, f"{b.url}|{b.url}/health", key=None)[0] == 401
            assert put(url, f"{b.url}|{b.url}/health", key="WRONG")[0] == 401
            code, out = put(url, f"{b.url}|{b.url}/health", key=KEY)
            assert code == 403 and "the clients' key cannot change where traffic goes" in out["error"]["message"]
            code, out = put(url, "ftp://nowhere")
            assert code == 400 and "ftp://nowhere" in out["error"]["message"], out
            assert routed(router) == [a.url]

            code, out = put(url, f"{b.url}|{b.url}/health")
            assert code == 200 and out["replicas"] == [{"url": b.url, "status_url": b.url + "/health"}], out
            wait_for(lambda: routed(router) == [b.url], 30, "b routed in a's place")
            assert http(url + "/v1/chat/completions", headers=HEADERS, data=chat, timeout=60)[0] == 200
            t.join(120)
            assert long.get("done") and "error" not in long, long           # a's stream drained, not cut
            assert router.status()["router"]["replicas_from"].startswith("pushed at ")
            assert KEY not in router.log() and OPERATOR_KEY not in router.log()
            assert "replicas changed in place by the operator key sha256:" in router.log()
            assert router.stop(signal.SIGTERM, timeout=120) == 0

        with Supervised(tmp_path, text, env={"KILN_API_KEY": KEY}) as again:      # the same config, restarted
            wait_for(lambda: routed(again) == [b.url], 120, "b routed after the restart")
            assert http(url + "/v1/chat/completions", headers=HEADERS, data=chat, timeout=60)[0] == 200


def test_a_deeply_nested_or_oversized_body_is_answered_400_or_413_never_a_traceback_or_a_reset(tmp_path):
    """Issue 50 item 10, through the router's own port (a real supervisor, the real smg; its one replica
    answers nothing, which the control endpoint never needs): a 30,000-deep JSON array got no answer and
    a RecursionError traceback in the log; a body over the limit got a connection reset, not its 413."""
    router_python()
    port, dead = free_port(), free_port()
    text = router_config(tmp_path, port=port, status_port=free_port(), metrics_port=free_port(),
                         replicas=[(f"http://127.0.0.1:{dead}", f"http://127.0.0.1:{dead}/ready")])

    def send(body: bytes) -> tuple[int, str]:
        conn = http_client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("PUT", "/kiln/router/replicas", body=body,
                         headers={**HEADERS, "Authorization": f"Bearer {OPERATOR_KEY}"})
            resp = conn.getresponse()
            return resp.status, resp.read().decode()
        finally:
            conn.close()

    with Supervised(tmp_path, text, env={"KILN_API_KEY": KEY, "KILN_OPERATOR_KEY": OPERATOR_KEY}) as router:
        router.wait_state("SERVING", timeout=120)               # smg up; the replica unreachable, routed nothing
        code, out = send(b"[" * 30_000 + b"]" * 30_000)
        assert code == 400 and "nest" in json.loads(out)["error"]["message"], out
        for size in (1 << 20, 8 << 20):
            code, out = send(b"x" * size)
            assert code == 413 and "at most" in json.loads(out)["error"]["message"], (size, out)
        code, out = send(json.dumps({"replicas": "ftp://nowhere"}).encode())      # and it still answers
        assert code == 400 and "ftp://nowhere" in out, out
        assert router.stop(signal.SIGTERM, timeout=120) == 0
        log = router.log()
        assert "Traceback" not in log and "RecursionError" not in log, log[-3000:]
