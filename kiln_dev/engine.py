"""Where a real llama-server is: the one `python build.py compile --target cpu-llamacpp` built
(cached under $KILN_CACHE_DIR, default ~/.cache/kiln, keyed by its inputs), or $KILN_LLAMA_PREFIX
(a prefix with bin/llama-server). CI must never skip for lack of it."""

from __future__ import annotations

import os
from pathlib import Path

from . import Unavailable

HINT = "build it once (cached): python build.py compile --target cpu-llamacpp"


def cpu_prefix() -> Path | None:
    """The compiled CPU prefix, or None when there is none (yet: a compile may still be running)."""
    explicit = os.environ.get("KILN_LLAMA_PREFIX")
    if explicit:
        return Path(explicit) if (Path(explicit) / "bin" / "llama-server").is_file() else None
    from images.binaries import artifacts, obtain as binaries
    from images.pins.lock import load_lock, pins_for
    from images.target import load_target

    target = load_target("cpu-llamacpp")
    spec = binaries.expected_spec(target, pins_for(target, load_lock()), artifacts.os_identity())
    prefix = binaries.cache_dir() / "binaries" / spec.name().removesuffix(".tar.gz") / "prefix"
    return prefix if (prefix / "bin" / "llama-server").is_file() else None


def require_prefix() -> Path:
    """cpu_prefix(), or Unavailable naming the command that builds it."""
    prefix = cpu_prefix()
    if prefix is None:
        where = os.environ.get("KILN_LLAMA_PREFIX")
        if where:
            raise Unavailable(f"KILN_LLAMA_PREFIX={where} has no bin/llama-server: point it at a compiled prefix, "
                              f"or unset it and {HINT}")
        raise Unavailable(f"no llama-server: {HINT}")
    return prefix


def llama_server_binary() -> Path:
    """The llama-server executable of require_prefix()."""
    return require_prefix() / "bin" / "llama-server"
