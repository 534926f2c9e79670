"""Compile caches on the supervisor's state volume, so a pod's second boot skips the compiles.

vLLM compiles its model with torch.compile and Triton at every start and keeps the results in
VLLM_CACHE_ROOT (~/.cache/vllm), TORCHINDUCTOR_CACHE_DIR (/tmp/torchinductor_<user>) and
TRITON_CACHE_DIR (~/.triton/cache): on a container disk that a restart wipes. The NVIDIA driver
keeps the machine code it JIT-compiles from PTX (the A40 build's compute_86 PTX on a newer GPU) in
CUDA_CACHE_PATH (~/.nv/ComputeCache, at most CUDA_CACHE_MAXSIZE bytes, 256 MiB by default). The
supervisor's state_dir is on the volume (images/target.py checks that for Hub models), so the
caches go there. A rung's own env setting of any of these wins.

Serverless workers share one volume (supervisor/runpod_env.py), and a cache is shared
between them only where its writers never leave a half-written entry for a reader:
- shared: vLLM's, Inductor's and Triton's. Their entries are content-keyed and written whole then
  renamed into place: torch >= 2.10 writes Inductor artifacts atomically (pytorch#162432), vLLM
  saves its compile artifacts in the binary format by default (vllm-project/vllm#27616, for
  vllm#24601: concurrent `vllm serve` processes clobbered the unpacked directories), Triton
  writes through a temporary file; SkyRL measured 8 engines compiling at once into one
  VLLM_CACHE_ROOT with vLLM 0.28 / torch 2.11 without a failure (NovaSky-AI/SkyRL#2138).
- per worker (`own_caches`): the driver's JIT cache. NVIDIA documents no locking for it across
  processes, let alone hosts on a network volume, and other JIT caches that share a network
  filesystem have failed on exactly that (deepseek-ai/DeepEP#683: a rename race that NFS makes
  visible). So a Serverless worker keeps its own, in its worker directory: a PTX-only build pays
  its JIT once per worker (~40 s for the A40 build on an H200: docs/benchmarks.md), unless the
  worker comes back with its id (a restarted container), or a worker of the same image and GPU kind
  is gone: a cache with no writer left is safe to hand on, and the next worker takes it over before
  its engine starts (serverless/workdirs.py, which also prunes what dead workers leave).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from ..config import DeployConfig, Rung

# The driver's JIT cache. NVIDIA's CUDA Programming Guide gives CUDA_CACHE_MAXSIZE a 256 MiB default
# and a 4 GiB maximum (as recalled, not re-read from a copy here); a PTX-only build of llama.cpp's
# many kernels may outgrow the default, and a binary too large for the cache is never cached. Issue
# 13's device run measures the cache it fills (docs/research/device-plan-2026-12-01.md).
CUDA_JIT = {"CUDA_CACHE_PATH": "cuda-jit", "CUDA_CACHE_MAXSIZE": "4294967296"}
TORCH_COMPILE = {"VLLM_CACHE_ROOT": "vllm", "TORCHINDUCTOR_CACHE_DIR": "torchinductor", "TRITON_CACHE_DIR": "triton"}
PER_WORKER = ("CUDA_CACHE_PATH",)        # never shared between Serverless workers (the module doc says why)


def cache_root(cfg: DeployConfig) -> Path:
    return Path(cfg.state_dir) / "cache"


def cache_env(cfg: DeployConfig, rung: Rung, names: Mapping[str, str]) -> dict[str, str]:
    """{VAR: state_dir/cache/<dir>} for each cache the rung's env does not set itself. The tools
    create their own directories; CUDA_CACHE_MAXSIZE is a size, passed as given."""
    out: dict[str, str] = {}
    for var, sub in names.items():
        if var in rung.env:
            continue
        if sub.isdigit():
            out[var] = sub
            continue
        out[var] = str(cache_root(cfg) / sub)
    return out


def own_caches(env: dict[str, str], cfg: DeployConfig, rung: Rung, own_dir: Path) -> dict[str, str]:
    """`env` (an engine's defaults) with the caches that are never shared moved under `own_dir`, this
    supervisor's own directory (a Serverless worker's; a pod's is its state_dir: nothing moves)."""
    out = dict(env)
    for var in PER_WORKER:
        if var in out and var not in rung.env and out[var] == str(cache_root(cfg) / CUDA_JIT[var]):
            out[var] = str(own_dir / "cache" / CUDA_JIT[var])
    return out
