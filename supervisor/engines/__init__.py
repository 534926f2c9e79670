"""The engines the supervisor can run. Each is a module with the same surface, so the lifecycle
never asks which engine it is:

    load_snapshot(path) -> FlagSnapshot           the engine's own --help, parsed
    lint_rung(cfg, index, rung, snapshot, gpu_count=None, *, model=None) -> list[LintIssue]
                                                  errors: the rung is refused (model: its GGUF header)
    lint_rung_warnings(cfg, index, rung, snapshot, *, model=None) -> list[LintIssue]
                                                  warnings (LintIssue.severity "warning"): it runs
    build_argv(cfg, rung, *, model_path, api_key_file, vcpus=None) -> list[str]
    engine_env(cfg, rung, api_key) -> dict        environment the engine needs (vLLM's key)
    SIGNATURES, HINTS                             stderr lines that decide a failure's class
    STALL_LINES                                   (pattern, count): repeated output that is a stall
"""

from __future__ import annotations

from types import ModuleType

from . import llamacpp, vllm


def get(name: str) -> ModuleType:
    engines = {"llamacpp": llamacpp, "vllm": vllm}
    if name not in engines:
        raise KeyError(f"engine {name!r} is not supported by this supervisor yet")
    return engines[name]
