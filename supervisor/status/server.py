"""The supervisor's own status endpoint: /live, /ready, /status, /metrics and a small HTML page;
on a RunPod Serverless worker also the load balancer's health path (supervisor/runpod_env.py); on a
cluster's node, GET /cluster?beat=... (the group's one message: supervisor/cluster/protocol.py).

It serves on its own port, never the engine's, so it answers while the engine is loading,
restarting or dead. It only reads a snapshot (a plain dict from the lifecycle) per request and
never changes state. Every body is redacted with the current secrets before it is sent: the
lifecycle already redacts, this is the second net. Stdlib only: it ships inside the image.
"""

from __future__ import annotations

import datetime
import html
import json
import logging
import math
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Iterable
from urllib.parse import parse_qs, urlsplit

from .httpd import HttpServer, Request, Response
from .listen import STATUS_PORT_FIX as _FIX
from .listen import bind_error
from ..redact import ordered, redact_data
from ..redact import redact as _mask_text
from ..lifecycle.state import State
from ..runpod_env import health_code

__all__ = ["StatusServer", "STATES", "render_metrics", "render_html", "ready_text"]

log = logging.getLogger(__name__)

# Every lifecycle state, so /metrics has one kiln_state series per state (0 for all but one):
# PromQL can then alert on `kiln_state{state="FAILED"} == 1` without absent() tricks.
STATES = tuple(s.value for s in State)

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_HISTORY_SHOWN = 30  # the HTML page shows the newest history entries, newest first

Snapshot = Mapping[str, Any]


# --- redaction: supervisor/redact.py --------------------------------------------------------


# --- snapshot helpers: tolerant of missing keys, None and wrong types ---------------------------


def _section(snap: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    v = snap.get(key)
    return v if isinstance(v, Mapping) else {}


def _list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, (list, tuple)) else []


def _number(v: Any) -> str | None:
    """A sample value in exposition format, or None when `v` is not a number (no series then)."""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "+Inf" if v > 0 else "-Inf"
        return repr(v)
    return None


# --- /ready --------------------------------------------------------------------------------------


def _one_line(v: Any) -> str:
    return " ".join(str(v).split())


def ready_text(snap: Snapshot) -> tuple[int, str]:
    """(status, body) for /ready: the lifecycle decides readiness, this only reports it."""
    if snap.get("ready") is True:
        return 200, "ready\n"
    reason = f"not ready: state={_one_line(snap.get('state'))}"
    if snap.get("not_ready"):                   # serving, but something besides the state holds it back
        reason += f" ({_one_line(snap['not_ready'])})"
    failure_class = _section(snap, "last_failure").get("class")
    if failure_class:
        reason += f" last_failure={_one_line(failure_class)}"
    return 503, reason + "\n"


# --- /metrics ------------------------------------------------------------------------------------


def _label_value(v: Any) -> str:
    # Exposition format 0.0.4: in label values only backslash, double quote and newline escape.
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(
        self, name: str, kind: str, help_text: str, samples: Sequence[tuple[Mapping[str, Any], Any]]
    ) -> None:
        rendered = [(labels, n) for labels, v in samples if (n := _number(v)) is not None]
        if not rendered:  # a missing section yields no series, not an empty family
            return
        self.lines.append(f"# HELP kiln_{name} {help_text}")
        self.lines.append(f"# TYPE kiln_{name} {kind}")
        for labels, n in rendered:
            text = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items())
            self.lines.append(f"kiln_{name}{{{text}}} {n}" if text else f"kiln_{name} {n}")

    def one(self, name: str, kind: str, help_text: str, value: Any, **labels: Any) -> None:
        self.family(name, kind, help_text, [(labels, value)])


