"""Find the model file the engine loads: a local path, or a file inside a fetched Hub snapshot
(supervisor/model/fetch/ fetches hf:// sources into the volume).

`model.entry` may be a glob (a sharded GGUF's first part), which must match
exactly one file: two matches mean the config is ambiguous, and guessing
would load the wrong quantisation.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from ..config import DeployConfig
from ..errors import FetchError


def pick_entry(root: Path, entry: str) -> Path:
    candidates = sorted(p for p in root.rglob("*") if p.is_file()
                        and fnmatch.fnmatchcase(p.relative_to(root).as_posix(), entry))
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise FetchError(f"model.entry {entry!r} matches no file under {root}")
    names = ", ".join(p.relative_to(root).as_posix() for p in candidates[:5])
    raise FetchError(f"model.entry {entry!r} matches {len(candidates)} files under {root} ({names}); "
                     "make it match exactly one")


def resolve_local(cfg: DeployConfig) -> Path:
    src = Path(cfg.model.source)
    if src.is_file():
        return src
    if src.is_dir():
        if not cfg.model.entry:
            raise FetchError(f"model.source {src} is a directory: set model.entry to the file to load")
        return pick_entry(src, cfg.model.entry)
    raise FetchError(f"model.source {src} does not exist (mount the model there, or set KILN_MODEL_SOURCE)")


def resolve(cfg: DeployConfig) -> Path | None:
    """The local model file, or None for an hf:// source (supervisor/model/fetch/ fetches those)."""
    return None if cfg.model.hf_repo else resolve_local(cfg)
