#!/usr/bin/env python3
"""Stand-in for `vllm serve` on CPU machines, where a real vLLM cannot start (it needs a GPU): the parser
and the metrics of vLLM 0.33.0, the version the vLLM targets pin, and the start-up, failure and shutdown
lines vLLM 0.26.0 printed on the lent H200 (2026-12-01), the newest vLLM a GPU here has run: 0.33.0
needs torch 2.14, the H200 has torch 2.11. What it prints is what a real one printed
(tests/fixtures/engine-logs/, PROVENANCE.md says how each was recorded); how it binds, answers and
stops follows vLLM 0.26.0's own code (named below).

    fake_vllm.py serve MODEL_DIR --host H --port P [--served-model-name N] [any other flag]
    fake_vllm.py serve --help=all      the real 0.33.0 parser's text (vllm-0.33.0-serve-help-all.txt)
    fake_vllm.py --version             0.33.0

The scenario comes from the environment (a rung's env picks it), so argv stays what the
supervisor gives the real binary:

  KILN_FAKE_SCENARIO       required (else exit 2), one of:
      vllm-ok          a real boot's start-up lines (vllm-0.26.0-serve-h200.log up to uvicorn's
                       "Application startup complete.", with this model path, served name, host and
                       port put in), then serve. Like vLLM (entrypoints/openai/api_server.py:
                       setup_server) the port is bound right after the banner and the non-default
                       args line but listened on only once the engine is up, so /health is refused
                       while loading. GET /health: 200, empty body (serve/instrumentator/health.py);
                       GET /metrics: the vllm:* families of vLLM 0.33.0's own metrics logger
                       (vllm-0.33.0-metrics-format-sample.txt: names, help, types and labels real,
                       values synthetic, zero: nothing runs here), this served name put in, the
                       spec_decode families only when --speculative-config is given; any other path:
                       404 {"detail":"Not Found"} (FastAPI's).
                       Each request is logged in uvicorn's access form. SIGTERM once serving: the
                       recorded shutdown lines, exit 0; before that, the default action.
      vllm-oom-h200    the real failure at --max-model-len 20000000 (vllm-0.26.0-oom-h200.log: its
                       187 lines, "torch.AcceleratorError: CUDA error: out of memory" twice), exit 1
      vllm-shm-hang    `vllm serve` stuck in tensor-parallel start-up: repeats the line the field notes saw
                       for ~10 minutes ("No available shared memory broadcast block found in 60
                       seconds", vLLM 0.27.1) every KILN_FAKE_DOT_S seconds
  KILN_FAKE_FORK_UNSAFE    vllm-ok, set to 1: an API server that initialises CUDA before its EngineCore
                           starts; under VLLM_WORKER_MULTIPROC_METHOD=fork the core dies as torch makes it
                           (torch/cuda/__init__.py _lazy_init's RuntimeError, as vLLM users reported it
                           for speculative decoding on 0.11), exit 1; under spawn it boots. `always`: the
                           same failure under spawn too (no real vLLM does; a test of the relaunch guard)
  KILN_FAKE_LOAD_S         vllm-ok: time spent "building the engine" before it listens (default 0.05;
                           the real boot took 57-63 s, docs/research/benchmarks-history.md)
  KILN_FAKE_DELAY_S        vllm-oom-h200: pause where the real engine spent its time (default 0.01;
                           the real one failed after 43.3 s)
  KILN_FAKE_DOT_S          vllm-shm-hang: seconds between the repeated lines (default 0.1)
  KILN_FAKE_LOG_DIR        where the recorded logs are (default tests/fixtures/engine-logs)

Recorded lines keep their recorded timestamps and pids; the lines it makes up (access log) use the
recorded pid too, so a log reads as one process's. Everything goes to stdout, which the supervisor
reads merged with stderr.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LOG_DIR = Path(os.environ.get("KILN_FAKE_LOG_DIR")
               or Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "engine-logs")
VERSION = "0.33.0"
SERVE_LOG = "vllm-0.26.0-serve-h200.log"
OOM_LOG = "vllm-0.26.0-oom-h200.log"
HELP = "vllm-0.33.0-serve-help-all.txt"
METRICS_SAMPLE = "vllm-0.33.0-metrics-format-sample.txt"
SAMPLE_MODEL = 'model_name="my-model"'        # the served name the sample was made with
# What the recorded boot was given, to be replaced by what this one is given.
REC_MODEL, REC_NAME, REC_HOST, REC_PORT = "/root/k/models/smollm2-bf16", "smollm2-bf16", "127.0.0.1", "18180"
REC_API = "(APIServer pid=8736)"

def out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def env_s(name: str, default: float) -> float:
    return float(os.environ.get(name) or default)


class Args:
    """What vllm serve's parser would give this stand-in: the model (positional), host, port, name."""

    def __init__(self, argv: list[str]) -> None:
        rest = argv[1:] if argv[:1] == ["serve"] else argv
        self.model = next((a for i, a in enumerate(rest) if not a.startswith("-")
                           and (i == 0 or not rest[i - 1].startswith("-"))), REC_MODEL)
        self.host = self.opt(rest, "--host", "0.0.0.0")
        self.port = int(self.opt(rest, "--port", "8000"))
        self.name = self.opt(rest, "--served-model-name", self.model)
        self.speculating = any(x in ("--speculative-config", "-sc") or x.startswith("--speculative-config")
                               for x in rest)

    @staticmethod
    def opt(argv: list[str], name: str, default: str) -> str:
        for i, a in enumerate(argv):
            if a == name and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(name + "="):
                return a.split("=", 1)[1]
        return default