def render_metrics(snap: Snapshot) -> str:
    m = _Exposition()
    m.one("up", "gauge", "1 while the supervisor process answers.", 1)
    m.one("ready", "gauge", "1 when the engine is serving and passed its selftest.",
          snap.get("ready") is True)  # fmt: skip
    state = snap.get("state")
    states = list(STATES) + ([str(state)] if state is not None and state not in STATES else [])
    m.family("state", "gauge", "1 for the lifecycle state the supervisor is in.",
             [({"state": s}, s == state) for s in states])  # fmt: skip
    m.one("restarts_total", "counter", "Engine restarts after a crash.", snap.get("restarts"))
    m.one("launches_total", "counter", "Engine launches, any cause.", snap.get("launches"))
    failures = _section(snap, "failures")
    m.family("failures_total", "counter", "Engine failures by class.",
             [({"class": c}, failures[c]) for c in sorted(failures, key=str)])  # fmt: skip

    rung = _section(snap, "rung")
    m.one("rung_index", "gauge", "Index of the ladder rung in use (0 = first).", rung.get("index"))
    if rung.get("name") is not None:
        m.one("rung_info", "gauge", "The ladder rung in use.", 1, rung=rung["name"])

    timings = _section(snap, "timings")
    m.one("boot_to_ready_seconds", "gauge", "Seconds from supervisor start to first ready.",
          timings.get("boot_to_ready_s"))  # fmt: skip
    m.one("last_rung_switch_seconds", "gauge", "Seconds the last rung switch took.",
          timings.get("last_rung_switch_s"))  # fmt: skip
    _boot_metrics(m, _section(snap, "boot"))
    prefetch = _section(snap, "prefetch")   # model/prefetch.py: the weights read beside the engine's start
    m.one("model_prefetch_read_bytes", "gauge", "Bytes of the model's weights the prefetch read into the page cache.",
          prefetch.get("read_bytes"))  # fmt: skip
    m.one("model_prefetch_seconds", "gauge", "Seconds the model prefetch took (0 while it reads).",
          prefetch.get("seconds"))  # fmt: skip

    cache = _section(snap, "prompt_cache")  # run/promptcache.py: the prompt cache across restarts
    m.family("prompt_cache_slots_total", "counter", "Prompt-cache slots saved before a stop and restored after one.",
             [({"action": a}, cache.get(f"{a}_slots")) for a in ("saved", "restored")])  # fmt: skip
    m.family("prompt_cache_bytes_total", "counter", "Bytes of prompt-cache slots saved and restored.",
             [({"action": a}, cache.get(f"{a}_bytes")) for a in ("saved", "restored")])  # fmt: skip
    m.one("prompt_cache_skipped_total", "counter", "Slots or files the prompt cache skipped (see /status for why).",
          cache.get("skipped"))  # fmt: skip
    m.family("prompt_cache_seconds", "gauge", "Seconds the last save or restore took.",
             [({"action": a}, _section(cache, a).get("seconds")) for a in ("saved", "restored")])  # fmt: skip

    m.one("engine_pid", "gauge", "PID of the engine process.", _section(snap, "engine").get("pid"))
    config_hash = _section(snap, "config").get("hash")
    if config_hash is not None:
        m.one("config_info", "gauge", "Hash of the live deploy config.", 1, hash=config_hash)
    decided = _section(_section(snap, "reload"), "counts")
    m.family("reload_decisions", "gauge", "Published configs decided, by outcome (the history kept in the volume).",
             [({"outcome": o}, decided[o]) for o in sorted(decided, key=str)])  # fmt: skip
    hub = _section(_section(snap, "watch"), "hub")
    m.one("watch_hub_consecutive_errors", "gauge", "Failed Hub polls in a row (0 = the Hub answers).",
          hub.get("consecutive_errors"))  # fmt: skip
    report = _section(_section(snap, "watch"), "report")
    m.one("fleet_report_consecutive_errors", "gauge", "Failed writes of this pod's fleet record in a row.",
          report.get("consecutive_errors"))  # fmt: skip

    relay = _section(snap, "tcp_relay")  # TcpRelay.status(), when [server] tcp_port is set
    m.one("tcp_relay_listening", "gauge", "1 while the TCP relay accepts connections.", relay.get("listening"))
    m.one("tcp_relay_connections", "gauge", "Connections the TCP relay holds open.", relay.get("connections"))
    m.one("tcp_relay_refused_total", "counter", "Connections refused over the TCP relay's cap.",
          relay.get("refused_total"))  # fmt: skip
    m.one("tcp_relay_accept_errors_total", "counter", "TCP relay accepts that failed (EMFILE, no thread).",
          relay.get("accept_errors"))  # fmt: skip

    gpus = [g for g in _list(_section(snap, "hardware").get("gpus")) if isinstance(g, Mapping)]

    def gpu_samples(key: str) -> list[tuple[Mapping[str, Any], Any]]:
        return [
            ({"gpu": g.get("index", i), "name": g.get("name") or ""}, g.get(key))
            for i, g in enumerate(gpus)
        ]

    m.family("gpu_memory_used_mib", "gauge", "GPU memory in use, MiB.",
             gpu_samples("memory_used_mib"))  # fmt: skip
    m.family("gpu_memory_total_mib", "gauge", "GPU memory in total, MiB.",
             gpu_samples("memory_total_mib"))  # fmt: skip

    selftest = _section(snap, "selftest")
    m.one("selftest_passed", "gauge", "1 when the last selftest passed.", selftest.get("passed"))
    m.one("selftest_decode_tokens_per_second", "gauge", "Decode speed measured by the selftest.",
          selftest.get("decode_tok_s"))  # fmt: skip
    checks = _section(_section(snap, "plan"), "checks")
    rows = [(name, row) for name, row in checks.items() if isinstance(row, Mapping)]
    m.family("plan_predicted", "gauge", "What the deploy config's [plan] predicted, per quantity.",
             [({"quantity": name}, row.get("predicted")) for name, row in rows])
    m.family("plan_measured", "gauge", "What this boot measured of each quantity the plan predicted, and what "
             "the engine said of its own sizing.", [({"quantity": name}, row.get("measured")) for name, row in rows])
    m.family("plan_engine_estimate", "gauge", "The engine's own estimate of a quantity it then measured "
             "(vLLM's CUDA graph memory, GiB).",
             [({"quantity": name}, row.get("engine_estimate")) for name, row in rows])
    return "\n".join(m.lines) + "\n"


