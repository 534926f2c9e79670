"""The engines the supervisor can run. Each is a module with the same surface, so the lifecycle
never asks which engine it is:

    load_snapshot(path) -> FlagSnapshot           the engine's own --help, parsed
    lint_rung(cfg, index, rung, snapshot, gpu_count=None, *, model=None) -> list[LintIssue]
                                                  errors: the rung is refused (model: its GGUF header)
    lint_rung_warnings(cfg, index, rung, snapshot, *, model=None) -> list[LintIssue]
                                                  warnings (LintIssue.severity "warning"): it runs
    build_argv(cfg, rung, *, model_path, api_key_file, vcpus=None) -> list[str]
    engine_env(cfg, rung, api_key) -> dict        environment the engine must have (vLLM's key)
    engine_defaults(cfg, rung) -> dict           environment defaults the pod or rung may override (caches)
    sampler_overrides(cfg, rung, snapshot=None) -> dict
                                                  [sampler] defaults the rung sets itself (field -> how);
                                                  build_argv replaces those, one by one, and keeps the rest
    SIGNATURES, HINTS                             stderr lines that decide a failure's class
    STALL_LINES                                   (pattern, count): repeated output that is a stall
"""

from __future__ import annotations

import os
import shutil
from types import ModuleType

from . import llamacpp, vllm


def get(name: str) -> ModuleType:
    engines = {"llamacpp": llamacpp, "vllm": vllm}
    if name not in engines:
        raise KeyError(f"engine {name!r} is not supported by this supervisor yet")
    return engines[name]


def binary_present(binary: str) -> bool:
    """The engine binary exists and can be executed (a path), or is on PATH (a bare name)."""
    if not binary:
        return False
    if "/" in binary:
        return os.path.isfile(binary) and os.access(binary, os.X_OK)
    return shutil.which(binary) is not None


def missing_binary_message(binary: str, engine: str) -> str:
    return (f"server.binary {binary!r} is not in this image or not executable (engine {engine}): use an image "
            "built for this engine, or point server.binary at the engine's executable")
