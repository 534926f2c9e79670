"""Where a fetch keeps things: huggingface_hub's own cache layout, plus Kiln's partials and manifests.

    <state_dir>/hf/                                   the cache (HF_HUB_CACHE layout, so its tools read it)
      models--<owner>--<name>/
        blobs/<sha256 or git oid>                     complete, verified content; never deleted here
        blobs/<blob>.incomplete                       a partial: full length, sparse, segments land in place
        blobs/<blob>.incomplete.journal               which segments of that partial are finished (journal.py)
        snapshots/<commit>/<path> -> ../../blobs/...  what the engine opens
        refs/<branch or tag>                          the commit a name pointed at when it was fetched
      .locks/models--<owner>--<name>/<blob>.lock      huggingface_hub's per-blob lock: one writer per blob
      kiln-manifests/<key>.json                       a complete fetch of repo + revision + patterns

The blob name is what huggingface_hub names it by (the ETag the Hub serves): the LFS sha256 for
LFS and Xet files, the git blob sha1 for regular ones, so `hf_hub_download` finds our blobs and
we find its.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

from ...config import DeployConfig

DISK_MARGIN = 1 << 20        # refs, manifests, journals and tree caches need a little room too


def cache_dir(cfg: DeployConfig) -> Path:
    return Path(cfg.state_dir) / "hf"


def storage(cache: Path, repo: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--"))


def blob_paths(cache: Path, repo: str, blob: str) -> tuple[Path, Path]:
    """(the complete blob, its partial)."""
    blobs = storage(cache, repo) / "blobs"
    return blobs / blob, blobs / f"{blob}.incomplete"


def lock_path(cache: Path, repo: str, blob: str) -> Path:
    return cache / ".locks" / storage(cache, repo).name / f"{blob}.lock"


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def free_bytes(path: Path) -> int:
    """Free bytes for an unprivileged writer on the filesystem holding `path` (statvfs)."""
    return shutil.disk_usage(path).free


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def link(blob: Path, snapshot: Path, rel: str) -> None:
    """snapshots/<commit>/<rel> -> the blob, relative (as huggingface_hub links), replaced atomically."""
    dest = snapshot / rel
    if dest.exists():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(os.path.relpath(blob, dest.parent), tmp)
    os.replace(tmp, dest)


def write_ref(cache: Path, repo: str, revision: str, commit: str) -> None:
    if commit != revision:
        ref = storage(cache, repo) / "refs" / revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)


def manifest_path(cache: Path, repo: str, revision: str, allow: Sequence[str]) -> Path:
    key = hashlib.sha256("\0".join([repo, revision, *sorted(allow)]).encode()).hexdigest()[:24]
    return cache / "kiln-manifests" / f"{key}.json"


def write_manifest(cache: Path, repo: str, revision: str, allow: Sequence[str], commit: str,
                   files: dict[str, int], at: float) -> None:
    write_json(manifest_path(cache, repo, revision, allow),
               {"repo": repo, "revision": revision, "allow_patterns": list(allow), "commit": commit,
                "files": files, "at": at})


def cached_snapshot(cache: Path, repo: str, revision: str, allow: Sequence[str]) -> tuple[Path, str] | None:
    """(snapshot dir, commit) of a complete earlier fetch of this repo/revision/patterns, or None.
    Complete means every file the manifest lists is there with its size."""
    try:
        man = json.loads(manifest_path(cache, repo, revision, allow).read_text(encoding="utf-8"))
        snap = storage(cache, repo) / "snapshots" / man["commit"]
        for rel, size in man["files"].items():
            if (snap / rel).stat().st_size != size:
                return None
        return snap, man["commit"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
