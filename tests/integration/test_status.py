"""supervisor.status.server over real sockets on 127.0.0.1 (port 0), with a snapshot the test mutates.

No sleeps: the socket listens when start() returns, and each request is a plain blocking call.
"""

from __future__ import annotations

import copy
import enum
import html
import http.client
import json
import logging
import re
import select
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from supervisor.errors import KilnError
from supervisor.status.listen import CannotListen, PortBusy
from supervisor.status.server import METRICS_CONTENT_TYPE, STATES, StatusServer
from tests.support.listener_child import ListenerChild
from kiln_dev.supervised import wait_for

CANARY = "hf_CANARYsecretTOKEN123"
ROUTES = ("/", "/status", "/metrics", "/ready")

SNAPSHOT: dict[str, Any] = {
    "version": "0.1.0",
    "state": "SERVING",
    "ready": True,
    "since": 1732870000.0,
    "uptime_s": 12.3,
    "config": {"hash": "abc123", "source": "/etc/kiln/deploy.toml", "revision": None},
    "rung": {"name": "autofit-262k", "index": 0, "count": 2},
    "engine": {"pid": 1234, "port": 8080, "argv": ["llama-server", "-m", "/models/m.gguf"]},
    "restarts": 2,
    "launches": 3,
    "failures": {"oom": 1, "crashed": 1},
    "last_failure": {
        "class": "oom",
        "reason": "CUDA out of memory",
        "exit_code": 1,
        "elapsed_s": 14.9,
        "evidence": "cudaMalloc failed: out of memory",
        "hints": ["lower -c"],
        "rung": "full-1m",
        "stderr_tail": ["<script>alert(1)</script>", "cudaMalloc failed: out of memory"],
    },
    "history": [{"t": 1732870000.0, "event": "launch", "detail": "rung autofit-262k"}],
    "selftest": {"passed": True, "decode_tok_s": 61.2, "summary": "4/4 probes"},
    "hardware": {
        "source": "nvml",
        "driver": "580.1",
        "gpus": [
            {"index": 0, "name": "NVIDIA H200", "memory_total_mib": 143771,
             "memory_used_mib": 1000, "memory_free_mib": 142771, "compute_capability": "9.0"},
        ],  # fmt: skip
        "vcpus": 16.0,
        "ram_total_gib": 125.0,
    },
    "timings": {"boot_to_ready_s": 3.2, "last_rung_switch_s": 0.4},
    "warnings": ["disk nearly full"],
}


class Source:
    """What the server reads: a snapshot (or an exception to raise) and secrets, set per test."""

    def __init__(self) -> None:
        self.snap: dict[str, Any] = copy.deepcopy(SNAPSHOT)
        self.secrets: list[str] = []
        self.error: Exception | None = None

    def snapshot(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        return copy.deepcopy(self.snap)


@pytest.fixture
def source() -> Source:
    return Source()


@pytest.fixture
def server(source: Source) -> Iterator[StatusServer]:
    srv = StatusServer("127.0.0.1", 0, source.snapshot, secrets=lambda: source.secrets)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def request(
    srv: StatusServer, path: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, http.client.HTTPMessage, str]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read().decode("utf-8")
    finally:
        conn.close()


# name{labels} value, labels as k="v" with \\ \" \n escapes, value a Prometheus float
SAMPLE = re.compile(
    r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)'
    r'(?:\{(?P<labels>[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*)?\})?'
    r' (?P<value>[-+]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|Inf|NaN))$'
)
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')


