"""The boot-time levers of a deploy config's [startup] table (config.py StartupSpec): which engine flag
each one is and the values it takes. A base module: config.py validates the table with it, and
engines/startup.py turns the levers in force into flags.

Each is off -- the engine's own default -- until bench/coldstart.py measures it on the card
(docs/benchmarks.md P15 for vLLM, P9 for llama.cpp); a rung's or extra_args' own flag wins over it.
The flags and values are the pinned engines' own, from their --help:

    field                      engine    flag (aliases)                     values
    load_mode                  llamacpp  --load-mode (-lm)                  auto none mmap mlock mmap+mlock dio
                                         (llama-server-help-cpu-11434.txt: "dio: use DirectIO if available";
                                         default auto = mmap; #19109 turned direct I/O off by default)
    optimization_level         vllm      --optimization-level (-O, -O0..3)  0..3 ("-O0 having the best startup
                                         time and -O3 having the best performance. -O2 is used by default")
    load_format                vllm      --load-format                      a loader name (vLLM takes plugins);
                                         "dummy" (random weights) is refused
    safetensors_load_strategy  vllm      --safetensors-load-strategy        eager lazy prefetch torchao
    compilation_config         vllm      --compilation-config (-cc)         a JSON object, e.g.
                                         {"cudagraph_capture_sizes": [1, 2, 4, 8]}

The vLLM flags are in both 0.26.0's and 0.27.1's `vllm serve --help=all`
(tests/fixtures/engine-logs/vllm-0.2*-serve-help-all.txt); the lint refuses a lever whose flag the
image's own snapshot lacks (an A40 fork of llama.cpp without --load-mode, say).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["Lever", "LEVERS"]


@dataclass(frozen=True)
class Lever:
    engine: str
    flag: str
    aliases: tuple[str, ...] = ()
    kind: type = str
    choices: tuple[str, ...] = ()
    range: tuple[int, int] = (0, 0)
    pattern: str | None = None
    hint: str | None = None

    def problem(self, value: Any, engine: str) -> str | None:
        """Why this value cannot be used with this engine, or None."""
        if engine != self.engine:
            return f"applies to {self.engine} ({self.flag}); this config's engine is {engine}: remove it"
        if self.flag == "--load-format" and value == "dummy":
            return "is vLLM's random-weights loader (for profiling): it would serve noise"
        if self.flag == "--compilation-config":
            try:
                parsed = json.loads(value)
            except ValueError as e:
                return f"is not JSON: {e}"
            if not isinstance(parsed, dict):
                return "must be a JSON object"
        return None


LEVERS: dict[str, Lever] = {
    "load_mode": Lever("llamacpp", "--load-mode", ("-lm",),
                       choices=("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")),
    "optimization_level": Lever("vllm", "--optimization-level", ("-O",), kind=int, range=(0, 3)),
    "load_format": Lever("vllm", "--load-format", pattern=r"[a-z0-9_]{1,64}", hint="a loader name such as "
                         "auto, safetensors, instanttensor, runai_streamer"),
    "safetensors_load_strategy": Lever("vllm", "--safetensors-load-strategy",
                                       choices=("eager", "lazy", "prefetch", "torchao")),
    "compilation_config": Lever("vllm", "--compilation-config", ("-cc",), hint='a JSON object such as '
                                '{"cudagraph_capture_sizes": [1, 2, 4, 8]}'),
}
