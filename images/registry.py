"""A container registry's manifests over the OCI distribution API (GET/PUT /v2/<repo>/manifests/<ref>),
with the Bearer token flow registries use (ghcr.io, Docker Hub) or Basic credentials. Two users:
`promote` moves release tags by digest (images/ci/promote.py), and `up` checks an image exists before
renting anything (images/runpod/image_check.py)."""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass

import requests

from supervisor.errors import KilnError

from .pins.resolve import MANIFEST_ACCEPT, split_ref


class RegistryError(KilnError):
    """The registry refused or could not be asked; the message says which reference and why."""


@dataclass(frozen=True)
class Manifest:
    body: bytes
    media_type: str
    digest: str


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
            raise RegistryError(f"the registry asks for {challenge or 'credentials'}: set KILN_REGISTRY_USER and "
                               "KILN_REGISTRY_PASSWORD")
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", "")
        params["scope"] = f"repository:{repo}:pull,push" if push else params.get("scope", f"repository:{repo}:pull")
        tok = self.s.get(realm, params=params, auth=self.auth, timeout=self.timeout)
        if tok.status_code != 200:
            raise RegistryError(f"token for {repo} refused (HTTP {tok.status_code}): check KILN_REGISTRY_USER / "
                               "KILN_REGISTRY_PASSWORD and that the token may write packages")
        body = tok.json()
        return f"Bearer {body.get('token') or body.get('access_token')}"

    def get(self, ref: str, *, push: bool = True) -> Manifest | None:
        """The manifest a tag names, None when the registry has none. `push`: ask a token that may
        write (promote moves tags next); a check before renting asks only to pull."""
        registry, repo, tag = split_ref(ref)
        r = self._request("GET", registry, repo, f"manifests/{tag}", headers={"Accept": MANIFEST_ACCEPT}, push=push)
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise RegistryError(f"GET manifest {ref}: HTTP {r.status_code}")
        digest = r.headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(r.content).hexdigest()
        return Manifest(r.content, r.headers.get("Content-Type", "").split(";")[0].strip(), digest)

    def get_digest(self, registry: str, repo: str, digest: str) -> Manifest | None:
        """The manifest at repo@digest (pull only), None when the registry has none."""
        r = self._request("GET", registry, repo, f"manifests/{digest}", headers={"Accept": MANIFEST_ACCEPT})
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise RegistryError(f"GET manifest {registry}/{repo}@{digest}: HTTP {r.status_code}")
        return Manifest(r.content, r.headers.get("Content-Type", "").split(";")[0].strip(), digest)

    def put(self, ref: str, manifest: Manifest) -> None:
        registry, repo, tag = split_ref(ref)
        r = self._request("PUT", registry, repo, f"manifests/{tag}", data=manifest.body, push=True,
                          headers={"Content-Type": manifest.media_type})
        if r.status_code not in (200, 201):
            raise RegistryError(f"PUT manifest {ref}: HTTP {r.status_code}: {r.text[:200]}")
