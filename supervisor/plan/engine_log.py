"""What an engine says it allocated, read from its own log: the figures the plan is checked against.

llama-server (needs `-v`: these lines are below its default verbosity) logs a dry run for its autofit
first (buffers of 0.00 MiB) and then the real load; the last load's lines count:

    load_tensors:   CPU_Mapped model buffer size =    92.10 MiB      (one line per buffer type/device)
    llama_kv_cache:        CPU KV buffer size =   180.00 MiB
    sched_reserve:        CPU compute buffer size =    22.64 MiB

vLLM logs its own sizing at boot (vllm_sizing; the lines below, with the source that prints them).
0.33.0 is the images' pin, read from its wheel; 0.32.0 is the CPU build the tests run. Real lines are in
tests/fixtures/engine-logs/: the CPU build's, and an H200 boot of vLLM 0.26.0, whose lines differ from
0.33.0's only in text the parser does not read (its KV cache line ends at "tokens"; its suggestion line
words the usage before "Replace" differently):

    KV cache tokens  vllm/v1/core/kv_cache_utils.py (0.33.0 :1148, 0.32.0 :2328), once, by the engine core:
                       "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"
                     the first %s "GPU" on CUDA, else the device type upper-cased ("CPU"), + " + host" with
                     hisparse; the tokens f"{n:,}" — real: "GPU KV cache size: 5,509,184 tokens",
                     "CPU KV cache size: 46,592 tokens, Maximum concurrency for 2,048 tokens per request: 22.75x"
    KV cache GiB     vllm/v1/worker/gpu_worker.py:773 (0.33.0), the local first rank:
                       "Available KV cache memory: %s GiB"   (%s: format_gib, round(bytes / GiB, 2))
                     or, --kv-cache-memory given, gpu_worker.py:665-673, logged at :676 (0.33.0):
                       f"Initial free memory {format_gib(..)} GiB, reserved {format_gib(kv_cache_memory_bytes)}
                       GiB memory for KV Cache as specified by kv_cache_memory_bytes config and ..."
                     CPU: vllm/v1/worker/cpu_worker.py (0.32.0 :230 and :252, logged at :260):
                       f"Explicitly set ({format_gib(kv_cache_size)}/{format_gib(total)}) GiB for KV cache on node {n}."
                       f"Auto set ({format_gib(kv_cache_size)}/{format_gib(total)}) GiB for KV cache on node {n},
                       with ..."
    CUDA graphs      gpu_worker.py:1004 (0.33.0), every worker, when vLLM estimated the graphs' memory:
                       "CUDA graph pool memory: %s GiB (actual), %s GiB (estimated), difference: %s GiB (%.1f%%)."
                     else the actual alone, vllm/v1/worker/gpu_model_runner.py:6517 (0.33.0; the V2 runner
                     gpu/model_runner.py:1164): "Graph capturing finished in %.0f secs, took %.2f GiB"
    suggestion       gpu_worker.py:1045-1064, logged at :1066 (0.33.0), every worker, when vLLM sized the cache
                     by profiling:
                       f"Free memory on device (..) on startup. ... Replace gpu_memory_utilization config with
                       `--kv-cache-memory={to_requested}` ({format_gib(to_requested)} GiB) to fit into requested
                       memory, or `--kv-cache-memory={to_gpu}` ({format_gib(to_gpu)} GiB) to fully utilize gpu
                       memory. Current kv cache memory in use is {format_gib(..)} GiB."

Several workers (tensor parallel) print a line each: the tightest counts — the least KV cache memory and
the least suggestion (one --kv-cache-memory serves every worker), the CUDA graphs of the fullest card.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

MIB = 1 << 20
_LOAD = "llama_model_loader: loaded meta data"
_MODEL = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")
_KV = re.compile(r"llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB")
_COMPUTE = re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")
_VLLM_TOKENS = re.compile(r"\b[A-Z]+(?: \+ host)? KV cache size: ([\d,]+) tokens")
_GIB = r"(-?\d+(?:\.\d+)?)"
_VLLM_KV_GIB = (re.compile(rf"Available KV cache memory: {_GIB} GiB"),
                re.compile(rf"GiB, reserved {_GIB} GiB memory for KV Cache as specified by kv_cache_memory_bytes"),
                re.compile(rf"(?:Explicitly|Auto) set \({_GIB}/{_GIB}\) GiB for KV cache on node"))
_VLLM_GRAPH_POOL = re.compile(rf"CUDA graph pool memory: {_GIB} GiB \(actual\), {_GIB} GiB \(estimated\)")
_VLLM_GRAPH_TOOK = re.compile(rf"Graph capturing finished in \d+ secs, took {_GIB} GiB")
_VLLM_SUGGEST = re.compile(rf"Replace gpu_memory_utilization config with `--kv-cache-memory=(-?\d+)` \({_GIB} GiB\) "
                           rf"to fit into requested memory, or `--kv-cache-memory=(-?\d+)` \({_GIB} GiB\)")
# The lines worth keeping from a vLLM boot's output for vllm_sizing (engines/vllm.py SIZING).
VLLM_SIZING_LINE = re.compile("|".join(p.pattern for p in (_VLLM_TOKENS, *_VLLM_KV_GIB, _VLLM_GRAPH_POOL,
                                                             _VLLM_GRAPH_TOOK, _VLLM_SUGGEST)))


@dataclass(frozen=True)
class LlamaBuffers:
    """MiB per buffer kind, summed over devices (and, for the model, over buffer types)."""
    model_mib: float
    kv_mib: float
    compute_mib: float
    model_by_buffer: dict[str, float]


def llama_buffers(log: str) -> LlamaBuffers | None:
    """The real load's buffers, or None when the log has none (not verbose, or it failed first)."""
    start = log.rfind(_LOAD)
    tail = log[start:] if start >= 0 else log
    model: dict[str, float] = {}
    for name, mib in _MODEL.findall(tail):
        model[name] = model.get(name, 0.0) + float(mib)
    if not model:
        return None
    return LlamaBuffers(model_mib=sum(model.values()), kv_mib=sum(float(m) for _, m in _KV.findall(tail)),
                        compute_mib=sum(float(m) for _, m in _COMPUTE.findall(tail)), model_by_buffer=model)