def unescape(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_metrics(text: str) -> Samples:
    """Every line is HELP, TYPE or a sample; each family's HELP/TYPE comes once, before it."""
    samples: Samples = {}
    typed: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            assert name not in typed and kind in ("gauge", "counter"), line
            typed.add(name)
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        assert m["name"] in typed, f"sample before its TYPE: {line!r}"
        labels = frozenset((k, unescape(v)) for k, v in LABEL.findall(m["labels"] or ""))
        samples[(m["name"], labels)] = float(m["value"])
    return samples


def value(samples: Samples, metric: str, /, **labels: str) -> float:
    return samples[(metric, frozenset(labels.items()))]


def test_live_answers_even_when_the_snapshot_is_broken(
    server: StatusServer, source: Source
) -> None:
    assert request(server, "/live")[::2] == (200, "ok\n")
    source.error = RuntimeError("lifecycle lock poisoned")
    assert request(server, "/live")[::2] == (200, "ok\n")


def test_ready_flips_from_503_to_200_when_the_snapshot_does(
    server: StatusServer, source: Source
) -> None:
    source.snap.update(state="LOADING", ready=False)
    status, _, body = request(server, "/ready")
    assert (status, body) == (503, "not ready: state=LOADING last_failure=oom\n")

    del source.snap["last_failure"]
    source.snap["state"] = "SELFTEST"
    assert request(server, "/ready")[::2] == (503, "not ready: state=SELFTEST\n")

    source.snap.update(state="SERVING", ready=True)
    assert request(server, "/ready")[::2] == (200, "ready\n")


def test_status_is_the_snapshot_as_sorted_json(server: StatusServer) -> None:
    status, headers, body = request(server, "/status")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body) == SNAPSHOT
    assert body == json.dumps(SNAPSHOT, indent=2, sort_keys=True) + "\n"


def test_metrics_exposition(server: StatusServer) -> None:
    status, headers, body = request(server, "/metrics")
    assert status == 200 and headers["Content-Type"] == METRICS_CONTENT_TYPE
    s = parse_metrics(body)
    assert value(s, "kiln_up") == 1 and value(s, "kiln_ready") == 1
    assert {st: value(s, "kiln_state", state=st) for st in STATES} == {
        st: float(st == "SERVING") for st in STATES
    }
    assert value(s, "kiln_restarts_total") == 2 and value(s, "kiln_launches_total") == 3
    assert value(s, "kiln_failures_total", **{"class": "oom"}) == 1
    assert value(s, "kiln_failures_total", **{"class": "crashed"}) == 1
    assert value(s, "kiln_rung_index") == 0
    assert value(s, "kiln_rung_info", rung="autofit-262k") == 1
    assert value(s, "kiln_boot_to_ready_seconds") == 3.2
    assert value(s, "kiln_last_rung_switch_seconds") == 0.4
    assert value(s, "kiln_engine_pid") == 1234
    assert value(s, "kiln_config_info", hash="abc123") == 1
    assert value(s, "kiln_gpu_memory_used_mib", gpu="0", name="NVIDIA H200") == 1000
    assert value(s, "kiln_gpu_memory_total_mib", gpu="0", name="NVIDIA H200") == 143771
    assert value(s, "kiln_selftest_passed") == 1
    assert value(s, "kiln_selftest_decode_tokens_per_second") == 61.2


def test_the_tcp_relay_section_becomes_series(server: StatusServer, source: Source) -> None:
    source.snap["tcp_relay"] = {"listening": False, "connections": 3, "refused_total": 2, "accept_errors": 7,
                                "last_error": "[Errno 24] Too many open files"}
    s = parse_metrics(request(server, "/metrics")[2])
    assert value(s, "kiln_tcp_relay_listening") == 0 and value(s, "kiln_tcp_relay_connections") == 3
    assert value(s, "kiln_tcp_relay_refused_total") == 2 and value(s, "kiln_tcp_relay_accept_errors_total") == 7


def test_missing_and_none_sections_produce_no_series(server: StatusServer, source: Source) -> None:
    source.snap = {
        "state": "PREFLIGHT", "ready": False, "rung": None, "engine": {"pid": None},
        "hardware": {"gpus": None}, "failures": None, "last_failure": None, "history": None,
        "selftest": {"passed": None}, "config": {"hash": None},
    }  # fmt: skip
    s = parse_metrics(request(server, "/metrics")[2])
    assert {name for name, _ in s} == {"kiln_up", "kiln_ready", "kiln_state"}
    assert value(s, "kiln_state", state="PREFLIGHT") == 1
    for path in ROUTES:
        assert request(server, path)[0] in (200, 503), path


