"""A local stand-in for huggingface.co, for tests.

The public Hugging Face Hub cannot be reached from CI or from the sandboxes we test in, so tests run
the REAL ``huggingface_hub`` client against this server instead. It speaks the subset of the Hub's
HTTP protocol that ``huggingface_hub`` uses for repos, uploads and downloads, as read from the
installed client's source (huggingface_hub 2.4.0) and exercised by tests/integration/test_hubserver.py.
It is stdlib only: ``http.server.ThreadingHTTPServer``.

Routes (``{type}`` is ``models`` or ``datasets``; revisions are branch names, tag names or full
40-hex commit ids, URL-encoded as one path segment, so ``feat%2Fx`` is branch ``feat/x``)::

    GET    /api/whoami-v2                                  needs the token
    POST   /api/repos/create                               json name/organization/type/visibility|private; 409 if it exists
    DELETE /api/repos/delete                               json name/organization/type
    GET    /api/{type}/{ns}/{name}[/revision/{rev}]        id, sha, siblings, lastModified, ...; ?blobs=true adds size/blobId
    GET    /api/{type}/{ns}/{name}/refs                    branches, tags, converts, pullRequests
    GET    /api/{type}/{ns}/{name}/tree/{rev}[/{path}]     ?recursive=true; file and directory entries, one page
    GET    /api/{type}/{ns}/{name}/commits/{rev}           history, newest first, one page
    POST   /api/{type}/{ns}/{name}/paths-info/{rev}        form or json ``paths``; missing paths are left out
    POST   /api/{type}/{ns}/{name}/preupload/{rev}         uploadMode "regular" for every file (so no LFS, no Xet)
    POST   /api/{type}/{ns}/{name}/commit/{branch}         NDJSON: header, file (base64), deletedFile, deletedFolder
    POST   /api/{type}/{ns}/{name}/branch/{name}           json startingPoint (default: main); 409 if it exists
    DELETE /api/{type}/{ns}/{name}/branch/{name}
    POST   /api/{type}/{ns}/{name}/tag/{rev}               json tag (the name), message; 409 if it exists
    DELETE /api/{type}/{ns}/{name}/tag/{name}
    POST   /api/validate-yaml                              always valid (the client posts README.md here)
    GET    /api/agent-harnesses                            empty registry (fetched once per process when telemetry is on)
    GET|HEAD /{ns}/{name}/resolve/{rev}/{path}             file content; Range -> 206; LFS/Xet files: 302 to /cdn
    GET|HEAD /datasets/{ns}/{name}/resolve/{rev}/{path}
    GET|HEAD /cdn/{sha256}?expires={unix}                  the "CDN" (cdn-lfs / cas-bridge): Range -> 206; 403 once expired
    GET    /api/{type}/{ns}/{name}/xet-read-token/{rev}    Xet CAS url + access token, in X-Xet-* headers (and JSON)
    GET    /cas/v2/reconstructions/{xet_hash}              the Xet CAS (tests/support/xetcas.py); Range -> part of the file
    GET    /cas/xorbs/{sha256}/{k}                         a xorb's framed chunks ("presigned": no token); Range -> 206
    POST   /v1/telemetry                                   hf_xet's transfer telemetry; accepted and dropped

Behaviour worth knowing:

* Storage is a directory: ``blobs/<sha256>`` holds each content once; ``repos/<type>/<ns>/<name>/``
  holds ``repo.json`` (privacy, branches, tags) and ``commits/<id>.json``, each an immutable snapshot
  ``{path: sha256}``. A new repo gets an initial commit with a ``.gitattributes``, as on the Hub.
  Commit ids are sha1 of (repo, sequence number, parent, files, title): 40 hex, never reused.
* A file is a regular git file unless it was seeded as LFS or Xet (``seed(..., storage=...)``):
  a regular file's oid (tree ``oid``, ``blobId``, ``ETag``) is the git blob sha1 of its content,
  which is also what the client compares to skip unchanged uploads. An LFS file is listed as the
  Hub lists one (``lfs: {oid: sha256, size, pointerSize}``, its oid the git sha1 of its pointer
  file) and its resolve URL answers 302 to the CDN route with ``X-Linked-Etag`` (the sha256) and
  ``X-Linked-Size``, on another origin (``localhost`` instead of ``127.0.0.1``, same port) so the
  client treats it as off-Hub, as it does cdn-lfs.hf.co. A Xet file is an LFS file that also has a
  ``xetHash`` in listings and ``X-Xet-Hash`` + a ``Link: <...xet-read-token...>; rel="xet-auth"``
  header on resolve, as on the Hub; ``hf_xet`` then downloads it from the CAS routes. Uploads are
  always regular (preupload says so), so LFS and Xet files only come from ``seed``.
* URLs the server hands out (CDN, CAS, xorbs) are built from the request's ``Host`` header, so a
  client that talks through a relay (tests/support/throttle.py) keeps talking through it.
* Auth: ``Authorization: Bearer <token>``. Private repos and all writes need the token; a wrong
  token gets 401 "Invalid credentials in Authorization header" on any route. Any namespace may be
  written with the token. The token is never logged (request logging is off).
* Errors carry ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound) and
  ``X-Error-Message`` so the client raises its typed errors. A missing or hidden repo answers 401
  without a token and 404 with one.
* Not implemented: pull requests (``create_pr`` is refused with 400), LFS/Xet uploads, Spaces,
  pagination (every listing is one page), ``expand`` on tree/paths-info.

Knobs for tests: ``fail_next(n, status, path_prefix)`` answers the next n matching requests with
that status; ``truncate_next_download(after_bytes)`` cuts the next file body short (the client then
resumes with a Range request); ``set_offline(True)`` closes the listening socket and every open
connection so the client gets connection errors, as with no network, and ``set_offline(False)``
listens again on the same port; ``counts`` counts requests per route name (``repo_info``,
``resolve_head``, ``resolve_get``, ``cdn_get``, ``xorb_get``, ``tree``, ...) and ``log`` records each
one; ``bytes_served`` counts the body bytes sent per route (what a download really cost).
``corrupt_next_download(at)`` flips one byte of the next file body; ``cdn_ttl_s`` is how long a
CDN URL stays valid (an hour, as a presigned URL might; tests shorten it). To arrange a test
without HTTP, ``seed(repo_id, {path: bytes}, storage="regular"|"lfs"|"xet")`` commits files
directly, ``seed_sparse(repo_id, path, size)`` commits a sparse LFS file of zeros of any size
(its sha256 is declared, not computed: a test never downloads it whole), and
``resolve(repo_id, rev)`` reads a ref.

Point the client at the server with ``client_env(server, home)``: huggingface_hub reads HF_ENDPOINT,
HF_HUB_CACHE, HF_HOME... once, at import, into ``huggingface_hub.constants`` (and the module-level
functions such as ``huggingface_hub.model_info`` are bound to an ``HfApi()`` built at import), so
setting environment variables in a running test is not enough. ``client_env`` sets the variables
(for subprocesses) and patches those import-time copies, and restores both on exit.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.support import xetcas

TEST_TOKEN = "hf_kilnStandInTestTokenNotASecret0000"
TEST_USER = "kiln-test"

_REPO_TYPES = {"models": "model", "datasets": "dataset"}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_CHUNK = 1024 * 1024
# What the Hub puts in a new repo's first commit (shortened: the Hub lists many more patterns).
_GITATTRIBUTES = (
    b"*.bin filter=lfs diff=lfs merge=lfs -text\n"
    b"*.gguf filter=lfs diff=lfs merge=lfs -text\n"
    b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
)


# ----------------------------------------------------------------------------- storage


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


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


class _Store:
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
                    oid = _sha1(b"blob %d\0" % len(self.pointer(sha)) + self.pointer(sha))
                elif oid is None:
                    digest = hashlib.sha1(b"blob %d\0" % self.blob_size(sha))
                    with self.blob_path(sha).open("rb") as f:
                        for chunk in iter(lambda: f.read(_CHUNK), b""):
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
            files = {".gitattributes": self.put_blob(_GITATTRIBUTES)}
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
        if _COMMIT_RE.fullmatch(rev) and (self._dir(key) / "commits" / f"{rev}.json").is_file():
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
        cid = _sha1(ident.encode())
        record = {"id": cid, "parent": parent, "files": files, "title": title, "message": message, "date": _now()}
        path = self._dir(key) / "commits" / f"{cid}.json"
        path.with_suffix(".tmp").write_text(json.dumps(record, sort_keys=True))
        os.replace(path.with_suffix(".tmp"), path)  # readers may look a commit up by id at any time
        return cid


# ----------------------------------------------------------------------------- HTTP plumbing


class _HubError(Exception):
    """An error answer in the Hub's shape: JSON body plus X-Error-Code / X-Error-Message."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers = headers or {}
        self.extra = extra or {}  # more fields for the JSON body

    def response(self) -> _Response:
        headers = {"Content-Type": "application/json", "X-Error-Message": self.message, **self.headers}
        if self.code:
            headers["X-Error-Code"] = self.code
        return _Response(self.status, headers, json.dumps({"error": self.message, **self.extra}).encode())


