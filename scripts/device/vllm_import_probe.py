#!/usr/bin/env python3
"""Which packages does `vllm serve` import? Imports vLLM's API server and the modules a text
model's GPU path loads, then prints every top-level package that ended up in sys.modules.

    python3 vllm_import_probe.py [--cpu] [--deep] [--out FILE]

--cpu pins vLLM's CPU platform first (as images/scripts/vllm-flag-snapshot.py does) so it runs on
a machine without a GPU; --deep also imports the GPU worker, the model runner, the Llama model and
the attention backends. Used on the CPU machine to find the smallest set of wheels to carry to
the device (issue 14) and on the device to confirm it. Exit 1 names the first missing module.
"""

import argparse
import importlib
import json
import os
import sys
import traceback

ap = argparse.ArgumentParser()
ap.add_argument("--cpu", action="store_true")
ap.add_argument("--deep", action="store_true")
ap.add_argument("--out")
args = ap.parse_args()
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
before = set(sys.modules)

if args.cpu:
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform
    vllm.platforms._current_platform = CpuPlatform()

MODULES = ["vllm", "vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main",
           "vllm.entrypoints.cli.serve", "vllm.v1.engine.core", "vllm.v1.engine.async_llm"]
DEEP = ["vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner", "vllm.model_executor.models.llama",
        "vllm.v1.attention.backends.flash_attn", "vllm.v1.attention.backends.triton_attn",
        "vllm.v1.sample.sampler", "vllm.model_executor.layers.fused_moe", "vllm.compilation.backends",
        "vllm.device_allocator.cumem", "vllm.tokenizers.hf"]
result = {"ok": [], "failed": {}}
for name in MODULES + (DEEP if args.deep else []):
    try:
        importlib.import_module(name)
        result["ok"].append(name)
    except Exception as e:  # noqa: BLE001 - report every module, not just the first
        result["failed"][name] = f"{type(e).__name__}: {e}"
        tb = traceback.format_exc().strip().splitlines()
        result.setdefault("tracebacks", {})[name] = tb[-6:]
tops = sorted({m.split(".")[0] for m in set(sys.modules) - before})
result["packages"] = tops
text = json.dumps(result, indent=1)
if args.out:
    open(args.out, "w").write(text + "\n")
print(text)
sys.exit(1 if result["failed"] else 0)