def _boot_metrics(m: _Exposition, boot: Mapping[str, Any]) -> None:
    """The boot timeline (run/timeline.py): this boot and the one before, seconds per phase
    (a phase that recurs, a rung that fell through, summed)."""
    boots = [(label, b) for label, b in (("current", boot), ("previous", _section(boot, "previous"))) if b]
    m.family("boot_phase_seconds", "gauge", "Seconds a boot spent in each phase (the open one: so far).",
             [({"boot": label, "phase": name}, v) for label, b in boots
              for name, v in summed(p for p in _list(b.get("phases")) if isinstance(p, Mapping)).items()])
    m.family("boot_seconds", "gauge", "Seconds from a boot's first phase to its end (ready, failed) or now.",
             [({"boot": label, "cause": b.get("cause") or "", "outcome": b.get("outcome") or "open"},
               b.get("seconds")) for label, b in boots])


# --- / (HTML) ------------------------------------------------------------------------------------


def _e(v: Any) -> str:
    return "—" if v is None else html.escape(str(v), quote=True)


def _when(t: Any) -> Any:
    """A Unix time as UTC text (unescaped); anything else as it came."""
    if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t):
        try:
            return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        except (OverflowError, OSError, ValueError):
            pass
    return t


def _rows(pairs: Sequence[tuple[str, Any]]) -> str:
    return "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in pairs)


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:1.5em;max-width:70em}"
    "table{border-collapse:collapse}th,td{text-align:left;padding:.15em .8em .15em 0;"
    "vertical-align:top}pre{background:#f4f4f4;padding:.6em;overflow-x:auto}"
    ".ok{color:#070}.bad{color:#b00}.bar{display:inline-block;height:.7em;background:#69c}"
)


