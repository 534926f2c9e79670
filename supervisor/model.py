"""Find the model file the engine loads: a local path, or a Hub snapshot in the volume.

`model.entry` may be a glob (a sharded GGUF's first part), which must match
exactly one file: two matches mean the config is ambiguous, and guessing
would load the wrong quantisation.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from .config import DeployConfig
from .errors import FetchError


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


def fetch_hub(cfg: DeployConfig, token: str | None) -> Path:
    """Download the snapshot into the volume's cache (huggingface_hub resumes and verifies)."""
    repo = cfg.model.hf_repo
    assert repo is not None
    # Imported here: huggingface_hub costs ~0.3 s to import, which a local model never needs.
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    cache = Path(cfg.state_dir) / "hf"
    try:
        snap = snapshot_download(repo, revision=cfg.model.revision, cache_dir=str(cache),
                                 allow_patterns=list(cfg.model.allow_patterns) or None, token=token)
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as e:
        # The message of these errors never carries the token; keep only its first line.
        raise FetchError(f"could not fetch {cfg.model.source}@{cfg.model.revision or 'main'}: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    assert cfg.model.entry
    return pick_entry(Path(snap), cfg.model.entry)


def resolve(cfg: DeployConfig, token: str | None) -> Path:
    return fetch_hub(cfg, token) if cfg.model.hf_repo else resolve_local(cfg)
