"""The Hub stand-in's API: the routes huggingface_hub calls, mapped to answers in the Hub's shape
(see kiln_dev/hub/__init__.py for the list). Requests and answers are plain values; the HTTP layer
(server.py) reads and writes them, the store (store.py) keeps the data."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from .store import COMMIT_RE, RepoKey, Store, sha1

_REPO_TYPES = {"models": "model", "datasets": "dataset"}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def valid_repo_id(repo_id: str) -> bool:
    """A repo id as the Hub takes it: namespace/name, each part a Hub name and no ".." in it."""
    parts = repo_id.split("/")
    return len(parts) == 2 and all(_NAME_RE.fullmatch(p) and ".." not in p for p in parts)


class HubError(Exception):
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

    def response(self) -> Response:
        headers = {"Content-Type": "application/json", "X-Error-Message": self.message, **self.headers}
        if self.code:
            headers["X-Error-Code"] = self.code
        return Response(self.status, headers, json.dumps({"error": self.message, **self.extra}).encode())


@dataclass
class Response:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    file: Path | None = None  # when set, send `length` bytes of it from `start` instead of body
    start: int = 0
    length: int = 0


def _json(data: Any, status: int = 200) -> Response:
    return Response(status, {"Content-Type": "application/json"}, json.dumps(data).encode())


@dataclass
class Request:
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
            raise HubError(400, "Request body is not valid JSON") from None
        if not isinstance(data, dict):
            raise HubError(400, "Request body must be a JSON object")
        return data

    def flag(self, name: str) -> bool:
        value = self.query.get(name, [""])[-1].lower()
        return value not in ("", "0", "false")


# Routes that are the client's own housekeeping, not Hub traffic: never failed on purpose.
HOUSEKEEPING = {"agent_harnesses"}


class Api:
    """Maps requests to answers. Stateless apart from the store; the server owns the knobs."""

    def __init__(self, store: Store, base_url: Callable[[], str], token: str, user: str) -> None:
        self.store = store
        self.base_url = base_url
        self.token = token
        self.user = user

    # -- routing

    def route(self, req: Request) -> tuple[str, Callable[[], Response]]:
        s, m = req.segs, req.method
        if s[:1] == ["api"]:
            return self._route_api(req)
        if s[:1] == ["datasets"] and len(s) >= 6 and s[3] == "resolve" and m in ("GET", "HEAD"):
            key = RepoKey("dataset", f"{s[1]}/{s[2]}")
            return self._resolve_route(req, key, s[4], "/".join(s[5:]))
        if len(s) >= 5 and s[2] == "resolve" and m in ("GET", "HEAD"):
            key = RepoKey("model", f"{s[0]}/{s[1]}")
            return self._resolve_route(req, key, s[3], "/".join(s[4:]))
        return "unknown", lambda: self._unknown(req)

    def _resolve_route(self, req: Request, key: RepoKey, rev: str, path: str) -> tuple[str, Callable[[], Response]]:
        route = "resolve_head" if req.method == "HEAD" else "resolve_get"
        return route, lambda: self.resolve_file(req, key, rev, path)

    def _route_api(self, req: Request) -> tuple[str, Callable[[], Response]]:
        rest, m = req.segs[1:], req.method
        fixed: dict[tuple[str, str], tuple[str, Callable[[], Response]]] = {
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
        table: dict[tuple[str, str], tuple[str, Callable[[], Response]]] = {
            ("GET", ""): ("repo_info", lambda: self.repo_info(req, key, "main")),
            ("GET", "revision"): ("repo_info", lambda: self.repo_info(req, key, arg)),
            ("GET", "refs"): ("refs", lambda: self.refs(req, key)),
            ("GET", "tree"): ("tree", lambda: self.tree(req, key, tree_rev, tree_path)),
            ("GET", "commits"): ("commits", lambda: self.commits(req, key, arg or "main")),
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

    def _unknown(self, req: Request) -> Response:
        raise HubError(404, f"Not implemented by the Hub stand-in: {req.method} {req.path}")

    # -- auth and lookups

    def user_of(self, req: Request) -> str | None:
        """The caller's user name, None if anonymous; a wrong token is refused outright."""
        auth = req.headers.get("Authorization")
        if auth is None:
            return None
        if auth != f"Bearer {self.token}":
            raise HubError(401, "Invalid credentials in Authorization header")
        return self.user

    def _readable(self, req: Request, key: RepoKey) -> dict[str, Any]:
        user = self.user_of(req)
        meta = self.store.repo(key) if valid_repo_id(key.id) else None
        if meta is None or (meta["private"] and user is None):
            # The Hub hides private repos: same answer as a missing one.
            raise HubError(401 if user is None else 404, "Repository not found", "RepoNotFound")
        return meta

    def _writable(self, req: Request, key: RepoKey) -> dict[str, Any]:
        if self.user_of(req) is None:
            raise HubError(401, "You must be authenticated to write to a repo")
        return self._readable(req, key)

    def _commit_of(self, key: RepoKey, rev: str) -> str:
        cid = self.store.resolve(key, rev)
        if cid is None:
            raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return cid

    # -- account and repos

    def whoami(self, req: Request) -> Response:
        if self.user_of(req) is None:
            raise HubError(401, "Invalid username or password.")
        access = {"displayName": "kiln-tests", "role": "write"}
        return _json({"type": "user", "id": "0" * 24, "name": self.user, "fullname": "Kiln Tests", "orgs": [],
                      "auth": {"type": "access_token", "accessToken": access}})

    def _key_from_body(self, body: dict[str, Any]) -> RepoKey:
        name, org = body.get("name"), body.get("organization") or self.user
        repo_type = body.get("type") or "model"
        if repo_type not in ("model", "dataset"):
            raise HubError(400, f"The Hub stand-in only serves model and dataset repos, not {repo_type!r}")
        key = RepoKey(repo_type, f"{org}/{name}")
        if not isinstance(name, str) or not valid_repo_id(key.id):
            raise HubError(400, f"Invalid repo name: {key.id!r}")
        return key

    def create_repo(self, req: Request) -> Response:
        if self.user_of(req) is None:
            raise HubError(401, "You must be authenticated to create a repo")
        body = req.json()
        key = self._key_from_body(body)
        private = body.get("visibility") == "private" or body.get("private") is True
        url = f"{self.base_url()}/{key.url_path}"
        if not self.store.create_repo(key, private):
            # The client reads "url" from this 409 body when exist_ok=True.
            raise HubError(409, f"You already created this {key.type} repo", extra={"url": url})
        return _json({"url": url, "name": key.id, "id": key.id})

    def delete_repo(self, req: Request) -> Response:
        key = self._key_from_body(req.json())
        self._writable(req, key)
        self.store.delete_repo(key)
        return _json({})

    def repo_info(self, req: Request, key: RepoKey, rev: str) -> Response:
        meta = self._readable(req, key)
        cid = self._commit_of(key, rev)
        commit = self.store.commit(key, cid)
        with_blobs = req.flag("blobs")
        siblings = [self._sibling(path, sha, with_blobs) for path, sha in sorted(commit["files"].items())]
        info: dict[str, Any] = {
            "_id": sha1(f"{key.type}/{key.id}".encode())[:24], "id": key.id, "author": key.id.split("/")[0],
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
        return {"rfilename": path, "size": self.store.blob_size(sha), "blobId": self.store.blob_oid(sha)}

    def refs(self, req: Request, key: RepoKey) -> Response:
        self._readable(req, key)
        branches, tags = self.store.refs(key)

        def items(refs: dict[str, str], prefix: str) -> list[dict[str, str]]:
            return [{"name": n, "ref": f"{prefix}{n}", "targetCommit": c} for n, c in sorted(refs.items())]

        return _json({"branches": items(branches, "refs/heads/"), "tags": items(tags, "refs/tags/"),
                      "converts": [], "pullRequests": []})

    def commits(self, req: Request, key: RepoKey, rev: str) -> Response:
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
        return {"type": "file", "path": path, "size": self.store.blob_size(sha), "oid": self.store.blob_oid(sha)}

    def _dir_entry(self, files: dict[str, str], path: str) -> dict[str, Any]:
        inside = sorted((p, self.store.blob_oid(s)) for p, s in files.items() if p.startswith(path + "/"))
        return {"type": "directory", "path": path, "size": 0, "oid": sha1(json.dumps(inside).encode())}

    def tree(self, req: Request, key: RepoKey, rev: str, path: str) -> Response:
        self._readable(req, key)
        files = self.store.commit(key, self._commit_of(key, rev))["files"]
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        under = {p: s for p, s in files.items() if p.startswith(prefix)}
        if prefix and not under:
            raise HubError(404, f"{path} does not exist on {rev}", "EntryNotFound")
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

    def paths_info(self, req: Request, key: RepoKey, rev: str) -> Response:
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

    def preupload(self, req: Request, key: RepoKey, rev: str) -> Response:
        self._writable(req, key)
        current = self.store.commit(key, self._commit_of(key, rev))["files"]
        answer = []
        for item in req.json().get("files", []):
            sha = current.get(item.get("path"))
            # "regular" for everything keeps LFS and Xet out; oid lets the client skip unchanged files.
            answer.append({"path": item.get("path"), "uploadMode": "regular", "shouldIgnore": False,
                           "oid": self.store.blob_oid(sha) if sha else None})
        return _json({"files": answer, "commitOid": self.store.resolve(key, rev)})

    def commit(self, req: Request, key: RepoKey, branch: str) -> Response:
        self._writable(req, key)
        if req.flag("create_pr"):
            raise HubError(400, "The Hub stand-in does not implement pull requests (create_pr)")
        header, ops = self._parse_ndjson(req.body)
        with self.store.lock:
            branches, _ = self.store.refs(key)
            if branch not in branches:
                raise HubError(404, f"Invalid rev id: {branch} is not a branch", "RevisionNotFound")
            head = branches[branch]
            parent = header.get("parentCommit")
            if parent and not head.startswith(parent):
                raise HubError(412, "A commit has happened since. Please refresh and try again.")
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
                raise HubError(400, "Malformed NDJSON commit payload") from None
            if kind == "header":
                header = value
            else:
                ops.append((kind, value))
        return header, ops

    def _apply(self, files: dict[str, str], kind: str, value: dict[str, Any]) -> None:
        path = clean_path(value.get("path", ""), folder=kind == "deletedFolder")
        if kind == "file":
            if value.get("encoding", "base64") != "base64":
                raise HubError(400, f"Unsupported encoding for {path}")
            files[path] = self.store.put_blob(base64.b64decode(value.get("content", "")))
        elif kind == "lfsFile":
            # Only a blob we already hold can be referenced (e.g. a copy): we never take LFS uploads.
            if not self.store.has_blob(value.get("oid", "")):
                raise HubError(400, f"Unknown LFS object for {path}: the stand-in only accepts regular uploads")
            files[path] = value["oid"]
        elif kind == "deletedFile":
            if files.pop(path, None) is None:
                raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
        elif kind == "deletedFolder":
            doomed = [p for p in files if p.startswith(path + "/")]
            if not doomed:
                raise HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
            for p in doomed:
                del files[p]
        else:
            raise HubError(400, f"Unsupported commit operation: {kind}")

    def create_branch(self, req: Request, key: RepoKey, name: str) -> Response:
        self._writable(req, key)
        start = req.json().get("startingPoint") or "main"
        with self.store.lock:
            cid = self._commit_of(key, start)
            branches, _ = self.store.refs(key)
            if not name or COMMIT_RE.fullmatch(name):
                raise HubError(400, f"Invalid branch name: {name!r}")
            if name in branches:
                raise HubError(409, f"Reference already exists: refs/heads/{name}")
            self.store.set_ref(key, "branches", name, cid)
        return _json({})

    def create_tag(self, req: Request, key: RepoKey, rev: str) -> Response:
        self._writable(req, key)
        name = req.json().get("tag")
        if not isinstance(name, str) or not name:
            raise HubError(400, "Missing tag name")
        with self.store.lock:
            cid = self._commit_of(key, rev)
            _, tags = self.store.refs(key)
            if name in tags:
                raise HubError(409, f"Tag already exists: {name}")
            self.store.set_ref(key, "tags", name, cid)
        return _json({})

    def delete_ref(self, req: Request, key: RepoKey, kind: str, name: str) -> Response:
        self._writable(req, key)
        if kind == "branches" and name == "main":
            raise HubError(403, "You cannot delete the default branch")
        with self.store.lock:
            branches, tags = self.store.refs(key)
            if name not in (branches if kind == "branches" else tags):
                raise HubError(404, f"Invalid rev id: {name}", "RevisionNotFound")
            self.store.set_ref(key, kind, name, None)
        return _json({})

    # -- downloads

    def resolve_file(self, req: Request, key: RepoKey, rev: str, path: str) -> Response:
        self._readable(req, key)
        cid = self._commit_of(key, rev)
        sha = self.store.commit(key, cid)["files"].get(path)
        if sha is None:
            # X-Repo-Commit here lets the client remember the miss in its cache (.no_exist).
            raise HubError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": cid})
        size = self.store.blob_size(sha)
        headers = {
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "ETag": f'"{self.store.blob_oid(sha)}"',
            "X-Repo-Commit": cid,
        }
        span = _parse_range(req.headers.get("Range"), size) if req.method == "GET" else None
        if span is None:
            return Response(200, headers, file=self.store.blob_path(sha), start=0, length=size)
        start, end = span
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        return Response(206, headers, file=self.store.blob_path(sha), start=start, length=end - start + 1)


def clean_path(path: str, folder: bool = False) -> str:
    """A repo-relative path, refusing anything that could escape or confuse the tree."""
    cleaned = path.strip("/") if folder else path
    parts = cleaned.split("/")
    if not cleaned or cleaned.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise HubError(400, f"Invalid path in repo: {path!r}")
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
        raise HubError(416, "Requested range not satisfiable", headers={"Content-Range": f"bytes */{size}"})
    return start, end