def test_enum_states_read_as_their_values(server: StatusServer, source: Source) -> None:
    class State(str, enum.Enum):
        LOADING = "LOADING"

    source.snap.update(state=State.LOADING, ready=False)
    assert request(server, "/ready")[2].startswith("not ready: state=LOADING")
    assert json.loads(request(server, "/status")[2])["state"] == "LOADING"
    assert value(parse_metrics(request(server, "/metrics")[2]), "kiln_state", state="LOADING") == 1


def test_unknown_state_still_gets_a_series(server: StatusServer, source: Source) -> None:
    source.snap["state"] = "WARMING"
    s = parse_metrics(request(server, "/metrics")[2])
    assert value(s, "kiln_state", state="WARMING") == 1
    assert value(s, "kiln_state", state="SERVING") == 0


def test_label_values_are_escaped(server: StatusServer, source: Source) -> None:
    nasty = 'a\\b"c\nd'
    source.snap["rung"]["name"] = nasty
    source.snap["hardware"]["gpus"][0]["name"] = nasty
    body = request(server, "/metrics")[2]
    assert 'kiln_rung_info{rung="a\\\\b\\"c\\nd"} 1' in body.splitlines()
    s = parse_metrics(body)  # and it parses back to the original value
    assert value(s, "kiln_rung_info", rung=nasty) == 1
    assert value(s, "kiln_gpu_memory_used_mib", gpu="0", name=nasty) == 1000