def recorded(name: str) -> list[str]:
    with open(LOG_DIR / name, encoding="utf-8", newline="") as f:    # tqdm's \r stays inside its line
        return f.read().rstrip("\n").split("\n")


def boot_lines(a: Args) -> tuple[list[str], list[str], list[str]]:
    """The recorded boot cut in three: up to the non-default args line (before the bind), up to
    uvicorn's "Application startup complete." (before the listen), and the SIGTERM shutdown."""
    def fill(ln: str) -> str:
        ln = ln.replace(REC_MODEL, a.model).replace(f"'{REC_NAME}'", f"'{a.name}'")
        return ln.replace(f"{REC_HOST}:{REC_PORT}", f"{a.host}:{a.port}").replace(
            f"'host': '{REC_HOST}', 'port': {REC_PORT}", f"'host': '{a.host}', 'port': {a.port}")
    lines = [fill(ln) for ln in recorded(SERVE_LOG)]
    args = next(i for i, ln in enumerate(lines) if "non-default args:" in ln) + 1
    up = next(i for i, ln in enumerate(lines) if "Application startup complete." in ln) + 1
    down = next(i for i, ln in enumerate(lines) if "[shutdown]" in ln)
    return lines[:args], lines[args:up], lines[down:]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    model_name = REC_NAME
    speculating = False

    def version_string(self) -> str:
        return "uvicorn"

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        path = self.path.split("?")[0]
        if path == "/health":
            self.reply(200, b"", None)
        elif path == "/metrics":
            self.reply(200, metrics_text(self.model_name, self.speculating).encode(),
                       "text/plain; version=0.0.4; charset=utf-8")
        else:
            self.reply(404, b'{"detail":"Not Found"}', "application/json")

    def reply(self, status: int, body: bytes, content_type: str | None) -> None:
        self.send_response_only(status)
        self.send_header("date", self.date_time_string())
        self.send_header("server", "uvicorn")
        self.send_header("content-length", str(len(body)))
        if content_type:
            self.send_header("content-type", content_type)
        self.end_headers()
        self.wfile.write(body)
        phrase = self.responses.get(status, ("",))[0]
        out(f'{REC_API} INFO:     {self.client_address[0]}:{self.client_address[1]} - '
            f'"{self.command} {self.path} {self.request_version}" {status} {phrase}')

    def log_message(self, format: str, *args: object) -> None:  # the access line above is the log
        pass


def metrics_text(model: str, speculating: bool = False) -> str:
    """vLLM 0.33.0's vllm:* families as its metrics logger printed them (the recorded sample), for this
    served name; its speculative-decoding families only for a speculating server, as in vLLM."""
    keep, lines = False, []
    for ln in recorded(METRICS_SAMPLE):
        if ln.startswith("# HELP "):
            name = ln.split()[2]
            keep = name.startswith("vllm:") and (speculating or not name.startswith("vllm:spec_decode"))
        if keep:
            lines.append(ln.replace(SAMPLE_MODEL, f'model_name="{model}"'))
    return "\n".join(lines) + "\n"


