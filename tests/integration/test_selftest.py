"""The selftest against a real CPU llama-server: SmolLM2-135M-Instruct (a real, loosely right
model) and the tiny random GGUF (a loop from the first token). No supervisor here: the selftest
talks to the engine as it would to any OpenAI-compatible URL; test_supervisor_selftest.py runs
it through the lifecycle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from supervisor.config import SelftestSpec
from supervisor.selftest.chunked import prefill_in_chunks
from supervisor.selftest.client import Client, RequestCancelled as Cancelled
from supervisor.selftest.measure import measure_decode
from supervisor.selftest.runner import run_selftest
from kiln_dev.supervised import wait_for
from kiln_dev.engine import require_prefix
from kiln_dev.llama_server import LlamaServer
from kiln_dev.models import make_tiny_gguf, smollm2_gguf

pytestmark = [pytest.mark.llama, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
KEY = "selftest-key-5c1e"


@pytest.fixture(scope="module")
def smol():
    with LlamaServer(require_prefix(), smollm2_gguf(), api_key=KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = make_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    with LlamaServer(require_prefix(), model) as srv:
        yield srv


def test_smollm2_passes_the_probe_set_it_answers(smol):
    spec = SelftestSpec(probes="smollm2", decode_tokens=64, prefill_tokens=0, request_wall_s=30, timeout_s=120)
    report = run_selftest(Client(smol.url, KEY), spec)
    assert report.passed, report.table()
    assert all(p.passed for p in report.probes) and report.probe_set == "smollm2" and report.engine == "llamacpp"
    assert not report.degenerate_probes
    d = report.decode
    assert d is not None and d.enough and d.tokens >= 64
    # the client's clock against llama.cpp's own count of the same decode steps
    assert d.engine_tok_s and abs(d.error_pct) < 10, report.table()
    assert d.metrics_tok_s and abs(d.client_tok_s - d.metrics_tok_s) / d.metrics_tok_s < 0.1
    assert report.sampler and report.sampler["temperature"] == pytest.approx(0.8)   # llama.cpp's default


def test_without_the_key_every_probe_is_refused(smol):
    spec = SelftestSpec(probes="smollm2", decode_tokens=0, prefill_tokens=0, timeout_s=60)
    report = run_selftest(Client(smol.url, None), spec)
    assert not report.passed
    assert all("HTTP 401" in p.outcome.reason for p in report.probes)
    assert KEY not in json.dumps(report.to_dict())


def test_the_tiny_random_model_is_reported_degenerate(tiny):
    spec = SelftestSpec(probes="smollm2", decode_tokens=64, prefill_tokens=500, timeout_s=60)
    report = run_selftest(Client(tiny.url), spec)
    assert not report.passed
    assert "fatal probe(s) failed: code-add" in report.failures
    assert len(report.degenerate_probes) >= len(report.probes) - 1, report.table()
    assert report.decode is None and report.prefill is None and report.skipped     # not measured on loops
    assert "degenerate" in report.summary


def test_decode_on_loops_is_void(tiny):
    client = Client(tiny.url)
    d = measure_decode(client, 64, wall_s=10, prompts=("Write an essay.", "Tell a story."), params=client.greedy())
    assert d.samples and all(s.void and s.void.startswith("degenerate") for s in d.samples)
    assert d.tokens == 0 and d.client_tok_s is None and not d.enough
    assert all((s.engine_tok_s or 0) > 200 for s in d.samples)    # "a repetition loop decodes cheap"


def test_chunked_prefill_extends_the_cached_prefix_under_a_small_wall(smol):
    client = Client(smol.url, KEY)
    wall = 3.0
    out = prefill_in_chunks(client, 600, wall, nonce=f"t{time.time_ns()}", params=client.greedy(), safety=0.3)
    assert out.error is None and out.total_tokens >= 600
    assert len(out.chunks) >= 3, [c.to_dict() for c in out.chunks]      # the wall forced chunks
    assert out.max_request_s < wall
    assert out.chunks[0].cached_tokens == 0                              # cold: a nonce first
    for prev, c in zip(out.chunks, out.chunks[1:]):
        # llama.cpp's own counts: the cache held the whole previous prompt; only the rest was new
        assert prev.prompt_tokens - 4 <= c.cached_tokens <= prev.prompt_tokens, (prev.to_dict(), c.to_dict())
        assert c.new_tokens == c.prompt_tokens - c.cached_tokens
        assert c.extends_prefix
    assert out.proven is True
    warm = client.complete(out.prompt, max_tokens=1, **client.greedy())
    assert warm.cached_tokens >= out.total_tokens - 1 and warm.timings["prompt_n"] <= 4


def test_the_proof_fails_when_the_server_does_not_cache(smol):
    client = Client(smol.url, KEY)
    params = {**client.greedy(), "cache_prompt": False}          # llama.cpp's per-request switch
    out = prefill_in_chunks(client, 300, 5.0, nonce=f"n{time.time_ns()}", params=params, first_tokens=100)
    assert len(out.chunks) >= 2 and out.proven is False
    assert all(c.cached_tokens == 0 and c.new_tokens == c.prompt_tokens for c in out.chunks)


def test_cancel_ends_a_selftest_promptly(smol):
    client = Client(smol.url, KEY)
    spec = SelftestSpec(probes="smollm2", decode_tokens=5000, prefill_tokens=0, timeout_s=600)
    box: dict[str, object] = {}

    def go() -> None:
        try:
            box["report"] = run_selftest(client, spec, log=lambda m: m.startswith("decode") and box.update(
                decode=time.monotonic()))
        except Cancelled:
            box["cancelled"] = time.monotonic()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    wait_for(lambda: isinstance(box.get("decode"), float) or not t.is_alive(), 120, "the decode measurement")
    assert box.get("decode"), "the decode measurement never started"
    wait_for(lambda: client.in_flight, 120, "a decode stream on the wire")
    t0 = time.monotonic()
    client.abort()
    t.join(5)
    assert not t.is_alive() and "cancelled" in box and box["cancelled"] - t0 < 2.0


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "selftest", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def test_cli_passes_against_smollm2_and_writes_the_report(smol, tmp_path):
    out = tmp_path / "report.json"
    r = run_cli("--url", f"{smol.url}/v1", "--api-key-env", "SELFTEST_KEY", "--family", "smollm2",
                "--decode-tokens", "32", "--prefill-tokens", "200", "--request-wall-s", "20", "--json", str(out),
                env={"SELFTEST_KEY": KEY})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED" in r.stdout and "capital-japan" in r.stdout and "prefill cold" in r.stdout
    report = json.loads(out.read_text())
    assert report["passed"] and report["decode_tok_s"] > 0 and report["prefill"]["chunked"]["total_tokens"] >= 200
    assert KEY not in r.stdout + r.stderr + out.read_text()


def test_cli_fails_the_tiny_model_and_a_server_that_makes_no_tool_calls(tiny, smol):
    r = run_cli("--url", tiny.url, "--decode-tokens", "0", "--prefill-tokens", "0")
    assert r.returncode == 1 and "FAILED" in r.stdout and "degenerate" in r.stdout
    # SmolLM2's chat template knows no tools: it answers in prose, and a tools target must not pass
    r = run_cli("--url", smol.url, "--api-key-env", "SELFTEST_KEY", "--family", "smollm2", "--tools",
                "--decode-tokens", "0", "--prefill-tokens", "0", env={"SELFTEST_KEY": KEY})
    assert r.returncode == 1 and "tool-call" in r.stdout and "no tool calls" in r.stdout
    r = run_cli("--url", smol.url, "--api-key-env", "UNSET_KEY_VAR_1")
    assert r.returncode == 2 and "UNSET_KEY_VAR_1" in r.stderr


def test_cli_json_into_a_missing_directory_is_refused_before_the_run(tiny, tmp_path):
    # Was: the whole selftest ran, then a traceback (FileNotFoundError) and exit 1, "quality failed",
    # with the report lost.
    out = tmp_path / "no-such-dir" / "report.json"
    r = run_cli("--url", tiny.url, "--decode-tokens", "0", "--prefill-tokens", "0", "--json", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == (f"--json {out}: the directory {out.parent} does not exist: create it first, or name a "
                        "file in a directory that does\n")
    assert r.stdout == "" and not out.parent.exists()
    r = run_cli("--url", tiny.url, "--decode-tokens", "0", "--prefill-tokens", "0", "--json", str(tmp_path))
    assert r.returncode == 2 and "is a directory" in r.stderr and "Traceback" not in r.stderr


def test_a_chunk_over_the_wall_limit_is_an_error_not_a_number(smol):
    # Last in the file: llama-server finishes the abandoned prefill (seconds of one core) before
    # it serves the next request on that slot, so a test after this one would wait for it.
    client = Client(smol.url, KEY)
    # first_tokens well above what one request can prefill in 0.3 s on one core (~100 tok/s)
    out = prefill_in_chunks(client, 400, 0.3, nonce=f"w{time.time_ns()}", first_tokens=400)
    assert out.error and "within 0.3 s" in out.error and not out.chunks


class _FailStreams:
    """A relay in front of the real server that answers every streamed request with HTTP 500 and
    forwards the rest: only the selftest's decode streams, so its probes and prefill still pass."""

    def __init__(self, upstream: str):
        import http.server
        import urllib.request

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self._forward(None)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if json.loads(body or b"{}").get("stream"):
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"error": {"code": 500, "message": "injected"}}')
                    return
                self._forward(body)

            def _forward(self, body):
                req = urllib.request.Request(upstream + self.path, data=body, method=self.command,
                                             headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                try:
                    with urllib.request.urlopen(req, timeout=60) as r:
                        status, data = r.status, r.read()
                except urllib.error.HTTPError as e:
                    status, data = e.code, e.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_failed_decode_request_fails_the_selftest_even_without_a_floor(smol):
    """min_decode_tok_s = 0 means "report the rate, gate nothing": it never meant that an engine
    whose streamed replies fail is healthy (it passed until 2026-12-01, with the error as a note)."""
    relay = _FailStreams(smol.url)
    try:
        spec = SelftestSpec(probes="smollm2", decode_tokens=64, prefill_tokens=0, request_wall_s=30, timeout_s=120,
                            min_decode_tok_s=0)
        report = run_selftest(Client(relay.url, KEY), spec)
    finally:
        relay.close()
    assert all(p.passed for p in report.probes), report.table()       # only the decode was broken
    assert not report.passed
    assert any("decode request failed" in f and "500" in f for f in report.failures), report.failures