def render_html(snap: Snapshot) -> str:
    ready = snap.get("ready") is True
    rung, engine = _section(snap, "rung"), _section(snap, "engine")
    config = _section(snap, "config")
    rung_text = rung.get("name")
    if isinstance(rung.get("index"), int) and isinstance(rung.get("count"), int):
        rung_text = f"{rung.get('name')} ({rung['index'] + 1} of {rung['count']})"
    parts = [
        "<!doctype html><html><head><meta charset=\"utf-8\">",
        '<meta http-equiv="refresh" content="5">',
        f"<title>Kiln — {_e(snap.get('state'))}</title><style>{_CSS}</style></head><body>",
        f"<h1>Kiln supervisor {_e(snap.get('version'))}</h1>",
        f'<p class="{"ok" if ready else "bad"}"><b>{_e(snap.get("state"))}</b> — '
        f"{'ready' if ready else 'not ready'}</p>",
        "<table>",
        _rows([
            ("since", _when(snap.get("since"))),
            ("uptime (s)", snap.get("uptime_s")),
            ("rung", rung_text),
            ("engine pid", engine.get("pid")),
            ("engine port", engine.get("port")),
            ("restarts", snap.get("restarts")),
            ("launches", snap.get("launches")),
            ("config hash", config.get("hash")),
            ("config source", config.get("source")),
            ("config revision", config.get("revision")),
        ]),
        "</table>",
    ]
    warnings = [w for w in _list(snap.get("warnings")) if w]
    if warnings:
        parts.append("<h2>Warnings</h2><ul>" + "".join(f"<li>{_e(w)}</li>" for w in warnings)
                     + "</ul>")  # fmt: skip

    failure = _section(snap, "last_failure")
    if failure:
        parts += [
            "<h2>Last failure</h2><table>",
            _rows([
                ("class", failure.get("class")),
                ("reason", failure.get("reason")),
                ("exit code", failure.get("exit_code")),
                ("after (s)", failure.get("elapsed_s")),
                ("rung", failure.get("rung")),
                ("evidence", failure.get("evidence")),
            ]),
            "</table>",
        ]
        hints = [h for h in _list(failure.get("hints")) if h]
        if hints:
            parts.append("<ul>" + "".join(f"<li>{_e(h)}</li>" for h in hints) + "</ul>")
        tail = _list(failure.get("stderr_tail"))
        if tail:
            parts.append("<pre>" + _e("\n".join(str(x) for x in tail)) + "</pre>")

    reload = _section(snap, "reload")
    shown = [(label, _section(reload, key)) for label, key in
             (("last rejection", "last_rejection"), ("last rollback", "last_rollback"))]
    if any(entry for _, entry in shown):
        parts.append("<h2>Published configs</h2><table>")
        for label, entry in shown:
            if entry:
                what = f"{entry.get('outcome')} {entry.get('origin')}" + (
                    f" @ {str(entry.get('revision'))[:12]}" if entry.get("revision") else "")
                parts.append(_rows([(label, f"{_when(entry.get('t'))}: {what}: {entry.get('cause')}")]))
        parts.append("</table>")

    selftest = _section(snap, "selftest")
    if selftest:
        parts += [
            "<h2>Selftest</h2><table>",
            _rows([
                ("passed", selftest.get("passed")),
                ("decode tok/s", selftest.get("decode_tok_s")),
                ("summary", selftest.get("summary")),
            ]),
            "</table>",
        ]

    hardware = _section(snap, "hardware")
    if hardware:
        parts += [
            "<h2>Hardware</h2><table>",
            _rows([
                ("source", hardware.get("source")),
                ("driver", hardware.get("driver")),
                ("vCPUs", hardware.get("vcpus")),
                ("RAM (GiB)", hardware.get("ram_total_gib")),
            ]),
            "</table>",
        ]
        gpus = [g for g in _list(hardware.get("gpus")) if isinstance(g, Mapping)]
        if gpus:
            parts.append("<table><tr><th>GPU</th><th>name</th><th>used MiB</th>"
                         "<th>total MiB</th><th>compute</th></tr>")  # fmt: skip
            for g in gpus:
                cells = (g.get("index"), g.get("name"), g.get("memory_used_mib"),
                         g.get("memory_total_mib"), g.get("compute_capability"))  # fmt: skip
                parts.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
            parts.append("</table>")

    parts += _boot_html(_section(snap, "boot"))

    history = [h for h in _list(snap.get("history")) if isinstance(h, Mapping)]
    if history:
        parts.append("<h2>Recent history</h2><table>")
        for h in reversed(history[-_HISTORY_SHOWN:]):
            parts.append(f"<tr><td>{_e(_when(h.get('t')))}</td><td>{_e(h.get('event'))}</td>"
                         f"<td>{_e(h.get('detail'))}</td></tr>")  # fmt: skip
        parts.append("</table>")
    parts.append("</body></html>\n")
    return "".join(parts)


