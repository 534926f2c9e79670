"""What makes a saved KV cache valid for an engine: the same model file, the same engine build, and the
same flags that change what the cache holds or how it is computed. Two engines that differ in any of
these get different keys, and a saved slot of another key is never loaded (store.py counts it skipped)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

SAMPLE = 1 << 20          # bytes read from each end of a model file for its identity

# Flags that change nothing a KV cache holds: where the server listens, its keys, logging, threads,
# timeouts, the save path itself, and the default sampling parameters (sampling reads the logits the
# cache produced; a reload of [sampler] keeps the cache). Every other flag is part of the key (an extra
# one only costs a miss).
VOLATILE = {"--host", "--port", "--api-key", "--api-key-file", "--slot-save-path", "--metrics", "--props",
            "--slots", "--no-slots", "-t", "--threads", "-tb", "--threads-batch", "--timeout", "-to", "-a",
            "--alias", "--log-file", "--log-disable", "--log-verbosity", "-lv", "--log-prefix",
            "--log-timestamps", "--log-colors", "-v", "--verbose", "--no-webui", "--webui", "--path",
            "--temp", "--temperature", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--repeat-last-n",
            "--presence-penalty", "--frequency-penalty", "--seed", "-s"}


def file_identity(path: Path) -> str:
    """A model file's identity without reading all of it (a model is up to hundreds of GiB): its size and
    the sha256 of its first and last MiB. A changed file (another quantization, a re-download of another
    revision) differs in its header or its tail."""
    st = path.stat()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(SAMPLE))
        if st.st_size > SAMPLE:
            f.seek(max(SAMPLE, st.st_size - SAMPLE))
            h.update(f.read(SAMPLE))
    return f"{st.st_size}:{h.hexdigest()}"


def model_identity(model: Path) -> str:
    """Every file of the model (a split GGUF's shards: the files beside it of the same stem)."""
    files = [model]
    if model.name.endswith(".gguf") and "-00001-of-" in model.name:
        stem = model.name.split("-00001-of-")[0]
        files = sorted(model.parent.glob(f"{stem}-*-of-*.gguf"))
    return ";".join(f"{p.name}={file_identity(p)}" for p in files)


def engine_identity(binary: str) -> str:
    """The engine build: the sha256 of its executable (llama-server is one static binary)."""
    path = Path(binary)
    if not path.is_file():
        return binary
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def computation_flags(argv: Sequence[str]) -> list[str]:
    """argv without the binary, the model path and the flags in VOLATILE (with their values)."""
    out: list[str] = []
    skip = False
    args = list(argv[1:])
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        name, eq, _ = a.partition("=")
        if name in VOLATILE or name in ("-m", "--model"):
            skip = not eq and i + 1 < len(args) and not args[i + 1].startswith("-")
            continue
        out.append(a)
    return out


def cache_key(argv: Sequence[str], model: Path, env: dict[str, str] | None = None) -> str:
    """The key of the KV caches an engine started with `argv` on `model` can take: 24 hex digits."""
    parts = [engine_identity(argv[0]), model_identity(model), "\0".join(computation_flags(argv))]
    parts += [f"{k}={v}" for k, v in sorted((env or {}).items()) if k.startswith(("LLAMA_ARG_", "GGML_"))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


__all__ = ["VOLATILE", "cache_key", "computation_flags", "engine_identity", "file_identity", "model_identity"]
