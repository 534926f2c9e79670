"""The engine's counters from real /metrics text (llama.cpp recorded, vLLM's own format), the
[selftest] config table, and the client's wall limit and cancel on real sockets."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from kiln_dev.supervised import wait_for

from supervisor.config import SelftestSpec, parse_config
from supervisor.errors import ConfigError
from supervisor.selftest.client import Client, ClientError, RequestCancelled as Cancelled
from supervisor.selftest.metrics import Counters, parse

ROOT = Path(__file__).resolve().parents[1]
LLAMA = (ROOT / "fixtures" / "selftest" / "llamacpp-11434-metrics.txt").read_text()
VLLM = (ROOT / "fixtures" / "engine-logs" / "vllm-0.27.1-metrics-format-sample.txt").read_text()


def test_llamacpp_counters():
    c = Counters.from_text(LLAMA)
    samples = parse(LLAMA)
    assert c.decode_tokens == samples["llamacpp:tokens_predicted_total"][0][1] > 0
    assert c.decode_seconds == samples["llamacpp:tokens_predicted_seconds_total"][0][1] > 0
    assert c.prompt_tokens_cached is not None and c.spec_draft_tokens == 0
    assert c.spec_acceptance is None                           # drafted nothing: no ratio, not 0
    assert 10 < c.decode_tok_s < 500                           # SmolLM2 on one core


def test_vllm_counters_and_spec_decode_acceptance():
    c = Counters.from_text(VLLM)
    assert (c.spec_drafts, c.spec_draft_tokens, c.spec_accepted_tokens) == (4.0, 12.0, 6.0)
    assert c.spec_acceptance == 0.5
    assert c.decode_tokens == 0.0 and c.decode_seconds == 0.0 and c.decode_tok_s is None


def test_a_delta_between_scrapes_and_absent_counters():
    before = Counters.from_text("llamacpp:tokens_predicted_total 10\nllamacpp:tokens_predicted_seconds_total 1.0\n")
    after = Counters.from_text("llamacpp:tokens_predicted_total 110\nllamacpp:tokens_predicted_seconds_total 3.0\n")
    d = after.minus(before)
    assert (d.decode_tokens, d.decode_seconds, d.decode_tok_s) == (100, 2.0, 50.0)
    assert d.prompt_tokens is None                            # not exposed is not zero
    assert Counters.from_text(None) == Counters() and Counters.from_text("garbage {{\n") == Counters()


BASE = """
engine = "llamacpp"
[model]
source = "/models/m.gguf"
family = "kimi-k3"
[ladder]
[[ladder.rungs]]
name = "a"
"""


def test_selftest_defaults_are_on_and_report_only():
    s = parse_config(BASE, env={}).selftest
    assert s == SelftestSpec()
    assert s.enabled and s.probes is None and s.request_wall_s == 100.0 and s.prefill_tokens == 3000
    assert s.min_decode_tok_s == 0 and s.min_prefill_tok_s == 0 and 0 < s.min_probe_pass <= 1


def test_selftest_table_every_problem_at_once():
    bad = BASE + """
[selftest]
enabled = "yes"
probes = "kimi-k4"
decode_tokens = 8
prefill_tokens = 0
min_prefill_tok_s = 50
request_wall_s = 200
timeout_s = 100
min_probe_pass = 1.5
proves = "x"
"""
    with pytest.raises(ConfigError) as e:
        parse_config(bad, env={})
    text = str(e.value)
    for expected in ("selftest.enabled: must be true or false", "selftest.probes: is not a known value; did you "
                     "mean 'kimi-k3'?", "selftest.decode_tokens: is too few", "selftest.min_prefill_tok_s: needs "
                     "prefill_tokens > 0", "selftest.timeout_s: must be >= request_wall_s",
                     "selftest.min_probe_pass: is out of range", "selftest.proves: is not a known field; did you "
                     "mean 'probes'?"):
        assert expected in text, expected


def test_selftest_can_be_switched_off_from_the_environment():
    assert parse_config(BASE, env={"KILN_SELFTEST_ENABLED": "false"}).selftest.enabled is False
    assert parse_config(BASE + "[selftest]\nenabled = false\n", env={"KILN_SELFTEST_ENABLED": "1"}).selftest.enabled
    with pytest.raises(ConfigError, match="selftest.enabled \\(from env KILN_SELFTEST_ENABLED\\): must be true or"):
        parse_config(BASE, env={"KILN_SELFTEST_ENABLED": "maybe"})


def test_the_config_hash_covers_the_selftest():
    a = parse_config(BASE, env={})
    b = parse_config(BASE + "[selftest]\nmin_decode_tok_s = 1.5\n", env={})
    assert a.hash != b.hash


@pytest.fixture
def silent_server():
    """A real socket that accepts and never answers: a server stuck in a long prefill."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(2)
    for c in conns:
        c.close()
    srv.close()


def test_a_request_is_cut_at_the_wall_limit(silent_server):
    c = Client(f"http://127.0.0.1:{silent_server}", "k")
    t0 = time.monotonic()
    with pytest.raises(ClientError) as e:
        c.complete("x", max_tokens=1, timeout_s=0.5)
    took = time.monotonic() - t0
    assert e.value.kind == "timeout" and 0.45 <= took < 2.5, took   # (/v1/models, then the request)


def test_abort_ends_a_blocked_request_at_once(silent_server):
    c = Client(f"http://127.0.0.1:{silent_server}", "k", timeout_s=60)
    errors: list[BaseException] = []
    done = threading.Event()

    def go() -> None:
        try:
            c.chat([{"role": "user", "content": "hi"}], max_tokens=8, stream=True)
        except BaseException as e:          # noqa: BLE001 (the test inspects it)
            errors.append(e)
        done.set()

    threading.Thread(target=go, daemon=True).start()
    wait_for(lambda: c.in_flight, 5, "the request on the wire")
    t0 = time.monotonic()
    c.abort()
    assert done.wait(2.0) and time.monotonic() - t0 < 1.0
    assert isinstance(errors[0], Cancelled)
    with pytest.raises(Cancelled):                             # and so is every later request
        c.complete("x", max_tokens=1)


def test_urls_and_refused_connections():
    assert Client("http://h:8080/v1/").url == "http://h:8080"
    assert Client("127.0.0.1:9").port == 9
    with pytest.raises(ValueError):
        Client("ftp://h")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                               # bound, not listening: refused
        with pytest.raises(ClientError) as e:
            Client(f"http://127.0.0.1:{port}").complete("x", max_tokens=1, timeout_s=2)
    assert e.value.kind == "connect"


def test_greedy_means_temperature_0_and_no_repetition_penalty_in_each_engine_s_words():
    assert Client("http://h:1", engine="vllm").greedy() == {"temperature": 0.0, "repetition_penalty": 1.0}
    assert Client("http://h:1", engine="openai").greedy() == {"temperature": 0.0}
