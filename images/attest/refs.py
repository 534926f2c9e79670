"""Names for what a build used: image references split as Docker reads them, and package URLs.

An image reference is `[registry/]path[:tag][@digest]`. A first component with a `.` or a `:`, or
`localhost`, is a registry; without one the registry is docker.io, and a one-component path there is
`library/<name>` (how `docker pull debian` resolves).

Package URLs follow purl-spec's type definitions (package-url/purl-spec types/*-definition.json, read
at commit 16f3d0e39343d47d1ac3d559b7e110f25eac1513): `oci` for a registry artifact by digest (the
name is the repository's last part; repository_url and tag as qualifiers), `docker` for an image by
its local image ID, `pypi` with the name lowercased and `_` written `-`.
"""

from __future__ import annotations

from urllib.parse import quote


def split_ref(ref: str) -> tuple[str, str, str, str]:
    """(registry, path, tag, digest) of an image reference; tag and digest "" when absent."""
    rest, _, digest = ref.partition("@")
    first, slash, remainder = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        registry, rest = first, remainder
    else:
        registry = "docker.io"
    path, tag = rest, ""
    if ":" in rest.rsplit("/", 1)[-1]:
        path, _, tag = rest.rpartition(":")
    if registry == "docker.io" and "/" not in path:
        path = f"library/{path}"
    return registry, path, tag, digest


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def oci_purl(ref: str, digest: str = "") -> str:
    """pkg:oci/<name>@sha256%3A<hex>?repository_url=<registry/path>&tag=<tag> (no version when `digest` is "")."""
    registry, path, tag, _ = split_ref(ref)
    version = f"@sha256%3A{_hex(digest)}" if digest else ""
    q = f"?repository_url={quote(f'{registry}/{path}', safe='')}" + (f"&tag={quote(tag, safe='')}" if tag else "")
    return f"pkg:oci/{path.rsplit('/', 1)[-1].lower()}{version}{q}"


def docker_purl(ref: str, image_id: str = "") -> str:
    """pkg:docker/<namespace/name>@sha256%3A<image id> (its version may be an image ID); a registry other
    than docker.io goes in repository_url."""
    registry, path, _, _ = split_ref(ref)
    version = f"@sha256%3A{_hex(image_id)}" if image_id else ""
    q = "" if registry == "docker.io" else f"?repository_url={quote(registry, safe='')}"
    return f"pkg:docker/{path.removeprefix('library/')}{version}{q}"


def pypi_name(name: str) -> str:
    return name.lower().replace("_", "-")


def pypi_purl(name: str, version: str, file_name: str = "") -> str:
    q = f"?file_name={quote(file_name, safe='')}" if file_name else ""
    return f"pkg:pypi/{pypi_name(name)}@{quote(version, safe='')}{q}"