def _boot_html(boot: Mapping[str, Any]) -> list[str]:
    """The boot timeline as a table: each phase, where it began, how long, and a bar to scale."""
    phases = [p for p in _list(boot.get("phases")) if isinstance(p, Mapping)]
    if not phases:
        return []
    total = boot.get("seconds") if isinstance(boot.get("seconds"), (int, float)) else None
    head = f"Boot {_e(boot.get('n'))} ({_e(boot.get('cause'))}): {_e(boot.get('outcome') or 'under way')}"
    if total is not None:
        head += f", {total:.2f} s"
    out = [f"<h2>{head}</h2><table><tr><th>phase</th><th>rung</th><th>from (s)</th><th>seconds</th><th></th></tr>"]
    for p in phases:
        secs = p.get("seconds")
        width = int(200 * secs / total) if isinstance(secs, (int, float)) and total else 0
        out.append(f"<tr><td>{_e(p.get('phase'))}</td><td>{_e(p.get('rung'))}</td><td>{_e(p.get('start_s'))}</td>"
                   f"<td>{_e(secs)}</td><td><span class=\"bar\" style=\"width:{max(width, 0)}px\"></span></td></tr>")
    out.append("</table>")
    prev = _section(boot, "previous")
    if prev:
        out.append(f"<p>Boot before: {_e(prev.get('n'))} ({_e(prev.get('cause'))}), {_e(prev.get('outcome'))}"
                   f" after {_e(prev.get('seconds'))} s: "
                   + ", ".join(f"{_e(k)} {v:.2f} s" for k, v in summed(
                       p for p in _list(prev.get("phases")) if isinstance(p, Mapping)).items()) + "</p>")
    return out


# --- the server ----------------------------------------------------------------------------------


def _ready(snap: Snapshot) -> tuple[int, str, str]:
    status, text = ready_text(snap)
    return status, "text/plain; charset=utf-8", text


def _json(snap: Snapshot) -> tuple[int, str, str]:
    return 200, "application/json", json.dumps(snap, indent=2, sort_keys=True, default=str) + "\n"


_ROUTES: dict[str, Callable[[Snapshot], tuple[int, str, str]]] = {
    "/ready": _ready,
    "/status": _json,
    "/metrics": lambda s: (200, METRICS_CONTENT_TYPE, render_metrics(s)),
    "/": lambda s: (200, "text/html; charset=utf-8", render_html(s)),
}
METHODS = ("GET", "HEAD")          # HEAD: GET's status and headers without the body (httpd.py)
_TEXT = "text/plain; charset=utf-8"


