"""Which engine module runs a config, and whether its binary is in this image."""

from __future__ import annotations

import os
import shutil
from types import ModuleType
from typing import Any

from . import llamacpp, router, vllm

ENGINES: dict[str, ModuleType] = {"llamacpp": llamacpp, "vllm": vllm, "router": router}


def get(name: str) -> ModuleType:
    if name not in ENGINES:
        raise KeyError(f"engine {name!r} is not supported by this supervisor yet")
    return ENGINES[name]


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


def relaunch_env(engine: ModuleType | None) -> dict[Any, dict[str, str]]:
    """failure class -> the environment a failure of that class asks the rung's relaunches to run
    with (the engine module's RELAUNCH_ENV: vLLM's spawn after a fork that met CUDA); {} for most."""
    return getattr(engine, "RELAUNCH_ENV", {})


def relaunch_values(engine: ModuleType | None) -> dict[str, set[str]]:
    """variable -> every value relaunch_env may set it to (what may come back from the ladder memory)."""
    out: dict[str, set[str]] = {}
    for fix in relaunch_env(engine).values():
        for k, v in fix.items():
            out.setdefault(k, set()).add(v)
    return out
