"""Network resolvers for `build.py lock`: registry digests and PyPI hashes.

Each returns "value|source". They speak the public protocols (OCI
distribution API, PyPI's JSON simple API, PEP 691) and are tested against
local stand-ins that speak the same protocols.
"""

from __future__ import annotations

import hashlib
import re
from typing import Callable

import requests

from . import closure as closure_file
from .cuda import engine_cuda
from .lock import Resolver, git_commit_resolver
from .pyclosure import walk
from ..target import Target

MANIFEST_ACCEPT = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])


def split_ref(ref: str) -> tuple[str, str, str]:
    """'nvidia/cuda:12.8.1-devel' -> ('registry-1.docker.io', 'nvidia/cuda', '12.8.1-devel')."""
    name, _, tag = ref.rpartition(":") if ":" in ref.split("/")[-1] else (ref, "", "latest")
    first = name.split("/", 1)[0]
    if "." in first or ":" in first or first == "localhost":
        registry, repo = name.split("/", 1)
    else:
        registry, repo = "registry-1.docker.io", name if "/" in name else f"library/{name}"
    if registry == "docker.io":
        registry = "registry-1.docker.io"
    return registry, repo, tag or "latest"


def registry_digest(ref: str, *, scheme: str = "https", session: requests.Session | None = None) -> str:
    """The manifest (index) digest a registry serves for a tag, via HEAD /v2/<repo>/manifests/<tag>."""
    s = session or requests.Session()
    registry, repo, tag = split_ref(ref)
    url = f"{scheme}://{registry}/v2/{repo}/manifests/{tag}"
    headers = {"Accept": MANIFEST_ACCEPT}
    r = s.head(url, headers=headers, timeout=30)
    if r.status_code == 401 and "Bearer" in r.headers.get("WWW-Authenticate", ""):
        params = dict(re.findall(r'(\w+)="([^"]*)"', r.headers["WWW-Authenticate"]))
        realm = params.pop("realm")
        tok = s.get(realm, params=params, timeout=30)
        tok.raise_for_status()
        body = tok.json()
        headers["Authorization"] = f"Bearer {body.get('token') or body.get('access_token')}"
        r = s.head(url, headers=headers, timeout=30)
    r.raise_for_status()
    digest = r.headers.get("Docker-Content-Digest")
    if not digest:
        # Some registries omit the header on HEAD: hash the manifest body ourselves.
        g = s.get(url, headers=headers, timeout=30)
        g.raise_for_status()
        digest = "sha256:" + hashlib.sha256(g.content).hexdigest()
    return digest


def pypi_sha256(package: str, filename: str, *, index: str = "https://pypi.org/simple",
                session: requests.Session | None = None) -> str:
    s = session or requests.Session()
    r = s.get(f"{index}/{package}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=30)
    r.raise_for_status()
    for f in r.json().get("files", []):
        if f.get("filename") == filename:
            sha = f.get("hashes", {}).get("sha256")
            if sha:
                return sha
            raise RuntimeError(f"{index} lists {filename} without a sha256")
    raise RuntimeError(f"{index} has no file {filename} for {package}")


ClosureIncomplete = closure_file.ClosureIncomplete


def default_resolvers(*, registry_scheme: str = "https", pypi_index: str = "https://pypi.org/simple",
                      closure_files: dict[str, str] | None = None) -> dict[str, Resolver]:
    """The resolvers `build.py lock` uses. The closure's text goes into `closure_files` (file name ->
    text), for the caller to write beside the lock once the lock is written; its pin is the text's
    sha256."""
    def base(target: Target, key: str) -> str:
        ref = target.bases.build if key == "base.build" else target.bases.runtime
        digest = registry_digest(ref, scheme=registry_scheme)
        return f"{digest}|registry HEAD manifest of {ref}"

    def sdist(target: Target, key: str) -> str:
        src = target.source
        assert src.package and src.filename
        return f"{pypi_sha256(src.package, src.filename, index=pypi_index)}|PyPI simple API ({pypi_index}) for {src.filename}"

    def patch(target: Target, key: str) -> str:
        name = key.split(".", 1)[1]
        p = next(p for p in target.patches if p.name == name)
        if not p.url:
            raise RuntimeError(f"patch {name} has no url; pass --patch-file {name}=PATH")
        r = requests.get(p.url, timeout=60)
        r.raise_for_status()
        return f"{hashlib.sha256(r.content).hexdigest()}|sha256 of {p.url}"

    def cuda(target: Target, key: str) -> str:
        version, source = engine_cuda(target, index=pypi_index)
        return f"{version}|{source}"

    def closure(target: Target, key: str) -> str:
        src = target.source
        assert src.package and src.version
        root = f"{src.package}=={src.version}"
        text = closure_file.text(root, walk(root, index=pypi_index), pypi_index)
        name = closure_file.file_name(src.package, src.version)
        if closure_files is not None:
            closure_files[name] = text
        return f"{closure_file.digest(text)}|{closure_source(text, pypi_index, name)}"

    resolvers: dict[str, Callable[[Target, str], str]] = {
        "base": base, "source.commit": git_commit_resolver, "source.sha256": sdist, "patch": patch,
        "engine.cuda": cuda, "engine.closure": closure,
    }
    return resolvers


def closure_source(text: str, index: str, name: str) -> str:
    count = len(closure_file.pinned(text))
    return (f"sha256 of images/closures/{name}: {count} packages walked on {index} (PEP 691 + PEP 658), "
            "every requirement met")