class StatusServer:
    """The status endpoint on (host, port); port 0 picks a free one, read back from `.port`.

    Served by httpd.HttpServer: one thread owns the sockets, a whole-request deadline per client,
    /live answered on that thread, /ready in a lane of its own, the pages in another."""

    def __init__(
        self,
        host: str,
        port: int,
        snapshot: Callable[[], dict[str, Any]],
        *,
        secrets: Callable[[], Sequence[str]] = lambda: (),
        health_path: str | None = None,
        probe: Callable[[], Mapping[str, Any]] | None = None,
        exchanges: Mapping[str, Callable[[bytes], tuple[int, bytes]]] | None = None,
    ) -> None:
        self._address = (host, port)
        self._snapshot = snapshot
        self._secrets = secrets
        self._health_path = health_path        # RunPod's health check: 204 / 200 / 503, no body
        self._probe = probe          # /ready's fields alone (state, ready, failure class): no snapshot
        # path -> handler of the `beat` query parameter (a cluster's ranks, supervisor/cluster/): JSON back.
        # A query, not a body: this server reads request heads only (httpd.py).
        self._exchanges = dict(exchanges or {})
        self._server: HttpServer | None = None

    def start(self) -> None:
        """Bind and serve in a daemon thread; the socket listens when this returns.

        Raises CannotListen (PortBusy when another process holds the port) as one clear line."""
        if self._server is not None:
            raise RuntimeError("status server already started")
        try:
            self._server = HttpServer(self._address, respond=self._respond, lane=self._lane, log=log)
        except OSError as e:
            raise bind_error(e, "status.port", *self._address, _FIX) from None
        self._server.start()
        log.info("status endpoint on %s:%d", self._address[0], self.port)

    def stop(self) -> None:
        """Stop serving and close the socket; safe to call twice or before start."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("status server not started")
        return int(self._server.address[1])

    def _lane(self, request: Request) -> str:
        return _lane_of(request, self._health_path)

    def _health(self) -> Response:
        """The load balancer's answer: the state alone decides it; a failure says its class, nothing
        more (the cause is on /status, masked)."""
        try:
            snap = self._snapshot()
            code = health_code(snap.get("state"), snap.get("ready"))
        except Exception:
            log.error("health path failed:\n%s", _mask_text(traceback.format_exc(), list(self._secrets())))
            return _text(500, "internal error\n")
        if code == 204:
            return Response(204, _TEXT, b"")
        if code == 200:
            return _text(200, "ok\n")
        failure_class = _section(snap, "last_failure").get("class")
        return _text(code, f"unhealthy: state={_one_line(snap.get('state'))}"
                           + (f" last_failure={_one_line(failure_class)}" if failure_class else "") + "\n")

    def _respond(self, request: Request) -> Response:
        path = urlsplit(request.target).path
        if request.method == "GET" and path in self._exchanges:
            beat = parse_qs(urlsplit(request.target).query).get("beat", [""])[0]
            status, body = self._exchanges[path](beat.encode("utf-8"))
            return Response(status, "application/json", body)
        if request.method not in METHODS:
            return _text(405, "method not allowed\n", allow=", ".join(METHODS))
        if path == "/live":  # never touches the snapshot: up means the process answers
            return _text(200, "ok\n")
        if path == self._health_path:
            return self._health()
        render = _ROUTES.get(path)
        if render is None:
            return _text(404, "not found\n")
        secrets: list[str] = []
        try:
            secrets = list(ordered(self._secrets()))
            if path == "/ready" and self._probe is not None:
                # a state name and a failure class hold no secret; the bytes are still masked below
                status, content_type, body = render(self._probe())
            else:
                snap = redact_data(dict(self._snapshot()), secrets)
                status, content_type, body = render(snap)
        except Exception:
            # The client gets no detail (it could leak state); the log gets the traceback,
            # masked as well as we can (if secrets() itself failed there is nothing to mask).
            log.error("status %s failed:\n%s", path, _mask_text(traceback.format_exc(), secrets))
            return _text(500, "internal error\n")
        data = _mask_text(body, secrets).encode("utf-8")  # second pass, on the bytes that leave
        return Response(status, content_type, data)


def _lane_of(request: Request, health_path: str | None = None) -> str:
    """Where a request is answered (httpd.LANES): what needs no snapshot at once; /ready and the
    health path (probes) apart from the pages."""
    path = urlsplit(request.target).path
    if request.method in METHODS and path == health_path:
        return "probe"
    if request.method not in METHODS or path == "/live" or path not in _ROUTES:
        return "now"
    return "probe" if path == "/ready" else "page"


def _text(status: int, text: str, *, allow: str = "") -> Response:
    return Response(status, _TEXT, text.encode("utf-8"), (("Allow", allow),) if allow else ())


def summed(phases: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Seconds per phase name over a timeline (a name can recur: a rung that fell through)."""
    out: dict[str, float] = {}
    for p in phases:
        name, seconds = p.get("phase"), p.get("seconds")
        if isinstance(name, str) and isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
            out[name] = round(out.get(name, 0.0) + float(seconds), 3)
    return out
