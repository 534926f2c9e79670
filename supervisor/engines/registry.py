"""Which engine module runs a config, and whether its binary is in this image."""

from __future__ import annotations

import os
import shutil
from types import ModuleType

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