@dataclass
class _Response:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    file: Path | None = None  # when set, send `length` bytes of it from `start` instead of body
    start: int = 0
    length: int = 0
    chunks: Callable[[], Iterator[bytes]] | None = None  # or `length` bytes generated by this

    @property
    def streamed(self) -> bool:
        return self.file is not None or self.chunks is not None


def _json(data: Any, status: int = 200) -> _Response:
    return _Response(status, {"Content-Type": "application/json"}, json.dumps(data).encode())


@dataclass
class _Request:
    method: str
    path: str  # decoded, for prefixes and the log
    segs: list[str]
    query: dict[str, list[str]]
    headers: Message
    body: bytes

    def json(self) -> dict[str, Any]:
        try:
            data = json.loads(self.body or b"{}")
        except ValueError:
            raise _HubError(400, "Request body is not valid JSON") from None
        if not isinstance(data, dict):
            raise _HubError(400, "Request body must be a JSON object")
        return data

    def flag(self, name: str) -> bool:
        value = self.query.get(name, [""])[-1].lower()
        return value not in ("", "0", "false")


@dataclass(frozen=True)
class RequestRecord:
    """One request as the server saw it (never the Authorization header)."""

    method: str
    path: str
    route: str
    status: int
    range: str | None


@dataclass
class _Failure:
    remaining: int
    status: int
    path_prefix: str | None


# Routes that are the client's own housekeeping, not Hub traffic: never failed on purpose.
_HOUSEKEEPING = {"agent_harnesses"}


# ----------------------------------------------------------------------------- the Hub API


