"""The boot-time levers of a deploy config's [startup] table (config.py StartupSpec), as engine flags.

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
Imports nothing of Kiln: config.py reads LEVERS to validate the table.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from ..config import DeployConfig
    from .flags import FlagSnapshot


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
_O_LEVEL = re.compile(r"-O\d?")


# [server] fast_start = true (issue 27, vLLM only) is a preset of [startup] levers, not a second path
# to the argv: a field [startup] sets itself wins over it, so the two can never put one flag twice.
#   safetensors_load_strategy prefetch  the checkpoint read into the page cache before the workers load
#                                       it ("useful on network or high-latency storage": the pod's volume)
# Not -O1 (in it until 2026-12-02): on the H200 it captured only piecewise CUDA graphs and the
# selftest decoded 107 tok/s against the default -O2's 503 (SmolLM2-135M, vLLM 0.26.0; docs/benchmarks.md).
FAST_START = {"safetensors_load_strategy": "prefetch"}


def _set(cfg: "DeployConfig", engine: str) -> list[tuple[str, Lever, Any]]:
    """(where, lever, value) for each lever in force: [startup]'s own, then fast_start's preset."""
    out = []
    for name, lever in LEVERS.items():
        value = getattr(cfg.startup, name)
        where = f"startup.{name}"
        if value is None and cfg.server.fast_start and name in FAST_START:
            value, where = FAST_START[name], "server.fast_start"
        if lever.engine == engine and value is not None:
            out.append((where, lever, value))
    return out


def _given(lever: Lever, user_flags: Iterable[str]) -> bool:
    """The rung or extra_args sets this flag itself, in any spelling (a dotted -cc.mode too)."""
    for f in user_flags:
        base = f.split("=", 1)[0]
        if base.startswith("--"):
            base = base.split(".", 1)[0]
        elif base.startswith("-cc."):
            base = "-cc"
        if base in (lever.flag, *lever.aliases) or (lever.flag == "--optimization-level" and _O_LEVEL.fullmatch(base)):
            return True
    return False


def args(cfg: "DeployConfig", engine: str, user_flags: Iterable[str]) -> list[str]:
    """The flags [startup] adds to this engine's argv: each lever set, unless the rung sets its flag."""
    user = list(user_flags)
    out: list[str] = []
    for _, lever, value in _set(cfg, engine):
        if not _given(lever, user):
            out += [lever.flag, str(value)]
    return out


def lint(cfg: "DeployConfig", engine: str, snapshot: "FlagSnapshot | None") -> list[tuple[str, str]]:
    """(where, message) for each lever whose flag this engine build does not have."""
    if snapshot is None:
        return []
    out = []
    for name, lever, value in _set(cfg, engine):
        flag = snapshot.get(lever.flag)
        fix = "set fast_start = false" if name == "server.fast_start" else "remove the lever"
        if flag is None:
            out.append((name, f"this {engine} build has no {lever.flag} (flag snapshot "
                        f"{snapshot.source}): {fix}, or use an image whose engine has it"))
        elif flag.choices and str(value) not in flag.choices:
            out.append((name, f"{value!r} is not one of this {engine} build's {lever.flag} values: "
                        f"{', '.join(c for c in flag.choices if c != 'None')} (flag snapshot {snapshot.source})"))
    return out
