"""Promote-on-pass: copy staging tags to release tags, all or nothing, after every image passed.

CI builds each target into a staging tag (images/build/tags.py) and runs its selftest; only then does
the promote job call this once for the whole run. Nothing is written until every pair has been
checked: each staging manifest exists, each release tag lives in the staging tag's repository (a
manifest copy, no layer moves), and no immutable release tag already names a different image
(an immutable tag never moves; re-promoting the same digest is a no-op). Then the immutable tags
are written, then the moving ones (e.g. `<target>`). `docker buildx bake --push` tags each image
as it finishes even when a later target fails (docker/buildx#1089); this is the opposite.

Speaks the OCI distribution API directly (GET/PUT /v2/<repo>/manifests/<ref>) with the Bearer
token flow registries use (ghcr.io, Docker Hub); credentials from $KILN_REGISTRY_USER and
$KILN_REGISTRY_PASSWORD (in GitHub Actions: github.actor and GITHUB_TOKEN).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from dataclasses import dataclass
from typing import Sequence

import requests

from supervisor.errors import KilnError

from ..pins.resolve import MANIFEST_ACCEPT, split_ref


class PromoteError(KilnError):
    pass


@dataclass(frozen=True)
class Manifest:
    body: bytes
    media_type: str
    digest: str


@dataclass(frozen=True)
class Promotion:
    staging: str                    # repo:staging-tag
    immutable: tuple[str, ...]      # release tags that must never move
    moving: tuple[str, ...] = ()    # release tags that follow the latest promotion


class RegistryClient:
    def __init__(self, *, scheme: str = "https", username: str | None = None, password: str | None = None,
                 session: requests.Session | None = None, timeout: float = 60.0):
        self.scheme = scheme
        self.auth = (username, password) if username and password else None
        self.s = session or requests.Session()
        self.timeout = timeout
        self._tokens: dict[tuple[str, str], str] = {}

    def _request(self, method: str, registry: str, repo: str, path: str, *, push: bool = False,
                 **kw) -> requests.Response:
        url = f"{self.scheme}://{registry}/v2/{repo}/{path}"
        headers = dict(kw.pop("headers", {}))
        key = (registry, repo)
        if key in self._tokens:
            headers["Authorization"] = self._tokens[key]
        r = self.s.request(method, url, headers=headers, timeout=self.timeout, **kw)
        if r.status_code == 401:
            headers["Authorization"] = self._authorize(r.headers.get("WWW-Authenticate", ""), repo, push)
            self._tokens[key] = headers["Authorization"]
            r = self.s.request(method, url, headers=headers, timeout=self.timeout, **kw)
        return r

    def _authorize(self, challenge: str, repo: str, push: bool) -> str:
        if challenge.lower().startswith("basic") and self.auth:
            user, password = self.auth
            return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        if not challenge.lower().startswith("bearer"):
            raise PromoteError(f"the registry asks for {challenge or 'credentials'}: set KILN_REGISTRY_USER and "
                               "KILN_REGISTRY_PASSWORD")
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", "")
        params["scope"] = f"repository:{repo}:pull,push" if push else params.get("scope", f"repository:{repo}:pull")
        tok = self.s.get(realm, params=params, auth=self.auth, timeout=self.timeout)
        if tok.status_code != 200:
            raise PromoteError(f"token for {repo} refused (HTTP {tok.status_code}): check KILN_REGISTRY_USER / "
                               "KILN_REGISTRY_PASSWORD and that the token may write packages")
        body = tok.json()
        return f"Bearer {body.get('token') or body.get('access_token')}"

    def get(self, ref: str) -> Manifest | None:
        registry, repo, tag = split_ref(ref)
        r = self._request("GET", registry, repo, f"manifests/{tag}", headers={"Accept": MANIFEST_ACCEPT}, push=True)
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise PromoteError(f"GET manifest {ref}: HTTP {r.status_code}")
        digest = r.headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(r.content).hexdigest()
        return Manifest(r.content, r.headers.get("Content-Type", "").split(";")[0].strip(), digest)

    def put(self, ref: str, manifest: Manifest) -> None:
        registry, repo, tag = split_ref(ref)
        r = self._request("PUT", registry, repo, f"manifests/{tag}", data=manifest.body, push=True,
                          headers={"Content-Type": manifest.media_type})
        if r.status_code not in (200, 201):
            raise PromoteError(f"PUT manifest {ref}: HTTP {r.status_code}: {r.text[:200]}")


def client_from_env(scheme: str = "https") -> RegistryClient:
    return RegistryClient(scheme=scheme, username=os.environ.get("KILN_REGISTRY_USER") or None,
                          password=os.environ.get("KILN_REGISTRY_PASSWORD") or None)


def promote(promotions: Sequence[Promotion], client: RegistryClient) -> list[str]:
    """Check everything, then write. Returns one line per tag: written / already there."""
    problems: list[str] = []
    plan: list[tuple[str, Manifest, bool]] = []      # (release ref, manifest, immutable)
    for p in promotions:
        s_reg, s_repo, _ = split_ref(p.staging)
        staged = client.get(p.staging)
        if staged is None:
            problems.append(f"{p.staging}: no such staging image (did its build push it?)")
            continue
        for ref, immutable in [(r, True) for r in p.immutable] + [(r, False) for r in p.moving]:
            reg, repo, _ = split_ref(ref)
            if (reg, repo) != (s_reg, s_repo):
                problems.append(f"{ref}: not in the staging image's repository {s_reg}/{s_repo}")
                continue
            if immutable:
                current = client.get(ref)
                if current is not None and current.digest != staged.digest:
                    problems.append(f"{ref}: already names {current.digest}, not {staged.digest}: an immutable "
                                    "tag never moves (bump the version or the engine pin)")
                    continue
                if current is not None:
                    plan.append((ref, staged, True))   # same digest: reported, not rewritten
                    continue
            plan.append((ref, staged, immutable))
    if problems:
        raise PromoteError("nothing promoted:\n  - " + "\n  - ".join(problems))
    done: list[str] = []
    for ref, manifest, immutable in sorted(plan, key=lambda x: not x[2]):
        current = client.get(ref) if immutable else None
        if current is not None and current.digest == manifest.digest:
            done.append(f"{ref} already {manifest.digest}")
            continue
        client.put(ref, manifest)
        done.append(f"{ref} -> {manifest.digest}")
    return done
