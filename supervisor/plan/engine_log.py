"""What an engine says it allocated, read from its own log: the figures the plan is checked against.

llama-server (needs `-v`: these lines are below its default verbosity) logs a dry run for its autofit
first (buffers of 0.00 MiB) and then the real load; the last load's lines count:

    load_tensors:   CPU_Mapped model buffer size =    92.10 MiB      (one line per buffer type/device)
    llama_kv_cache:        CPU KV buffer size =   180.00 MiB
    sched_reserve:        CPU compute buffer size =    22.64 MiB

vLLM logs its KV cache as tokens ("GPU KV cache size: 5,509,184 tokens", the CPU build
"CPU KV cache size: 46,592 tokens").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIB = 1 << 20
_LOAD = "llama_model_loader: loaded meta data"
_MODEL = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")
_KV = re.compile(r"llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB")
_COMPUTE = re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")
_VLLM_TOKENS = re.compile(r"(?:GPU|CPU|XPU) KV cache size: ([\d,]+) tokens")


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
