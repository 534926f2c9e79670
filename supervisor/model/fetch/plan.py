"""What to fetch: the files of a repo at one commit, filtered, each cut into segments.

    repo + revision (branch, tag or pinned commit) + allow_patterns (one quant out of many)
      -> the commit (repo_info, unless the revision is one) and its files (list_repo_tree):
         size, the LFS sha256 or git blob id, and the Xet hash where the Hub stores it in Xet
      -> the files the patterns allow; model.entry must match exactly one of them
      -> a segment size: the unit of parallelism and of resume (journal.py records finished ones)

Nothing here downloads a byte. The size of a file sets no ceiling: huggingface_hub's `http_get`
refuses a file over constants.MAX_HTTP_DOWNLOAD_SIZE (50e9 bytes) when it starts at byte 0, but a
segment is at most MAX_SEGMENT long, so no request of ours is ever that large.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Sequence

from ...config import COMMIT
from ...errors import FetchError

MIB = 1 << 20
MIN_SEGMENT = 1 * MIB
MAX_SEGMENT = 64 * MIB       # a kill re-downloads at most connections x this (2 GiB at 32 connections)
SEGMENTS_PER_CONNECTION = 2  # small repos: enough segments that every connection has work, few requests
META_TIMEOUT_S = 20.0


class PlanError(FetchError):
    """The repo has nothing to fetch that fits the config (kind "entry"): not a network problem."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Planned:
    path: str                  # in the repo
    size: int
    blob: str                  # the cache's blob name: the LFS sha256, else the git blob sha1
    xet_hash: str | None = None  # the Hub stores it in Xet: hf_xet can fetch it

    @property
    def digest_name(self) -> str:
        return "sha256" if len(self.blob) == 64 else "git oid"


def list_files(api: Any, repo: str, revision: str) -> tuple[str, list[Any]]:
    """(commit, the RepoFile entries at it), through huggingface_hub (raises its errors)."""
    from huggingface_hub.hf_api import RepoFile

    commit = revision if COMMIT.fullmatch(revision) else api.repo_info(repo, revision=revision,
                                                                       timeout=META_TIMEOUT_S).sha
    files = [f for f in api.list_repo_tree(repo, revision=commit, recursive=True) if isinstance(f, RepoFile)]
    return commit, files


def select(files: Sequence[Any], allow: Sequence[str], entry: str, repo: str, commit: str) -> list[Planned]:
    """The files to fetch, in the Hub's order; PlanError if the entry does not match exactly one."""
    from huggingface_hub.utils import filter_repo_objects

    wanted = list(filter_repo_objects(files, allow_patterns=list(allow) or None, key=lambda f: f.path))
    if not wanted:
        raise PlanError("entry", f"no file of {repo}@{commit[:12]} matches allow_patterns {list(allow) or ['*']}")
    hits = [f.path for f in wanted if fnmatch.fnmatchcase(f.path, entry)]
    if len(hits) != 1:
        raise PlanError("entry", f"model.entry {entry!r} matches {len(hits)} of the files to fetch "
                                 f"({', '.join(hits[:5]) or 'none'}); it must match exactly one")
    return [Planned(f.path, int(f.size or 0), f.lfs.sha256 if f.lfs else f.blob_id,
                    getattr(f, "xet_hash", None) or None) for f in wanted]


def segment_size(need: int, connections: int, fixed_mib: int = 0) -> int:
    """Bytes per segment for a fetch that still needs `need` bytes over `connections` connections.

    `fixed_mib` (model.fetch_segment_mib) wins when set. Otherwise: enough segments that every
    connection gets about SEGMENTS_PER_CONNECTION of them, in whole MiB, between MIN_SEGMENT (a
    request costs a round trip) and MAX_SEGMENT (what a kill can lose per connection)."""
    if fixed_mib:
        return fixed_mib * MIB
    share = -(-need // (connections * SEGMENTS_PER_CONNECTION))
    return max(MIN_SEGMENT, min(MAX_SEGMENT, -(-share // MIB) * MIB))


def segments(size: int, seg: int) -> list[tuple[int, int]]:
    """[start, end) of each segment of a file of `size` bytes."""
    return [(s, min(s + seg, size)) for s in range(0, size, seg)]
