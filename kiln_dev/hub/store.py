"""The Hub stand-in's storage: repos, refs, immutable commits and content-addressed blobs under one
directory (see kiln_dev/hub/__init__.py for the layout). No HTTP here."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
CHUNK = 1024 * 1024
# What the Hub puts in a new repo's first commit (shortened: the Hub lists many more patterns).
GITATTRIBUTES = (
    b"*.bin filter=lfs diff=lfs merge=lfs -text\n"
    b"*.gguf filter=lfs diff=lfs merge=lfs -text\n"
    b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
)


@dataclass(frozen=True)
class RepoKey:
    """A repo as the Hub names it: its type ("model" or "dataset") and "namespace/name"."""

    type: str
    id: str

    @property
    def url_path(self) -> str:
        """Path of the repo's web page: models at the root, datasets under /datasets."""
        return self.id if self.type == "model" else f"datasets/{self.id}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


class Store:
    """Repos, refs, immutable commits and content-addressed blobs under one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        (root / "repos").mkdir(parents=True, exist_ok=True)
        # One lock for every read-modify-write: request threads race otherwise.
        self.lock = threading.RLock()
        self._oids: dict[str, str] = {}
        self._oid_lock = threading.Lock()
        self.kinds: dict[str, str] = {}  # sha256 -> "lfs" | "xet"; absent: a regular git file

    # -- blobs

    def put_blob(self, data: bytes, kind: str = "regular") -> str:
        sha = hashlib.sha256(data).hexdigest()
        path = self.blob_path(sha)
        if not path.exists():
            tmp = path.with_name(f"{sha}.{threading.get_ident()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)  # atomic, so a reader never sees half a blob
        self._mark(sha, kind)
        return sha

    def put_sparse(self, size: int) -> str:
        """A file of `size` zero bytes that takes no disk, named by a declared (not computed) sha256."""
        sha = hashlib.sha256(b"kiln-standin-sparse:%d" % size).hexdigest()
        path = self.blob_path(sha)
        if not path.exists():
            with path.open("wb") as f:
                f.truncate(size)
        self._mark(sha, "lfs")
        return sha

    def _mark(self, sha: str, kind: str) -> None:
        if kind not in ("regular", "lfs", "xet"):
            raise ValueError(f"storage must be regular, lfs or xet, not {kind!r}")
        if kind != "regular":
            self.kinds[sha] = kind

    def pointer(self, sha: str) -> bytes:
        """The git-lfs pointer file git stores in place of an LFS file."""
        return b"version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (
            sha.encode(), self.blob_size(sha))

    def has_blob(self, sha: str) -> bool:
        return bool(re.fullmatch(r"[0-9a-f]{64}", sha)) and self.blob_path(sha).is_file()

    def blob_path(self, sha: str) -> Path:
        return self.root / "blobs" / sha

    def blob_size(self, sha: str) -> int:
        return self.blob_path(sha).stat().st_size

    def blob_oid(self, sha: str) -> str:
        """Git blob sha1 of what git stores: the content of a regular file (what the Hub reports as its
        oid/ETag), the pointer file of an LFS one. Computed once per blob, not once per request."""
        oid = self._oids.get(sha)
        if oid is None:
            with self._oid_lock:
                oid = self._oids.get(sha)
                if oid is None and sha in self.kinds:
                    oid = sha1(b"blob %d\0" % len(self.pointer(sha)) + self.pointer(sha))
                elif oid is None:
                    digest = hashlib.sha1(b"blob %d\0" % self.blob_size(sha))
                    with self.blob_path(sha).open("rb") as f:
                        for chunk in iter(lambda: f.read(CHUNK), b""):
                            digest.update(chunk)
                    oid = digest.hexdigest()
                self._oids[sha] = oid
        return oid

    # -- repos

    def _dir(self, key: RepoKey) -> Path:
        return self.root / "repos" / key.type / key.id

    def repo(self, key: RepoKey) -> dict[str, Any] | None:
        path = self._dir(key) / "repo.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def _save(self, key: RepoKey, meta: dict[str, Any]) -> None:
        path = self._dir(key) / "repo.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
        os.replace(tmp, path)

    def create_repo(self, key: RepoKey, private: bool) -> bool:
        """Create the repo with its initial commit on main; False if it already exists."""
        with self.lock:
            if self.repo(key) is not None:
                return False
            (self._dir(key) / "commits").mkdir(parents=True, exist_ok=True)
            meta = {"private": private, "createdAt": _now(), "seq": 0, "branches": {}, "tags": {}}
            self._save(key, meta)
            files = {".gitattributes": self.put_blob(GITATTRIBUTES)}
            cid = self._write_commit(key, meta, None, files, "initial commit", "")
            meta["branches"]["main"] = cid
            self._save(key, meta)
            return True

    def delete_repo(self, key: RepoKey) -> bool:
        with self.lock:
            if self.repo(key) is None:
                return False
            shutil.rmtree(self._dir(key))
            return True

    def _must(self, key: RepoKey) -> dict[str, Any]:
        meta = self.repo(key)
        if meta is None:
            raise KeyError(key)
        return meta

    # -- refs and commits

    def resolve(self, key: RepoKey, rev: str) -> str | None:
        """Commit id of a branch, a tag or a full commit id; None if it names nothing."""
        meta = self.repo(key)
        if meta is None:
            return None
        if rev in meta["branches"]:
            return meta["branches"][rev]
        if rev in meta["tags"]:
            return meta["tags"][rev]
        if COMMIT_RE.fullmatch(rev) and (self._dir(key) / "commits" / f"{rev}.json").is_file():
            return rev
        return None

    def commit(self, key: RepoKey, cid: str) -> dict[str, Any]:
        return json.loads((self._dir(key) / "commits" / f"{cid}.json").read_text())

    def refs(self, key: RepoKey) -> tuple[dict[str, str], dict[str, str]]:
        meta = self._must(key)
        return dict(meta["branches"]), dict(meta["tags"])

    def set_ref(self, key: RepoKey, kind: str, name: str, cid: str | None) -> None:
        """Point branch or tag `name` (kind "branches"/"tags") at `cid`, or delete it if None."""
        with self.lock:
            meta = self._must(key)
            if cid is None:
                meta[kind].pop(name, None)
            else:
                meta[kind][name] = cid
            self._save(key, meta)

    def add_commit(self, key: RepoKey, branch: str, files: dict[str, str], title: str, message: str) -> str:
        """Write a commit on top of `branch` and move the branch to it (caller holds the lock)."""
        meta = self._must(key)
        cid = self._write_commit(key, meta, meta["branches"][branch], files, title, message)
        meta["branches"][branch] = cid
        self._save(key, meta)
        return cid

    def _write_commit(
        self, key: RepoKey, meta: dict[str, Any], parent: str | None, files: dict[str, str], title: str, message: str
    ) -> str:
        meta["seq"] += 1
        ident = json.dumps([key.type, key.id, meta["seq"], parent, files, title], sort_keys=True)
        cid = sha1(ident.encode())
        record = {"id": cid, "parent": parent, "files": files, "title": title, "message": message, "date": _now()}
        path = self._dir(key) / "commits" / f"{cid}.json"
        path.with_suffix(".tmp").write_text(json.dumps(record, sort_keys=True))
        os.replace(path.with_suffix(".tmp"), path)  # readers may look a commit up by id at any time
        return cid
