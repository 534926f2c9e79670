"""Where the tests find a real llama-server: the one `python build.py compile --target cpu-llamacpp`
built (cached by its inputs), or $KILN_LLAMA_PREFIX. CI must never skip for lack of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HINT = "build it once (cached): python build.py compile --target cpu-llamacpp"


def cpu_prefix() -> Path | None:
    explicit = os.environ.get("KILN_LLAMA_PREFIX")
    if explicit:
        return Path(explicit) if (Path(explicit) / "bin" / "llama-server").is_file() else None
    from images import artifacts, binaries
    from images.lock import load_lock, pins_for
    from images.target import load_target

    target = load_target("cpu-llamacpp")
    spec = binaries.expected_spec(target, pins_for(target, load_lock()), artifacts.os_identity())
    prefix = binaries.cache_dir() / "binaries" / spec.name().removesuffix(".tar.gz") / "prefix"
    return prefix if (prefix / "bin" / "llama-server").is_file() else None


def require_prefix() -> Path:
    prefix = cpu_prefix()
    if prefix is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"no llama-server for the tests: {HINT}")
        pytest.skip(f"no llama-server: {HINT}")
    return prefix