class _Api:
    """Maps requests to answers. Stateless apart from the store; the server owns the knobs."""

    def __init__(self, store: _Store, base_url: Callable[[], str], token: str, user: str) -> None:
        self.store = store
        self.base_url = base_url
        self.token = token
        self.user = user
        # The short-lived token the Hub hands out for its Xet CAS (never the Hub token itself).
        self.xet_token = "xet_" + hashlib.sha256(b"kiln-standin-xet-token:" + token.encode()).hexdigest()[:32]
        self.cdn_ttl_s = 3600.0

    # -- routing

    def route(self, req: _Request) -> tuple[str, Callable[[], _Response]]:
        s, m = req.segs, req.method
        if s[:1] == ["api"]:
            return self._route_api(req)
        if s[:1] == ["datasets"] and len(s) >= 6 and s[3] == "resolve" and m in ("GET", "HEAD"):
            key = RepoKey("dataset", f"{s[1]}/{s[2]}")
            return self._resolve_route(req, key, s[4], "/".join(s[5:]))
        if len(s) >= 5 and s[2] == "resolve" and m in ("GET", "HEAD"):
            key = RepoKey("model", f"{s[0]}/{s[1]}")
            return self._resolve_route(req, key, s[3], "/".join(s[4:]))
        if len(s) == 2 and s[0] == "cdn" and m in ("GET", "HEAD"):
            return ("cdn_head" if m == "HEAD" else "cdn_get"), lambda: self.cdn_file(req, s[1])
        if s[:3] == ["cas", "v2", "reconstructions"] and len(s) == 4 and m == "GET":
            return "reconstruction", lambda: self.reconstruction(req, s[3])
        if s[:2] == ["cas", "xorbs"] and len(s) == 4 and m == "GET":
            return "xorb_get", lambda: self.xorb(req, s[2], s[3])
        if s == ["v1", "telemetry"] and m == "POST":
            return "xet_telemetry", lambda: _json({})
        return "unknown", lambda: self._unknown(req)

    def _resolve_route(self, req: _Request, key: RepoKey, rev: str, path: str) -> tuple[str, Callable[[], _Response]]:
        route = "resolve_head" if req.method == "HEAD" else "resolve_get"
        return route, lambda: self.resolve_file(req, key, rev, path)

    def _route_api(self, req: _Request) -> tuple[str, Callable[[], _Response]]:
        rest, m = req.segs[1:], req.method
        fixed: dict[tuple[str, str], tuple[str, Callable[[], _Response]]] = {
            ("GET", "whoami-v2"): ("whoami", lambda: self.whoami(req)),
            ("GET", "agent-harnesses"): ("agent_harnesses", lambda: _json({"standardEnvVars": [], "harnesses": {}})),
            ("POST", "validate-yaml"): ("validate_yaml", lambda: _json({"errors": [], "warnings": []})),
            ("POST", "repos/create"): ("create_repo", lambda: self.create_repo(req)),
            ("DELETE", "repos/delete"): ("delete_repo", lambda: self.delete_repo(req)),
        }
        if (m, "/".join(rest)) in fixed:
            return fixed[(m, "/".join(rest))]
        if len(rest) < 3 or rest[0] not in _REPO_TYPES:
            return "unknown", lambda: self._unknown(req)
        key = RepoKey(_REPO_TYPES[rest[0]], f"{rest[1]}/{rest[2]}")
        tail = rest[3:]
        op, arg = (tail[0] if tail else ""), "/".join(tail[1:])
        # tree/{rev}/{path}: the client sends rev as one encoded segment, the path after it.
        tree_rev, tree_path = (tail[1] if len(tail) > 1 else ""), "/".join(tail[2:])
        table: dict[tuple[str, str], tuple[str, Callable[[], _Response]]] = {
            ("GET", ""): ("repo_info", lambda: self.repo_info(req, key, "main")),
            ("GET", "revision"): ("repo_info", lambda: self.repo_info(req, key, arg)),
            ("GET", "refs"): ("refs", lambda: self.refs(req, key)),
            ("GET", "tree"): ("tree", lambda: self.tree(req, key, tree_rev, tree_path)),
            ("GET", "commits"): ("commits", lambda: self.commits(req, key, arg or "main")),
            ("GET", "xet-read-token"): ("xet_read_token", lambda: self.xet_read_token(req, key, arg)),
            ("POST", "paths-info"): ("paths_info", lambda: self.paths_info(req, key, arg)),
            ("POST", "preupload"): ("preupload", lambda: self.preupload(req, key, arg)),
            ("POST", "commit"): ("commit", lambda: self.commit(req, key, arg)),
            ("POST", "branch"): ("branch_create", lambda: self.create_branch(req, key, arg)),
            ("DELETE", "branch"): ("branch_delete", lambda: self.delete_ref(req, key, "branches", arg)),
            ("POST", "tag"): ("tag_create", lambda: self.create_tag(req, key, arg)),
            ("DELETE", "tag"): ("tag_delete", lambda: self.delete_ref(req, key, "tags", arg)),
        }
        if (m, op) in table and (op != "" or not tail):
            return table[(m, op)]
        return "unknown", lambda: self._unknown(req)

    def _unknown(self, req: _Request) -> _Response:
        raise _HubError(404, f"Not implemented by the Hub stand-in: {req.method} {req.path}")

    # -- auth and lookups

    def user_of(self, req: _Request) -> str | None:
        """The caller's user name, None if anonymous; a wrong token is refused outright."""
        auth = req.headers.get("Authorization")
        if auth is None:
            return None
        if auth != f"Bearer {self.token}":
            raise _HubError(401, "Invalid credentials in Authorization header")
        return self.user

    def _readable(self, req: _Request, key: RepoKey) -> dict[str, Any]:
        user = self.user_of(req)
        meta = self.store.repo(key) if self._valid_id(key.id) else None
        if meta is None or (meta["private"] and user is None):
            # The Hub hides private repos: same answer as a missing one.
            raise _HubError(401 if user is None else 404, "Repository not found", "RepoNotFound")
        return meta

    def _writable(self, req: _Request, key: RepoKey) -> dict[str, Any]:
        if self.user_of(req) is None:
            raise _HubError(401, "You must be authenticated to write to a repo")
        return self._readable(req, key)

    def _commit_of(self, key: RepoKey, rev: str) -> str:
        cid = self.store.resolve(key, rev)
        if cid is None:
            raise _HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return cid

    @staticmethod
    def _valid_id(repo_id: str) -> bool:
        parts = repo_id.split("/")
        return len(parts) == 2 and all(_NAME_RE.fullmatch(p) and ".." not in p for p in parts)

    # -- account and repos

    def whoami(self, req: _Request) -> _Response:
        if self.user_of(req) is None:
            raise _HubError(401, "Invalid username or password.")
        access = {"displayName": "kiln-tests", "role": "write"}
        return _json({"type": "user", "id": "0" * 24, "name": self.user, "fullname": "Kiln Tests", "orgs": [],
                      "auth": {"type": "access_token", "accessToken": access}})

    def _key_from_body(self, body: dict[str, Any]) -> RepoKey:
        name, org = body.get("name"), body.get("organization") or self.user
        repo_type = body.get("type") or "model"
        if repo_type not in ("model", "dataset"):
            raise _HubError(400, f"The Hub stand-in only serves model and dataset repos, not {repo_type!r}")
        key = RepoKey(repo_type, f"{org}/{name}")
        if not isinstance(name, str) or not self._valid_id(key.id):
            raise _HubError(400, f"Invalid repo name: {key.id!r}")
        return key

    def create_repo(self, req: _Request) -> _Response:
        if self.user_of(req) is None:
            raise _HubError(401, "You must be authenticated to create a repo")
        body = req.json()
        key = self._key_from_body(body)
        private = body.get("visibility") == "private" or body.get("private") is True
        url = f"{self.base_url()}/{key.url_path}"
        if not self.store.create_repo(key, private):
            # The client reads "url" from this 409 body when exist_ok=True.
            raise _HubError(409, f"You already created this {key.type} repo", extra={"url": url})
        return _json({"url": url, "name": key.id, "id": key.id})

    def delete_repo(self, req: _Request) -> _Response:
        key = self._key_from_body(req.json())
        self._writable(req, key)
        self.store.delete_repo(key)
        return _json({})

    def repo_info(self, req: _Request, key: RepoKey, rev: str) -> _Response:
        meta = self._readable(req, key)
        cid = self._commit_of(key, rev)
        commit = self.store.commit(key, cid)
        with_blobs = req.flag("blobs")
        siblings = [self._sibling(path, sha, with_blobs) for path, sha in sorted(commit["files"].items())]
        info: dict[str, Any] = {
            "_id": _sha1(f"{key.type}/{key.id}".encode())[:24], "id": key.id, "author": key.id.split("/")[0],
            "sha": cid, "lastModified": commit["date"], "createdAt": meta["createdAt"], "private": meta["private"],
            "disabled": False, "gated": False, "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
            "usedStorage": sum(self.store.blob_size(sha) for sha in set(commit["files"].values())),
        }
        if key.type == "model":
            info["modelId"] = key.id
        expand = req.query.get("expand", []) + req.query.get("expand[]", [])
        if expand:  # only the asked-for properties, as the Hub does
            info = {k: v for k, v in info.items() if k in ("_id", "id", *expand)}
        return _json(info)

    def _sibling(self, path: str, sha: str, with_blobs: bool) -> dict[str, Any]:
        if not with_blobs:
            return {"rfilename": path}
        entry = {"rfilename": path, "size": self.store.blob_size(sha), "blobId": self.store.blob_oid(sha)}
        if sha in self.store.kinds:
            entry["lfs"] = {"sha256": sha, "size": self.store.blob_size(sha),
                            "pointerSize": len(self.store.pointer(sha))}
        return entry

    def refs(self, req: _Request, key: RepoKey) -> _Response:
        self._readable(req, key)
        branches, tags = self.store.refs(key)

        def items(refs: dict[str, str], prefix: str) -> list[dict[str, str]]:
            return [{"name": n, "ref": f"{prefix}{n}", "targetCommit": c} for n, c in sorted(refs.items())]

        return _json({"branches": items(branches, "refs/heads/"), "tags": items(tags, "refs/tags/"),
                      "converts": [], "pullRequests": []})

    def commits(self, req: _Request, key: RepoKey, rev: str) -> _Response:
        self._readable(req, key)
        cid: str | None = self._commit_of(key, rev)
        history = []
        while cid is not None:
            commit = self.store.commit(key, cid)
            history.append({"id": cid, "title": commit["title"], "message": commit["message"],
                            "date": commit["date"], "authors": [{"user": self.user}]})
            cid = commit["parent"]
        return _json(history)

    # -- listings

    def _file_entry(self, path: str, sha: str) -> dict[str, Any]:
        entry = {"type": "file", "path": path, "size": self.store.blob_size(sha), "oid": self.store.blob_oid(sha)}
        kind = self.store.kinds.get(sha)
        if kind:
            entry["lfs"] = {"oid": sha, "size": self.store.blob_size(sha), "pointerSize": len(self.store.pointer(sha))}
        if kind == "xet":
            entry["xetHash"] = xetcas.file_hash(sha)
        return entry

    def _dir_entry(self, files: dict[str, str], path: str) -> dict[str, Any]:
        inside = sorted((p, self.store.blob_oid(s)) for p, s in files.items() if p.startswith(path + "/"))
        return {"type": "directory", "path": path, "size": 0, "oid": _sha1(json.dumps(inside).encode())}

    def tree(self, req: _Request, key: RepoKey, rev: str, path: str) -> _Response:
        self._readable(req, key)
        files = self.store.commit(key, self._commit_of(key, rev))["files"]
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        under = {p: s for p, s in files.items() if p.startswith(prefix)}
        if prefix and not under:
            raise _HubError(404, f"{path} does not exist on {rev}", "EntryNotFound")
        recursive = req.flag("recursive")
        dirs: set[str] = set()
        entries = []
        for p, sha in under.items():
            parts = p[len(prefix):].split("/")
            depth = len(parts) - 1 if recursive else min(1, len(parts) - 1)
            dirs.update(prefix + "/".join(parts[: i + 1]) for i in range(depth))
            if recursive or len(parts) == 1:
                entries.append(self._file_entry(p, sha))
        entries += [self._dir_entry(files, d) for d in dirs]
        return _json(sorted(entries, key=lambda e: e["path"]))

    def paths_info(self, req: _Request, key: RepoKey, rev: str) -> _Response:
        self._readable(req, key)
        files = self.store.commit(key, self._commit_of(key, rev))["files"]
        if "json" in req.headers.get("Content-Type", ""):
            paths = req.json().get("paths", [])
        else:  # the client posts a form: paths=a&paths=b&expand=false
            paths = parse_qs(req.body.decode()).get("paths", [])
        entries = []
        for path in paths:
            path = path.strip("/")
            if path in files:
                entries.append(self._file_entry(path, files[path]))
            elif any(p.startswith(path + "/") for p in files):
                entries.append(self._dir_entry(files, path))
        return _json(entries)

    # -- writes

    def preupload(self, req: _Request, key: RepoKey, rev: str) -> _Response:
        self._writable(req, key)
        current = self.store.commit(key, self._commit_of(key, rev))["files"]
        answer = []
        for item in req.json().get("files", []):
            sha = current.get(item.get("path"))
            # "regular" for everything keeps LFS and Xet out; oid lets the client skip unchanged files.
            answer.append({"path": item.get("path"), "uploadMode": "regular", "shouldIgnore": False,
                           "oid": self.store.blob_oid(sha) if sha else None})
        return _json({"files": answer, "commitOid": self.store.resolve(key, rev)})

    def commit(self, req: _Request, key: RepoKey, branch: str) -> _Response:
        self._writable(req, key)
        if req.flag("create_pr"):
            raise _HubError(400, "The Hub stand-in does not implement pull requests (create_pr)")
        header, ops = self._parse_ndjson(req.body)
        with self.store.lock:
            branches, _ = self.store.refs(key)
            if branch not in branches:
                raise _HubError(404, f"Invalid rev id: {branch} is not a branch", "RevisionNotFound")
            head = branches[branch]
            parent = header.get("parentCommit")
            if parent and not head.startswith(parent):
                raise _HubError(412, "A commit has happened since. Please refresh and try again.")
            files = dict(self.store.commit(key, head)["files"])
            for kind, value in ops:
                self._apply(files, kind, value)
            title = header.get("summary") or "Update files"
            cid = self.store.add_commit(key, branch, files, title, header.get("description") or "")
        url = f"{self.base_url()}/{key.url_path}/commit/{cid}"
        return _json({"success": True, "commitOid": cid, "commitUrl": url, "hookOutput": ""})

    @staticmethod
    def _parse_ndjson(body: bytes) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
        header: dict[str, Any] = {}
        ops = []
        for line in body.splitlines():
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                kind, value = item["key"], item["value"]
            except (ValueError, KeyError, TypeError):
                raise _HubError(400, "Malformed NDJSON commit payload") from None
            if kind == "header":
                header = value
            else:
                ops.append((kind, value))
        return header, ops

    def _apply(self, files: dict[str, str], kind: str, value: dict[str, Any]) -> None:
        path = _clean_path(value.get("path", ""), folder=kind == "deletedFolder")
        if kind == "file":
            if value.get("encoding", "base64") != "base64":
                raise _HubError(400, f"Unsupported encoding for {path}")
            files[path] = self.store.put_blob(base64.b64decode(value.get("content", "")))
        elif kind == "lfsFile":
            # Only a blob we already hold can be referenced (e.g. a copy): we never take LFS uploads.
            if not self.store.has_blob(value.get("oid", "")):
                raise _HubError(400, f"Unknown LFS object for {path}: the stand-in only accepts regular uploads")
            files[path] = value["oid"]
        elif kind == "deletedFile":
            if files.pop(path, None) is None:
                raise _HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
        elif kind == "deletedFolder":
            doomed = [p for p in files if p.startswith(path + "/")]
            if not doomed:
                raise _HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
            for p in doomed:
                del files[p]
        else:
            raise _HubError(400, f"Unsupported commit operation: {kind}")

    def create_branch(self, req: _Request, key: RepoKey, name: str) -> _Response:
        self._writable(req, key)
        start = req.json().get("startingPoint") or "main"
        with self.store.lock:
            cid = self._commit_of(key, start)
            branches, _ = self.store.refs(key)
            if not name or _COMMIT_RE.fullmatch(name):
                raise _HubError(400, f"Invalid branch name: {name!r}")
            if name in branches:
                raise _HubError(409, f"Reference already exists: refs/heads/{name}")
            self.store.set_ref(key, "branches", name, cid)
        return _json({})

    def create_tag(self, req: _Request, key: RepoKey, rev: str) -> _Response:
        self._writable(req, key)
        name = req.json().get("tag")
        if not isinstance(name, str) or not name:
            raise _HubError(400, "Missing tag name")
        with self.store.lock:
            cid = self._commit_of(key, rev)
            _, tags = self.store.refs(key)
            if name in tags:
                raise _HubError(409, f"Tag already exists: {name}")
            self.store.set_ref(key, "tags", name, cid)
        return _json({})

    def delete_ref(self, req: _Request, key: RepoKey, kind: str, name: str) -> _Response:
        self._writable(req, key)
        if kind == "branches" and name == "main":
            raise _HubError(403, "You cannot delete the default branch")
        with self.store.lock:
            branches, tags = self.store.refs(key)
            if name not in (branches if kind == "branches" else tags):
                raise _HubError(404, f"Invalid rev id: {name}", "RevisionNotFound")
            self.store.set_ref(key, kind, name, None)
        return _json({})

    # -- downloads

    def resolve_file(self, req: _Request, key: RepoKey, rev: str, path: str) -> _Response:
        self._readable(req, key)
        cid = self._commit_of(key, rev)
        sha = self.store.commit(key, cid)["files"].get(path)
        if sha is None:
            # X-Repo-Commit here lets the client remember the miss in its cache (.no_exist).
            raise _HubError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": cid})
        size = self.store.blob_size(sha)
        headers = {
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "ETag": f'"{self.store.blob_oid(sha)}"',
            "X-Repo-Commit": cid,
        }
        kind = self.store.kinds.get(sha)
        if kind is None:
            return self._file_body(req, sha, headers)
        # LFS and Xet content lives on the CDN: the Hub answers with where, and what (the sha256, the size).
        expires = int(time.time() + self.cdn_ttl_s)
        headers.update({"Location": f"{_cdn_origin(req)}/cdn/{sha}?expires={expires}",
                        "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(size)})
        if kind == "xet":
            refresh = f"{_origin(req)}/api/{key.type}s/{key.id}/xet-read-token/{cid}"
            headers.update({"X-Xet-Hash": xetcas.file_hash(sha), "Link": f'<{refresh}>; rel="xet-auth"'})
        return _Response(302, headers)

    def _file_body(self, req: _Request, sha: str, headers: dict[str, str]) -> _Response:
        size = self.store.blob_size(sha)
        span = _parse_range(req.headers.get("Range"), size) if req.method == "GET" else None
        if span is None:
            return _Response(200, headers, file=self.store.blob_path(sha), start=0, length=size)
        start, end = span
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        return _Response(206, headers, file=self.store.blob_path(sha), start=start, length=end - start + 1)

    def cdn_file(self, req: _Request, sha: str) -> _Response:
        """The CDN behind LFS/Xet files: no Hub token, a URL that expires (403 then, as S3/CloudFront do)."""
        if sha not in self.store.kinds or not self.store.has_blob(sha):
            raise _HubError(404, "NoSuchKey")
        try:
            expires = float(req.query.get("expires", ["0"])[0])
        except ValueError:
            expires = 0.0
        if time.time() > expires:
            raise _HubError(403, "Request has expired")
        return self._file_body(req, sha, {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes",
                                          "ETag": f'"{sha}"'})

    # -- Xet

    def xet_read_token(self, req: _Request, key: RepoKey, rev: str) -> _Response:
        """What huggingface_hub's refresh_xet_connection_info reads: the CAS URL and a short-lived token."""
        self._readable(req, key)
        self._commit_of(key, rev)
        exp = int(time.time() + 3600)
        cas = f"{_origin(req)}/cas"
        body = _json({"casUrl": cas, "accessToken": self.xet_token, "exp": exp})
        body.headers.update({"X-Xet-Cas-Url": cas, "X-Xet-Access-Token": self.xet_token,
                             "X-Xet-Token-Expiration": str(exp)})
        return body

    def _xet_blob(self, xet_hash: str) -> str:
        for sha, kind in list(self.store.kinds.items()):
            if kind == "xet" and xetcas.file_hash(sha) == xet_hash:
                return sha
        raise _HubError(404, f"File not found: {xet_hash}")

    def reconstruction(self, req: _Request, xet_hash: str) -> _Response:
        if req.headers.get("Authorization") != f"Bearer {self.xet_token}":
            raise _HubError(401, "Invalid or expired Xet access token")
        sha = self._xet_blob(xet_hash)
        size = self.store.blob_size(sha)
        span = _parse_range(req.headers.get("Range"), size) or (0, size - 1)
        origin = _cdn_origin(req)
        return _json(xetcas.reconstruction(sha, size, span[0], span[1], lambda k: f"{origin}/cas/xorbs/{sha}/{k}"))

    def xorb(self, req: _Request, sha: str, k: str) -> _Response:
        if self.store.kinds.get(sha) != "xet" or not k.isdigit():
            raise _HubError(404, "NoSuchKey")
        size, index = self.store.blob_size(sha), int(k)
        length = xetcas.xorb_length(size, index)
        if length <= 0:
            raise _HubError(404, "NoSuchKey")
        start, end = _parse_range(req.headers.get("Range"), length) or (0, length - 1)
        path = self.store.blob_path(sha)
        return _Response(206, {"Content-Type": "application/octet-stream",
                               "Content-Range": f"bytes {start}-{end}/{length}"},
                         chunks=lambda: xetcas.xorb_bytes(path, size, index, start, end), length=end - start + 1)


def _origin(req: _Request) -> str:
    """The server as this client reached it (through a relay, the relay)."""
    return f"http://{req.headers.get('Host') or '127.0.0.1'}"


def _cdn_origin(req: _Request) -> str:
    """The same server under another origin: huggingface_hub follows a redirect that stays on the Hub's
    origin but stops at one to another (a CDN), exactly what it must see for LFS files."""
    return _origin(req).replace("//127.0.0.1:", "//localhost:", 1)


def _clean_path(path: str, folder: bool = False) -> str:
    """A repo-relative path, refusing anything that could escape or confuse the tree."""
    cleaned = path.strip("/") if folder else path
    parts = cleaned.split("/")
    if not cleaned or cleaned.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise _HubError(400, f"Invalid path in repo: {path!r}")
    return cleaned


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) byte of a single `bytes=` range; None to send the whole file."""
    if not header or not header.startswith("bytes=") or "," in header:
        return None  # no range, or several: a full 200 answer is always allowed
    first, _, last = header[len("bytes="):].strip().partition("-")
    try:
        if first == "":
            start, end = max(size - int(last), 0), size - 1
        else:
            start, end = int(first), (min(int(last), size - 1) if last else size - 1)
    except ValueError:
        return None
    if start >= size or start > end:
        raise _HubError(416, "Requested range not satisfiable", headers={"Content-Range": f"bytes */{size}"})
    return start, end


# ----------------------------------------------------------------------------- the server


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # so set_offline(False) can listen on the same port again
    request_queue_size = 128  # a parallel downloader opens dozens of connections at once (the default is 5)

    def __init__(self, port: int, hub: HubServer) -> None:
        self.hub = hub
        super().__init__(("127.0.0.1", port), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):   # a client that hung up is no server error
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like the real Hub; every answer has a Content-Length
    server_version = "kiln-hub-standin"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.hub._track(self.connection, True)

    def finish(self) -> None:
        self.server.hub._track(self.connection, False)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # quiet tests, and nothing that could ever include a token

    def do_GET(self) -> None:
        self._handle()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_GET

    def _handle(self) -> None:
        hub = self.server.hub
        body = self._read_body()
        split = urlsplit(self.path)
        raw = split.path.strip("/")
        segs = [unquote(s) for s in raw.split("/")] if raw else []
        req = _Request(self.command, unquote(split.path), segs, parse_qs(split.query), self.headers, body)
        route, resp, cut, flip = hub._answer(req)
        try:
            self._send(route, resp, cut, flip)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away mid-answer; nothing to tell it

    def _read_body(self) -> bytes:
        # Always drain the body, even for answers that ignore it: keep-alive needs the stream aligned.
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes:
        parts = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline().strip():  # trailers
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()

    def _send(self, route: str, resp: _Response, cut_after: int | None, flip_at: int | None) -> None:
        self.send_response(resp.status)
        for name, value in resp.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(resp.length if resp.streamed else len(resp.body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if not resp.streamed:
            self.wfile.write(resp.body)
            return
        remaining = resp.length if cut_after is None else min(cut_after, resp.length)
        sent = 0
        for chunk in self._body(resp):
            chunk = chunk[:remaining - sent]
            if not chunk:
                break
            if flip_at is not None and sent <= flip_at < sent + len(chunk):
                i = flip_at - sent   # one wrong byte on the wire: what only a content hash can catch
                chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1:]
            self.wfile.write(chunk)
            sent += len(chunk)
            self.server.hub._served(route, len(chunk))
        if cut_after is not None:
            # Hang up with the body short of its Content-Length: the client sees a broken transfer.
            self.close_connection = True

    @staticmethod
    def _body(resp: _Response) -> Iterator[bytes]:
        if resp.chunks is not None:
            yield from resp.chunks()
            return
        assert resp.file is not None
        with resp.file.open("rb") as f:
            f.seek(resp.start)
            left = resp.length
            while left > 0:
                chunk = f.read(min(_CHUNK, left))
                if not chunk:
                    return
                left -= len(chunk)
                yield chunk


class HubServer:
    """The huggingface.co stand-in: ``with HubServer(tmp_path) as hub: ...`` then use ``hub.url``."""

    def __init__(self, root: str | Path | None = None, *, token: str = TEST_TOKEN, user: str = TEST_USER) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if root is None:  # no directory given: a temporary one, removed by stop()
            self._tmp = tempfile.TemporaryDirectory(prefix="hubserver-")
            root = self._tmp.name
        self.root = Path(root)
        self.token = token
        self.user = user
        self.store = _Store(self.root)
        self._api = _Api(self.store, lambda: self.url, token, user)
        self._lock = threading.Lock()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port = 0
        self._conns: set[socket.socket] = set()
        self._failures: list[_Failure] = []
        self._truncations: list[int] = []
        self._corruptions: list[int] = []
        self.counts: Counter[str] = Counter()
        self.bytes_served: Counter[str] = Counter()
        self.log: list[RequestRecord] = []

    # -- lifecycle

    @property
    def url(self) -> str:
        if not self._port:
            raise RuntimeError("HubServer is not started")
        return f"http://127.0.0.1:{self._port}"

    @property
    def offline(self) -> bool:
        return self._port != 0 and self._httpd is None

    def start(self) -> HubServer:
        """Listen on 127.0.0.1 (a free port the first time, the same port after set_offline)."""
        if self._httpd is None:
            self._httpd = _HTTPServer(self._port, self)
            self._port = self._httpd.server_address[1]
            # A short poll interval: shutdown() waits up to one interval, on every stop or offline switch.
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="hubserver", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and drop connections; the store stays on disk (a temp one is removed)."""
        self._close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def set_offline(self, offline: bool) -> None:
        """Offline: connections are refused and open ones cut, like a lost network. Online: listen again."""
        if offline:
            self._close()
        else:
            self.start()

    def _close(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # keep-alive connections would otherwise keep serving
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- knobs for tests

    def fail_next(self, n: int = 1, status: int = 503, path_prefix: str | None = None) -> None:
        """Answer the next `n` requests (whose decoded path starts with `path_prefix`) with `status`."""
        with self._lock:
            self._failures.append(_Failure(n, status, path_prefix))

    def truncate_next_download(self, after_bytes: int) -> None:
        """Cut the next file download after `after_bytes` bytes of body, then hang up."""
        with self._lock:
            self._truncations.append(after_bytes)

    def corrupt_next_download(self, at: int = 0) -> None:
        """Flip the byte at offset `at` of the next file body sent (any file route, ranged or not)."""
        with self._lock:
            self._corruptions.append(at)

    @property
    def cdn_ttl_s(self) -> float:
        """How long a CDN URL handed out by resolve stays valid."""
        return self._api.cdn_ttl_s

    @cdn_ttl_s.setter
    def cdn_ttl_s(self, value: float) -> None:
        self._api.cdn_ttl_s = value

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()
            self.bytes_served.clear()
            self.log.clear()

    # -- direct access, for arranging tests without HTTP

    def seed(
        self,
        repo_id: str,
        files: Mapping[str, bytes],
        *,
        repo_type: str = "model",
        branch: str = "main",
        private: bool = False,
        message: str = "seed",
        storage: str = "regular",
    ) -> str:
        """Create the repo if needed and commit `files` on top of `branch` (made from main if new),
        stored as regular git files, LFS files or Xet files (`storage`)."""
        return self._commit(repo_id, {p: self.store.put_blob(d, storage) for p, d in files.items()},
                            repo_type, branch, private, message)

    def seed_sparse(self, repo_id: str, path: str, size: int, **kw: Any) -> str:
        """Commit a sparse LFS file of `size` zero bytes (any size: it takes no disk). Its sha256 in
        listings is a declared name, not the content's hash: for a test that never downloads it whole."""
        return self._commit(repo_id, {path: self.store.put_sparse(size)}, kw.get("repo_type", "model"),
                            kw.get("branch", "main"), kw.get("private", False), kw.get("message", "seed"))

    def _commit(self, repo_id: str, blobs: Mapping[str, str], repo_type: str, branch: str, private: bool,
                message: str) -> str:
        key = RepoKey(repo_type, repo_id)
        if not _Api._valid_id(repo_id):
            raise ValueError(f"invalid repo id {repo_id!r}")
        with self.store.lock:
            self.store.create_repo(key, private)  # no-op if it exists
            branches, _ = self.store.refs(key)
            if branch not in branches:
                self.store.set_ref(key, "branches", branch, branches["main"])
            current = dict(self.store.commit(key, self.store.refs(key)[0][branch])["files"])
            current.update({_clean_path(p): sha for p, sha in blobs.items()})
            return self.store.add_commit(key, branch, current, message, "")

    def resolve(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> str | None:
        """Commit id that `revision` names in the repo, or None."""
        return self.store.resolve(RepoKey(repo_type, repo_id), revision)

    # -- called by request threads

    def _track(self, conn: socket.socket, open_: bool) -> None:
        with self._lock:
            (self._conns.add if open_ else self._conns.discard)(conn)

    def _answer(self, req: _Request) -> tuple[str, _Response, int | None, int | None]:
        route, action = self._api.route(req)
        resp = self._injected_failure(req, route)
        if resp is None:
            try:
                resp = action()
            except _HubError as err:
                resp = err.response()
        cut = flip = None
        with self._lock:
            if req.method == "GET" and resp.streamed and self._truncations:
                cut = self._truncations.pop(0)
            if req.method == "GET" and resp.streamed and self._corruptions:
                flip = self._corruptions.pop(0)
            # Recorded before the answer goes out, so a test that got its answer sees the count.
            self.counts[route] += 1
            self.log.append(RequestRecord(req.method, req.path, route, resp.status, req.headers.get("Range")))
        return route, resp, cut, flip

    def _served(self, route: str, n: int) -> None:
        with self._lock:
            self.bytes_served[route] += n

    def _injected_failure(self, req: _Request, route: str) -> _Response | None:
        if route in _HOUSEKEEPING:
            return None
        with self._lock:
            for failure in self._failures:
                if failure.remaining > 0 and req.path.startswith(failure.path_prefix or ""):
                    failure.remaining -= 1
                    status = failure.status
                    break
            else:
                return None
        return _HubError(status, f"Injected failure ({status}) from the Hub stand-in").response()


# ----------------------------------------------------------------------------- pointing the client


@dataclass(frozen=True)
class ClientEnv:
    """Where client_env pointed huggingface_hub: `env` holds the variables, for subprocesses."""

    endpoint: str
    home: Path
    cache_dir: Path
    token: str | None
    env: dict[str, str]


@contextmanager
def client_env(server: HubServer, home: str | Path, *, token: bool = True) -> Iterator[ClientEnv]:
    """Point huggingface_hub (this process and children) at `server`, with HF_HOME under `home`.

    Sets HF_ENDPOINT, HF_HOME, HF_HUB_CACHE (home/hub), HF_XET_CACHE, HF_TOKEN (the server's token,
    unless token=False) and disables telemetry/offline mode; then patches the copies huggingface_hub
    made at import: constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE (hf_hub_download builds
    URLs from it), the cache/token/home paths, and the endpoint of the module-level HfApi behind
    huggingface_hub.model_info & co. Everything is restored on exit.
    """
    import huggingface_hub.constants as constants
    import huggingface_hub.hf_api as hf_api

    home = Path(home)
    cache = home / "hub"
    cache.mkdir(parents=True, exist_ok=True)
    env = {
        "HF_ENDPOINT": server.url,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(cache),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    if token:
        env["HF_TOKEN"] = server.token
    dropped = [] if token else ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"]

    patches: list[tuple[Any, str, Any]] = [
        (constants, "ENDPOINT", server.url),
        (constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.url + "/{repo_id}/resolve/{revision}/{filename}"),
        (constants, "HF_HOME", str(home)),
        (constants, "HF_HUB_CACHE", str(cache)),
        (constants, "HF_XET_CACHE", str(home / "xet")),
        (constants, "HF_TOKEN_PATH", str(home / "token")),
        (constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens")),
        (constants, "AGENT_HARNESSES_PATH", str(home / ".agent_harnesses.json")),
        (constants, "HF_HUB_OFFLINE", False),
        (constants, "HF_HUB_DISABLE_TELEMETRY", True),
        (hf_api.api, "endpoint", server.url),
    ]
    try:
        import huggingface_hub.utils._cache_manager as cache_manager  # scan_cache_dir()'s default

        patches.append((cache_manager, "HF_HUB_CACHE", str(cache)))
    except ImportError:
        pass
    # Only what this client version has: older and newer ones lack some of these names.
    patches = [(obj, name, value) for obj, name, value in patches if hasattr(obj, name)]

    saved_env = {name: os.environ.get(name) for name in [*env, *dropped]}
    saved_attrs = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for name in dropped:
            os.environ.pop(name, None)
        os.environ.update(env)
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield ClientEnv(server.url, home, cache, server.token if token else None, env)
    finally:
        for obj, name, value in saved_attrs:
            setattr(obj, name, value)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