def bind(a: Args) -> ThreadingHTTPServer:
    """vLLM binds before it builds the engine (setup_server) and listens only in uvicorn."""
    Handler.model_name = a.name
    Handler.speculating = a.speculating
    httpd = ThreadingHTTPServer((a.host, a.port), Handler, bind_and_activate=False)
    httpd.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        httpd.server_bind()
    except OSError as e:                 # what Python says; vllm.py's port_in_use signature reads it
        out(f"OSError: [Errno {e.errno}] {e.strerror}")
        sys.exit(1)
    return httpd


def serve_ok(a: Args) -> int:
    before_bind, before_listen, shutdown = boot_lines(a)
    for ln in before_bind:
        out(ln)
    httpd = bind(a)
    engine = next((i for i, ln in enumerate(before_listen) if "Initializing a V1 LLM engine" in ln), 0) + 1
    for ln in before_listen[:engine]:
        out(ln)
    unsafe = os.environ.get("KILN_FAKE_FORK_UNSAFE")
    if unsafe == "always" or (unsafe == "1" and os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == "fork"):
        core = "(EngineCore pid=8801)"
        for ln in ("ERROR 12-01 10:25:37 [core.py:1020] EngineCore failed to start.",
                   "ERROR 12-01 10:25:37 [core.py:1020] Traceback (most recent call last):",
                   'ERROR 12-01 10:25:37 [core.py:1020]   File "torch/cuda/__init__.py", line 398, in _lazy_init',
                   "ERROR 12-01 10:25:37 [core.py:1020] RuntimeError: Cannot re-initialize CUDA in forked "
                   "subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start method"):
            out(f"{core} {ln}")
        httpd.socket.close()
        return 1
    time.sleep(env_s("KILN_FAKE_LOAD_S", 0.05))
    # uvicorn installs its signal handlers, runs the app's start-up, then listens on the bound socket
    signal.signal(signal.SIGTERM, lambda *_: stop(httpd, shutdown))
    for ln in before_listen[engine:]:
        out(ln)
    httpd.server_activate()
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    threading.Event().wait()
    return 0


def stop(httpd: ThreadingHTTPServer, shutdown: list[str]) -> None:
    httpd.socket.close()
    for ln in shutdown:
        out(ln)
    sys.exit(0)


def oom_h200(a: Args) -> int:
    lines = recorded(OOM_LOG)
    bind_at = next(i for i, ln in enumerate(lines) if "non-default args:" in ln) + 1
    for ln in lines[:bind_at]:
        out(ln)
    httpd = bind(a)
    engine = next(i for i, ln in enumerate(lines) if "Initializing a V1 LLM engine" in ln) + 1
    for ln in lines[bind_at:engine]:
        out(ln)
    time.sleep(env_s("KILN_FAKE_DELAY_S", 0.01))
    for ln in lines[engine:]:
        out(ln)
    httpd.socket.close()
    return 1


def shm_hang(a: Args) -> int:
    # The field notes' words (field notes § "Tensor parallelism on A40 pairs") under vLLM 0.27.1; the first line is made up.
    out("INFO 11-29 12:00:00 [api_server.py] vLLM API server version 0.27.1")
    while True:
        out("WARNING 11-29 12:01:00 [shm_broadcast.py] No available shared memory broadcast block found in 60 seconds.")
        time.sleep(env_s("KILN_FAKE_DOT_S", 0.1))


SCENARIOS = {"vllm-ok": serve_ok, "vllm-oom-h200": oom_h200, "vllm-shm-hang": shm_hang}


def main(argv: list[str]) -> int:
    if "--version" in argv:
        out(VERSION)
        return 0
    if any(a == "-h" or a.startswith("--help") for a in argv):
        sys.stdout.write((LOG_DIR / HELP).read_text(encoding="utf-8"))
        return 0
    name = os.environ.get("KILN_FAKE_SCENARIO", "")
    if name not in SCENARIOS:
        out(f"kiln fake vllm: set KILN_FAKE_SCENARIO to one of: {', '.join(SCENARIOS)} (got {name!r})")
        return 2
    return SCENARIOS[name](Args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
