"""A container registry over the OCI distribution API: manifests (GET/PUT /v2/<repo>/manifests/<ref>) and
blobs (GET /v2/<repo>/blobs/<digest>, POST+PUT /v2/<repo>/blobs/uploads/ as one monolithic upload), with the
Bearer token flow registries use (ghcr.io, Docker Hub) or Basic credentials. Users: `promote` moves release
tags by digest (images/ci/promote.py), `up` checks an image exists before renting anything
(images/runpod/image_check.py), and images/attest/store.py keeps signatures and attestations beside an image.

Spec: opencontainers/distribution-spec spec.md ("Pulling manifests", "Pulling blobs", "Pushing a blob
monolithically" with POST then PUT ?digest=, "Pushing Manifests"). Every manifest and blob read by
digest is hashed here and refused when its bytes do not hash to that digest: a registry (or anything
between) cannot hand over other bytes under a digest a signature names."""

from __future__ import annotations

import base64
import hashlib
import os
import re
from dataclasses import dataclass

import requests

from supervisor.errors import KilnError

from .pins.resolve import MANIFEST_ACCEPT, split_ref


LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
USER_ENV, PASSWORD_ENV = "KILN_REGISTRY_USER", "KILN_REGISTRY_PASSWORD"


class RegistryError(KilnError):
    """The registry refused or could not be asked; the message says which reference and why."""


@dataclass(frozen=True)
class Manifest:
    body: bytes
    media_type: str
    digest: str


@dataclass(frozen=True)
class ImageRef:
    """registry/repo[:tag][@sha256:hex], split. `reference` is what a manifest request names: the digest
    when there is one (then the tag is only a label), else the tag."""
    registry: str
    repo: str
    tag: str | None
    digest: str | None

    @property
    def reference(self) -> str:
        return self.digest or self.tag or "latest"

    @property
    def name(self) -> str:
        """registry/repo, as a signature's docker-reference and an attestation's subject name spell it."""
        host = "docker.io" if self.registry == "registry-1.docker.io" else self.registry
        return f"{host}/{self.repo}"

    def at(self, digest: str) -> str:
        return f"{self.name}@{digest}"


DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


def parse_ref(ref: str) -> ImageRef:
    """'ghcr.io/you/kiln:t@sha256:…' -> ImageRef('ghcr.io', 'you/kiln', 't', 'sha256:…')."""
    name, at, digest = ref.partition("@")
    if at and not DIGEST_RE.fullmatch(digest):
        raise RegistryError(f"image {ref!r}: the part after @ must be sha256: and 64 lowercase hex digits")
    tagged = ":" in name.split("/")[-1]
    registry, repo, tag = split_ref(name)
    return ImageRef(registry, repo, tag if tagged or not at else None, digest if at else None)


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


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

    def manifest(self, image: ImageRef, *, push: bool = False) -> Manifest | None:
        """The manifest `image` names (by digest when it has one), None when the registry has none. Its
        digest is the sha256 of the bytes served; a digest reference whose bytes hash otherwise is refused."""
        where = f"{image.name}@{image.digest}" if image.digest else f"{image.name}:{image.reference}"
        r = self._request("GET", image.registry, image.repo, f"manifests/{image.reference}",
                          headers={"Accept": MANIFEST_ACCEPT}, push=push)
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise RegistryError(f"GET manifest {where}: HTTP {r.status_code}")
        digest = sha256_digest(r.content)
        if image.digest and digest != image.digest:
            raise RegistryError(f"GET manifest {where}: the registry served bytes whose sha256 is {digest}, not "
                                f"{image.digest}: refused (a registry or proxy altering content)")
        return Manifest(r.content, r.headers.get("Content-Type", "").split(";")[0].strip(), digest)

    def blob(self, image: ImageRef, digest: str) -> bytes | None:
        """A blob of image's repository by digest (checked against its bytes), None when there is none."""
        r = self._request("GET", image.registry, image.repo, f"blobs/{digest}")
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise RegistryError(f"GET blob {image.name}@{digest}: HTTP {r.status_code}")
        if sha256_digest(r.content) != digest:
            raise RegistryError(f"GET blob {image.name}@{digest}: the bytes served hash to "
                                f"{sha256_digest(r.content)}: refused")
        return r.content

    def push_blob(self, image: ImageRef, data: bytes) -> str:
        """Upload `data` into image's repository (skipped when the registry has it); returns its digest."""
        digest = sha256_digest(data)
        head = self._request("HEAD", image.registry, image.repo, f"blobs/{digest}", push=True)
        if head.status_code == 200:
            return digest
        start = self._request("POST", image.registry, image.repo, "blobs/uploads/", push=True)
        if start.status_code != 202 or not start.headers.get("Location"):
            raise RegistryError(f"POST blob upload to {image.name}: HTTP {start.status_code}: {start.text[:200]} "
                                "(may the token write packages?)")
        location = start.headers["Location"]
        if location.startswith("/"):
            location = f"{self.scheme}://{image.registry}{location}"
        headers = {"Content-Type": "application/octet-stream"}
        key = (image.registry, image.repo)
        if key in self._tokens:
            headers["Authorization"] = self._tokens[key]
        sep = "&" if "?" in location else "?"
        r = self.s.put(f"{location}{sep}digest={digest}", data=data, headers=headers, timeout=self.timeout)
        if r.status_code != 201:
            raise RegistryError(f"PUT blob {digest} to {image.name}: HTTP {r.status_code}: {r.text[:200]}")
        return digest

    def put_manifest(self, image: ImageRef, reference: str, body: bytes, media_type: str) -> str:
        """PUT a manifest under `reference` (a tag) in image's repository; returns its digest."""
        r = self._request("PUT", image.registry, image.repo, f"manifests/{reference}", data=body, push=True,
                          headers={"Content-Type": media_type})
        if r.status_code not in (200, 201):
            raise RegistryError(f"PUT manifest {image.name}:{reference}: HTTP {r.status_code}: {r.text[:200]}")
        return sha256_digest(body)

    def put(self, ref: str, manifest: Manifest) -> None:
        registry, repo, tag = split_ref(ref)
        r = self._request("PUT", registry, repo, f"manifests/{tag}", data=manifest.body, push=True,
                          headers={"Content-Type": manifest.media_type})
        if r.status_code not in (200, 201):
            raise RegistryError(f"PUT manifest {ref}: HTTP {r.status_code}: {r.text[:200]}")


def scheme_for(registry: str) -> str:
    """http for a registry on loopback (a test's, a local mirror's), as Docker does for those hosts; else https."""
    host = registry.rsplit(":", 1)[0] if not registry.startswith("[") else registry.split("]")[0] + "]"
    return "http" if host in LOOPBACK else "https"


def client_for(registry: str, *, timeout: float = 60.0) -> RegistryClient:
    """A client for `registry` with the credentials in $KILN_REGISTRY_USER / $KILN_REGISTRY_PASSWORD, if any."""
    return RegistryClient(scheme=scheme_for(registry), username=os.environ.get(USER_ENV) or None,
                          password=os.environ.get(PASSWORD_ENV) or None, timeout=timeout)