def test_html_page_is_self_contained_and_escaped(server: StatusServer) -> None:
    status, headers, body = request(server, "/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert '<meta http-equiv="refresh" content="5">' in body
    assert "<script" not in body and "src=" not in body and "http://" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    for shown in ("SERVING", "autofit-262k (1 of 2)", "1234", "abc123", "oom", "CUDA out of memory",
                  "4/4 probes", "NVIDIA H200", "rung autofit-262k", "2024-11-29"):  # fmt: skip
        assert shown in body, shown
    pre = re.search(r"<pre>(.*?)</pre>", body, re.S)
    assert pre and "cudaMalloc failed" in pre.group(1)


def test_canary_secret_never_leaves_in_any_body(server: StatusServer, source: Source) -> None:
    # One secret with characters JSON and HTML escape, so redaction must happen before escaping.
    tricky = 'p&ss"w<rd\\x'
    source.secrets = ["", CANARY, tricky]
    snap = source.snap
    snap["state"] = f"LOADING-{CANARY}"  # also lands in /ready's reason and a metric label
    snap["ready"] = False
    snap["engine"]["argv"] += ["--api-key", CANARY, "--hf-token", tricky]
    snap["last_failure"]["stderr_tail"].append(f"auth failed for {CANARY}")
    snap["last_failure"]["class"] = f"oom {tricky}"
    snap["history"].append({"t": 1.0, "event": "reload", "detail": f"token={CANARY}"})
    snap["config"]["hash"] = f"{CANARY}"
    snap["rung"]["name"] = tricky
    snap["failures"][CANARY] = 1  # a dict key
    forms = {CANARY, tricky, html.escape(tricky), json.dumps(tricky)[1:-1], "w<rd", "ss\\"}
    for path in ROUTES:
        body = request(server, path)[2]
        assert "***" in body, path
        for form in forms:
            assert form not in body, (path, form)


def test_longer_secret_is_masked_whole_when_a_shorter_one_is_its_prefix(
    server: StatusServer, source: Source
) -> None:
    source.secrets = ["sk-abc", "sk-abcSUFFIX"]
    source.snap["warnings"] = ["key sk-abcSUFFIX"]
    body = request(server, "/status")[2]
    assert "SUFFIX" not in body and "key ***" in body


def test_secrets_are_read_per_request(server: StatusServer, source: Source) -> None:
    source.snap["warnings"] = [CANARY]
    assert CANARY in request(server, "/status")[2]
    source.secrets = [CANARY]
    assert CANARY not in request(server, "/status")[2]


def test_snapshot_raising_is_a_500_without_detail(
    server: StatusServer, source: Source, caplog: pytest.LogCaptureFixture
) -> None:
    source.error = RuntimeError(f"boom {CANARY}")
    source.secrets = [CANARY]
    with caplog.at_level(logging.ERROR, logger="supervisor.status.server"):
        for path in ROUTES:
            status, _, body = request(server, path)
            assert status == 500, path
            assert "boom" not in body and "Traceback" not in body and CANARY not in body
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "boom" in logged and CANARY not in logged


def test_secrets_raising_is_a_500(server: StatusServer, source: Source) -> None:
    def broken() -> list[str]:
        raise OSError("secret file unreadable")

    srv = StatusServer("127.0.0.1", 0, source.snapshot, secrets=broken)
    srv.start()
    try:
        assert request(srv, "/status")[0] == 500
    finally:
        srv.stop()


def test_unknown_path_404_and_other_methods_405(server: StatusServer) -> None:
    assert request(server, "/nope")[0] == 404
    assert request(server, "/status?pretty=1")[0] == 200  # the query string is ignored
    for method in ("POST", "PUT", "DELETE", "BREW"):
        status, headers, _ = request(server, "/status", method=method)
        assert status == 405 and headers["Allow"] == "GET, HEAD", method


@pytest.mark.parametrize("path", ["/live", "/nope", *ROUTES])
@pytest.mark.parametrize("ready", [True, False])
def test_head_answers_every_path_as_get_does_without_the_body(server: StatusServer, source: Source, path: str,
                                                               ready: bool) -> None:
    # Was: HEAD /ready answered 405 (the HEAD code was dead): load balancers and probes use HEAD.
    source.snap["ready"] = ready
    source.snap["history"] = []          # so the HTML page does not change between the two requests
    get_status, get_headers, get_body = request(server, path)
    head_status, head_headers, head_body = request(server, path, method="HEAD")
    assert head_status == get_status and head_body == ""
    assert head_headers["Content-Type"] == get_headers["Content-Type"]
    assert int(head_headers["Content-Length"]) == len(get_body.encode("utf-8")) > 0


def test_a_bad_request_line_is_400_and_an_endless_head_431(server: StatusServer) -> None:
    for raw, status in ((b"nonsense\r\n\r\n", 400), (b"GET /status HTTP/1.0\r\nX: " + b"y" * 20000, 431)):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(raw)
            assert s.recv(64).startswith(b"HTTP/1.0 %d " % status)


def test_requests_log_at_debug_without_headers(
    server: StatusServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="supervisor.status.server"):
        request(server, "/live", headers={"Authorization": f"Bearer {CANARY}"})
    records = [r for r in caplog.records if r.name == "supervisor.status.server"]
    assert any("/live" in r.getMessage() and r.levelno == logging.DEBUG for r in records)
    assert all(CANARY not in r.getMessage() for r in records)


def test_port_zero_binds_a_free_port_and_stop_closes_it(source: Source) -> None:
    srv = StatusServer("127.0.0.1", 0, source.snapshot)
    with pytest.raises(RuntimeError):
        srv.port
    srv.start()
    port = srv.port
    assert port > 0 and request(srv, "/live")[0] == 200
    srv.stop()
    srv.stop()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        http.client.HTTPConnection("127.0.0.1", port, timeout=5).connect()


# --- clients that say nothing or trickle (issue 24) -------------------------------------------------

IDLE, TRICKLING = 200, 20


def _open(port: int, n: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]


def _closed_by_server(s: socket.socket) -> bool:
    ready, _, _ = select.select([s], [], [], 0)
    if not ready:
        return False
    try:
        return s.recv(1) == b""
    except ConnectionError:
        return True


class Trickle:
    """Clients that send a request one byte every `every_s` seconds: under a per-read timeout they
    would never time out."""

    def __init__(self, socks: list[socket.socket], every_s: float):
        self.socks, self.every_s = socks, every_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        request = b"GET /status HTTP/1.1\r\nHost: x\r\n" * 100
        i = 0
        while not self.stop.wait(self.every_s):       # the clients' own pace, not a wait for a condition
            for s in self.socks:
                try:
                    s.send(request[i:i + 1])
                except OSError:
                    pass
            i += 1

    def __enter__(self) -> "Trickle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def probe_all(port: int, deadline_s: float) -> dict[tuple[str, str], int]:
    """GET and HEAD of /live and /ready, each answered before `deadline_s` or counted as 0."""
    out = {}
    for method in ("GET", "HEAD"):
        for path in ("/live", "/ready"):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=deadline_s)
                conn.request(method, path)
                resp = conn.getresponse()
                resp.read()
                out[(method, path)] = resp.status
                conn.close()
            except OSError:
                out[(method, path)] = 0
    return out