def vllm_kv_tokens(log: str) -> int | None:
    found = _VLLM_TOKENS.findall(log)
    return int(found[-1].replace(",", "")) if found else None


@dataclass(frozen=True)
class VllmSizing:
    """What vLLM said of its own sizing at boot; None where it printed no such line."""
    kv_tokens: int | None = None
    kv_cache_gib: float | None = None          # the least of the workers' lines
    kv_cache_workers: int = 0                  # how many said it
    cuda_graph_gib: float | None = None        # what the capture took, on the fullest card
    cuda_graph_estimate_gib: float | None = None   # vLLM's estimate for that card, where it made one
    suggested_kv_cache_bytes: int | None = None    # --kv-cache-memory to fit the requested memory
    suggested_kv_cache_gib: float | None = None
    suggested_full_gpu_bytes: int | None = None    # --kv-cache-memory to fill the card


def vllm_sizing(lines: Iterable[str]) -> VllmSizing:
    """The sizing lines of one vLLM boot (the module doc quotes each); any other line is ignored."""
    tokens: int | None = None
    kv: list[float] = []
    pools: list[tuple[float, float]] = []
    took: list[float] = []
    suggested: list[tuple[int, float, int]] = []
    for line in lines:
        if m := _VLLM_TOKENS.search(line):
            tokens = int(m.group(1).replace(",", ""))
        elif m := next((found for p in _VLLM_KV_GIB if (found := p.search(line))), None):
            kv.append(float(m.group(1)))
        elif m := _VLLM_GRAPH_POOL.search(line):
            pools.append((float(m.group(1)), float(m.group(2))))
        elif m := _VLLM_GRAPH_TOOK.search(line):
            took.append(float(m.group(1)))
        elif m := _VLLM_SUGGEST.search(line):
            suggested.append((int(m.group(1)), float(m.group(2)), int(m.group(3))))
    graph, estimate = max(pools) if pools else (max(took) if took else None, None)
    least = min(suggested) if suggested else None
    return VllmSizing(kv_tokens=tokens, kv_cache_gib=min(kv) if kv else None, kv_cache_workers=len(kv),
                      cuda_graph_gib=graph, cuda_graph_estimate_gib=estimate,
                      suggested_kv_cache_bytes=least[0] if least else None,
                      suggested_kv_cache_gib=least[1] if least else None,
                      suggested_full_gpu_bytes=min(s[2] for s in suggested) if suggested else None)