def test_idle_and_trickling_clients_do_not_silence_the_probes_and_are_closed_at_their_deadline(
        source: Source, monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor.status import httpd

    # the whole request's deadline, shortened for the test; long enough that 220 connects and the
    # probes on a loaded machine come well before it
    monkeypatch.setattr(httpd, "REQUEST_S", 4.0)
    srv = StatusServer("127.0.0.1", 0, source.snapshot)
    srv.start()
    try:
        idle = _open(srv.port, IDLE)
        trickling = _open(srv.port, TRICKLING)
        with Trickle(trickling, every_s=0.5):
            answers = probe_all(srv.port, deadline_s=5)
            assert answers == {(m, p): 200 for m in ("GET", "HEAD") for p in ("/live", "/ready")}, answers
            assert not any(_closed_by_server(s) for s in idle), "the probes were answered with the idle clients on"
            # a byte every 0.5 s keeps a per-read timeout happy forever; the whole-request deadline is 4 s
            wait_for(lambda: all(_closed_by_server(s) for s in idle + trickling), 30, "every slow client closed")
        for s in idle + trickling:
            s.close()
    finally:
        srv.stop()


@pytest.mark.llama
def test_200_idle_clients_on_a_real_supervisors_status_port_leave_live_and_ready_answering(tmp_path, prefix, tiny):
    # Was: 32 workers and a timeout per read: 32 clients that sent nothing stopped /live and /ready; 40 slow
    # ones kept /ready failing for as long as they stayed (issue 24, item 4), and a failing /live gets a
    # healthy pod restarted.
    from kiln_dev.supervised import Supervised, config, free_port

    rungs = '[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "512"]\n'
    text = config(binary=prefix / "bin/llama-server", model=tiny, port=free_port(), status_port=free_port(),
                  state_dir=tmp_path / "state", rungs=rungs, snapshot=prefix / "share/kiln/llama-server.help.txt")
    with Supervised(tmp_path, text) as sup:
        sup.wait_state("SERVING")
        idle = _open(sup.status_port, IDLE)
        trickling = _open(sup.status_port, TRICKLING)
        with Trickle(trickling, every_s=2.0):
            answers = probe_all(sup.status_port, deadline_s=5)
            assert answers == {(m, p): 200 for m in ("GET", "HEAD") for p in ("/live", "/ready")}, answers
            assert not any(_closed_by_server(s) for s in idle), "the idle clients were still connected"
            wait_for(lambda: all(_closed_by_server(s) for s in idle + trickling), 60,
                     "the slow clients closed at their whole-request deadline")
        for s in idle + trickling:
            s.close()
        assert probe_all(sup.status_port, deadline_s=5)[("GET", "/ready")] == 200
        assert sup.stop() == 0
        assert "Traceback" not in sup.log()


# --- load, hang-ups and a busy port (issue 18), against a status server in a child process -------

CLIENTS, REQUESTS_EACH, HANGUPS = 200, 3, 20


def _reset_mid_request(port: int) -> None:
    """Half a request line, then a hard close (RST): the server's read fails mid-request."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n")
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_200_concurrent_clients_are_all_answered_and_hang_ups_log_one_line_not_a_traceback() -> None:
    # Was: listen backlog 5, so 200 clients at once lost SYNs and up to 68 of 600 requests timed
    # out at 30 s; clients that hung up printed BrokenPipe/ConnectionReset tracebacks on stderr.
    with ListenerChild("status") as child:
        slow = socket.create_connection(("127.0.0.1", child.port), timeout=10)  # says nothing
        start = threading.Barrier(CLIENTS + HANGUPS)
        answers: list[object] = []

        def client() -> None:
            start.wait()
            for path in ("/status", "/metrics", "/"):
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", child.port, timeout=30)
                    conn.request("GET", path)
                    resp = conn.getresponse()
                    resp.read()
                    answers.append(resp.status)
                    conn.close()
                except OSError as e:
                    answers.append(repr(e))

        def hang_up() -> None:
            start.wait()
            _reset_mid_request(child.port)

        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        threads += [threading.Thread(target=hang_up) for _ in range(HANGUPS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = [a for a in answers if a != 200]
        assert len(answers) == CLIENTS * REQUESTS_EACH and not failed, f"{len(failed)} failed: {set(failed)}"
        wait_for(lambda: "went away mid-request" in child.log(), 30, "a hang-up logged")
        slow.close()
        log = child.stop()
    assert child.proc.returncode == 0
    assert "Traceback" not in log and "Exception occurred" not in log, log[-3000:]
    hangups = [line for line in log.splitlines() if "went away mid-request" in line]
    assert hangups and all(line.startswith("INFO supervisor.status.server: status: client 127.0.0.1") for line in hangups)


def test_out_of_descriptors_the_oldest_idle_client_makes_room_for_the_probe() -> None:
    # An accept that fails with EMFILE is backed off (not spun) and closes the oldest client still
    # sending its request: that descriptor takes the probe, which needs no other to be answered.
    with ListenerChild("status") as child:
        idle = _open(child.port, 3)
        assert probe_all(child.port, deadline_s=10)[("GET", "/live")] == 200    # the idle ones are accepted by now
        assert child.command("exhaust").startswith("exhausted")
        assert probe_all(child.port, deadline_s=10) == {(m, p): 200 for m in ("GET", "HEAD") for p in ("/live", "/ready")}
        assert _closed_by_server(idle[0])
        assert child.command("release") == "released"
        assert probe_all(child.port, deadline_s=10)[("GET", "/ready")] == 200
        log = child.stop()
    for s in idle:
        s.close()
    assert log.count("could not take a connection") >= 1 and "accepting again after" in log
    assert "Traceback" not in log


def test_a_busy_status_port_is_port_busy_naming_the_holder_and_the_fix(source: Source) -> None:
    # Was: a second `python -m supervisor run` died with an OSError traceback from bind.
    with ListenerChild("status") as other:
        srv = StatusServer("127.0.0.1", other.port, source.snapshot)
        with pytest.raises(PortBusy) as e:
            srv.start()
        message = str(e.value)
        assert isinstance(e.value, KilnError) and e.value.port == other.port
        assert f"status.port {other.port} is already in use by pid {other.pid} (python" in message
        assert "KILN_STATUS_PORT" in message and "[status] port" in message and "\n" not in message
        srv.stop()  # nothing was started: still safe
        assert http.client.HTTPConnection("127.0.0.1", other.port, timeout=10).connect() is None


def test_an_address_that_cannot_be_bound_is_cannot_listen(source: Source) -> None:
    srv = StatusServer("192.0.2.1", 0, source.snapshot)  # TEST-NET-1: never this host's address
    with pytest.raises(CannotListen) as e:
        srv.start()
    assert "status.port 0 on 192.0.2.1 cannot be bound" in str(e.value) and "KILN_STATUS_PORT" in str(e.value)
