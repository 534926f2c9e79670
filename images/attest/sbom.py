"""The SBOM of a built image: an SPDX 2.3 JSON document of what Kiln pinned and what the image holds.

    document(inputs, image=..., debs=..., os_release=...)   the document (a dict)
    problems(doc)                                           [] when it is valid, else one line each
    check(doc)                                              raise SbomInvalid naming every problem

SPDX 2.3, not CycloneDX 1.6: the in-toto SPDX predicate (https://spdx.dev/Document) that the signed
attestation carries is defined for it, and its JSON schema is one closed file Kiln vendors. Valid
means valid against that schema, the spec's own published one (images/schemas/spdx-2.3.schema.json;
where it came from: spdx-2.3.schema.source.json beside it), plus what the spec says in prose and the
schema cannot express: SPDXID syntax and uniqueness (7.2), relationships naming elements of the
document, a namespace with a scheme and no `#` (6.5), checksum values in lowercase hex of their
algorithm's length.

What each package is and where its facts come from:

    the image          CONTAINER  its tag; its image ID (the config's sha256); the manifest digest is
                                  known only after a push and is the signed statement's subject
    the bases          CONTAINER  the lock's base.* digest (or a --base-image override's image ID)
    the engine source  SOURCE     the lock's source.sha256 (sdist/wheel) or source.commit (git)
    each patch         SOURCE     the lock's patch.<name> sha256
    the engine         APPLICATION compiled from the source, or the fetched tarball (its sha256)
    each deb package              the image's /var/lib/dpkg/status (dpkg.py): name, version, arch
    each wheel         LIBRARY    the hash-locked requirements files the image installed: name,
                                  version, the sha256s pip --require-hashes accepts

The document DESCRIBES the image; the image CONTAINS its runtime base, the engine, every deb and every
wheel; a build base that is not the runtime base is a BUILD_DEPENDENCY_OF the image; the engine is
GENERATED_FROM its source; a patch is PATCH_APPLIED to the source.
"""

from __future__ import annotations

import json
import re
import uuid
from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence

import jsonschema

from supervisor.errors import KilnError

from ..paths import SPDX_SCHEMA
from .dpkg import DebPackage
from .inputs import Base, BuildInputs
from .refs import docker_purl, oci_purl, pypi_name, pypi_purl, split_ref

SPDX_VERSION = "SPDX-2.3"
DATA_LICENSE = "CC0-1.0"                  # 6.2: the only value SPDX 2.3 allows
NOASSERTION = "NOASSERTION"
DOCUMENT_ID = "SPDXRef-DOCUMENT"
IMAGE_ID = "SPDXRef-image"
NAMESPACE_BASE = "https://github.com/kiln-llm/kiln/spdx"
_ID_CHARS = re.compile(r"[^A-Za-z0-9.-]+")
_SPDX_ID = re.compile(r"SPDXRef-[A-Za-z0-9.-]+")
_HEX_LEN = {"SHA1": 40, "SHA224": 56, "SHA256": 64, "SHA384": 96, "SHA512": 128, "MD5": 32}


class SbomInvalid(KilnError):
    """An SBOM is not a valid SPDX 2.3 document; the message names every problem."""


# -- building ----------------------------------------------------------------------------------------
def document(inputs: BuildInputs, *, image_ref: str, image_id: str, debs: Iterable[DebPackage],
             os_release: Mapping[str, str], created: str, namespace: str | None = None) -> dict[str, Any]:
    """The SPDX 2.3 document of one built image. `created` is RFC 3339 UTC (…Z); `namespace` defaults
    to a new unique URI under Kiln's (6.5: one URI per document)."""
    ids = _Ids()
    packages: list[dict[str, Any]] = []
    rels: list[tuple[str, str, str]] = [(DOCUMENT_ID, "DESCRIBES", IMAGE_ID)]
    image_hex = image_id.removeprefix("sha256:")
    packages.append(_package(
        IMAGE_ID, f"kiln-{inputs.target}", split_ref(image_ref)[2] or image_ref, purpose="CONTAINER",
        sha256s=[image_hex], purl=docker_purl(image_ref, image_hex),
        comment=f"{image_ref}, built by Kiln {inputs.kiln_version} for target {inputs.target}. Its checksum is "
        "the image ID (the sha256 of its config); the manifest digest is known only after a push, and is the "
        "subject of the in-toto statement that carries this document once the image is pushed."))

    for base_id, base, roles in _bases(inputs.bases, ids):
        packages.append(_base_package(base_id, base, roles))
        rels.append((IMAGE_ID, "CONTAINS", base_id) if "runtime" in roles else (base_id, "BUILD_DEPENDENCY_OF", IMAGE_ID))

    engine_wheel = _engine_wheel(inputs)
    source_id = None
    if engine_wheel is None:
        source_id = ids.new("engine-source")
        packages.append(_source_package(source_id, inputs))
        for patch in inputs.patches:
            pid = ids.new(f"patch-{patch.name}")
            packages.append(_package(pid, patch.name, "", purpose="SOURCE", sha256s=[patch.sha256] if patch.sha256 else [],
                                     download=patch.uri or NOASSERTION,
                                     comment=patch.note or "a patch the build applied to the engine's source; its "
                                     "sha256 is the lock's pin"))
            rels.append((pid, "PATCH_APPLIED", source_id))
    if inputs.engine == "llamacpp":
        engine_id = ids.new("engine")
        packages.append(_engine_package(engine_id, inputs))
        rels.append((IMAGE_ID, "CONTAINS", engine_id))
        if source_id:
            rels.append((engine_id, "GENERATED_FROM", source_id))
        if inputs.binaries:
            tar_id = ids.new("engine-tarball")
            packages.append(_package(tar_id, inputs.binaries.name, inputs.source.version, purpose="ARCHIVE",
                                     sha256s=[inputs.binaries.sha256], file_name=inputs.binaries.name,
                                     comment=f"the prebuilt engine tarball the build fetched ({inputs.binaries.note})"))
            rels.append((engine_id, "EXPANDED_FROM_ARCHIVE", tar_id))
    elif source_id:
        rels.append((IMAGE_ID, "CONTAINS", source_id))

    vendor = os_release.get("ID", "") or "unknown"
    codename = os_release.get("VERSION_CODENAME", "")
    for deb in debs:
        did = ids.new(f"deb-{deb.name}-{deb.architecture}")
        packages.append(_deb_package(did, deb, vendor, codename))
        rels.append((IMAGE_ID, "CONTAINS", did))

    for wheel in inputs.wheels:
        wid = ids.new(f"pypi-{wheel.name}-{wheel.version}")
        is_engine = engine_wheel is not None and wheel.name == engine_wheel.name
        pins = ", ".join(wheel.files)
        comment = (f"pinned by {pins}, installed with pip --require-hashes" + (
            "; pip installed the one wheel of these sha256s that fits the image's Python and platform"
            if len(wheel.sha256s) > 1 else "") + ("; the engine" if is_engine else ""))
        packages.append(_package(wid, wheel.name, wheel.version, purpose="APPLICATION" if is_engine else "LIBRARY",
                                 sha256s=list(wheel.sha256s), purl=pypi_purl(wheel.name, wheel.version),
                                 comment=comment))
        rels.append((IMAGE_ID, "CONTAINS", wid))

    name = f"kiln-{inputs.target}-{image_hex[:12]}"
    os_name = os_release.get("PRETTY_NAME") or vendor
    return {
        "spdxVersion": SPDX_VERSION,
        "dataLicense": DATA_LICENSE,
        "SPDXID": DOCUMENT_ID,
        "name": name,
        "documentNamespace": namespace or f"{NAMESPACE_BASE}/{inputs.target}/{name}-{uuid.uuid4()}",
        "creationInfo": {
            "created": created,
            "creators": [f"Tool: kiln-{inputs.kiln_version}"],
            "comment": (f"Generated by `python build.py build --target {inputs.target}` from what Kiln pinned "
                        f"({inputs.lock.name} sha256 {inputs.lock.sha256}, the target file, the requirements files "
                        f"the image installed) and what the image holds: its distribution packages ({os_name}) "
                        "read from /var/lib/dpkg/status copied out of the built image's layers by the Docker "
                        "engine (nothing from the image ran). Licenses are not concluded (NOASSERTION by omission)."),
        },
        "packages": packages,
        "relationships": [{"spdxElementId": a, "relationshipType": t, "relatedSpdxElement": b} for a, t, b in rels],
    }


class _Ids:
    """SPDXRef-<idstring> (7.2: letters, digits, `.` and `-`), unique within the document."""

    def __init__(self) -> None:
        self.used = {DOCUMENT_ID, IMAGE_ID}

    def new(self, hint: str) -> str:
        base = "SPDXRef-" + (_ID_CHARS.sub("-", hint).strip("-") or "x")
        candidate, n = base, 2
        while candidate in self.used:
            candidate, n = f"{base}-{n}", n + 1
        self.used.add(candidate)
        return candidate


def _package(spdx_id: str, name: str, version: str, *, purpose: str = "", sha256s: Sequence[str] = (),
             purl: str = "", download: str = NOASSERTION, comment: str = "", file_name: str = "",
             source_info: str = "") -> dict[str, Any]:
    p: dict[str, Any] = {"SPDXID": spdx_id, "name": name}
    if version:
        p["versionInfo"] = version
    if file_name:
        p["packageFileName"] = file_name
    p["downloadLocation"] = download
    p["filesAnalyzed"] = False          # 7.8: metadata of the package, no files listed
    if sha256s:
        p["checksums"] = [{"algorithm": "SHA256", "checksumValue": h} for h in sha256s]
    if purl:
        p["externalRefs"] = [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}]
    if purpose:
        p["primaryPackagePurpose"] = purpose
    if source_info:
        p["sourceInfo"] = source_info
    if comment:
        p["comment"] = comment
    return p


def _bases(bases: tuple[Base, ...], ids: _Ids) -> list[tuple[str, Base, tuple[str, ...]]]:
    """One package per distinct base (a CPU target builds and runs on the same one), with its roles."""
    seen: dict[tuple[str, str], tuple[Base, list[str]]] = {}
    for b in bases:
        seen.setdefault((b.ref, b.digest), (b, []))[1].append(b.role)
    return [(ids.new("base-" + "-".join(roles)), b, tuple(roles)) for b, roles in seen.values()]


def _base_package(spdx_id: str, base: Base, roles: tuple[str, ...]) -> dict[str, Any]:
    registry, path, tag, _ = split_ref(base.ref)
    hexd = base.digest.removeprefix("sha256:")
    purl = (docker_purl(base.ref, hexd) if base.override else oci_purl(base.ref, hexd)) if hexd else ""
    what = " and ".join(roles)
    note = base.note or ("its digest is the lock's base pin (images/lock.toml)" if hexd else "")
    name = base.ref.partition("@")[0].rpartition(":")[0] if tag else base.ref.partition("@")[0]
    return _package(spdx_id, name if base.override else f"{registry}/{path}", tag, purpose="CONTAINER", sha256s=[hexd] if hexd else [],
                    purl=purl, comment=f"the {what} base image {base.ref}: {note}".rstrip(": "))


def _source_package(spdx_id: str, inputs: BuildInputs) -> dict[str, Any]:
    s = inputs.source
    if s.kind == "git":
        rev = s.commit or ""
        download = f"git+{s.url}@{rev}" if rev else f"git+{s.url}"
        return _package(spdx_id, s.url.rstrip("/").rsplit("/", 1)[-1], rev, purpose="SOURCE", download=download,
                        comment=s.note or "the engine's source at the lock's source.commit")
    return _package(spdx_id, s.package, s.version, purpose="SOURCE" if s.kind == "sdist" else "INSTALL",
                    sha256s=[s.sha256] if s.sha256 else [], purl=pypi_purl(s.package, s.version, s.filename), download=s.url or NOASSERTION,
                    file_name=s.filename, comment=s.note or "the engine's source; its sha256 is the lock's source.sha256")


def _engine_package(spdx_id: str, inputs: BuildInputs) -> dict[str, Any]:
    s = inputs.source
    version = s.version if s.kind != "git" else (s.commit or "floating")
    how = (f"fetched as the prebuilt tarball {inputs.binaries.name} (sha256 {inputs.binaries.sha256}) and extracted"
           if inputs.binaries else "compiled in the image build from the engine's source")
    return _package(spdx_id, "llama-server", version, purpose="APPLICATION",
                    comment=f"llama.cpp's llama-server at /opt/kiln/engine: {how}")


def _engine_wheel(inputs: BuildInputs):
    """The closure's wheel that is the engine itself (vLLM, the router's smg), if the image pins one."""
    if inputs.source.kind != "pypi-wheel":
        return None
    name = pypi_name(inputs.source.package)
    return next((w for w in inputs.wheels if pypi_name(w.name) == name and w.version == inputs.source.version), None)


def _deb_package(spdx_id: str, deb: DebPackage, vendor: str, codename: str) -> dict[str, Any]:
    src = ""
    if deb.source:
        src = f"built from the {vendor} source package {deb.source} {deb.source_version or deb.version}"
    return _package(spdx_id, deb.name, deb.version, purl=deb.purl(vendor, codename), source_info=src,
                    comment=f"{deb.architecture}; read from the image's dpkg database")


# -- checking ----------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    return json.loads(SPDX_SCHEMA.read_text(encoding="utf-8"))


def problems(doc: Any) -> list[str]:
    """Every way `doc` is not a valid SPDX 2.3 document: the spec's JSON schema first, then its prose
    rules the schema leaves out. [] when valid."""
    validator = jsonschema.Draft7Validator(schema())      # the schema's own "$schema": draft-07
    out = [f"{'/'.join(str(p) for p in e.absolute_path) or '(document)'}: {e.message}"
           for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]
    if out or not isinstance(doc, dict):
        return out
    if doc.get("spdxVersion") != SPDX_VERSION:
        out.append(f"spdxVersion: {doc.get('spdxVersion')!r}, expected {SPDX_VERSION!r}")
    ns = doc.get("documentNamespace", "")
    if not re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", ns) or "#" in ns:
        out.append(f"documentNamespace: {ns!r} must be an absolute URI with a scheme and no '#' (SPDX 2.3 6.5)")
    ids = [DOCUMENT_ID] if doc.get("SPDXID") == DOCUMENT_ID else []
    if not ids:
        out.append(f"SPDXID: {doc.get('SPDXID')!r}, expected {DOCUMENT_ID!r}")
    for i, p in enumerate(doc.get("packages", [])):
        pid = p.get("SPDXID", "")
        if not _SPDX_ID.fullmatch(pid):
            out.append(f"packages/{i}/SPDXID: {pid!r} is not SPDXRef- followed by letters, digits, '.' or '-' (7.2)")
        if pid in ids:
            out.append(f"packages/{i}/SPDXID: {pid!r} is used twice")
        ids.append(pid)
        for j, c in enumerate(p.get("checksums", [])):
            want = _HEX_LEN.get(c.get("algorithm", ""))
            if want and not re.fullmatch(f"[0-9a-f]{{{want}}}", c.get("checksumValue", "")):
                out.append(f"packages/{i}/checksums/{j}/checksumValue: {c.get('checksumValue')!r} is not {want} "
                           f"lowercase hex digits ({c.get('algorithm')})")
        if p.get("filesAnalyzed", True) and "packageVerificationCode" not in p:
            out.append(f"packages/{i}: filesAnalyzed is true (the default) but there is no packageVerificationCode (7.9)")
    known = set(ids)
    for i, r in enumerate(doc.get("relationships", [])):
        for key in ("spdxElementId", "relatedSpdxElement"):
            ref = r.get(key, "")
            if ref not in known and ref not in (NOASSERTION, "NONE") and not ref.startswith("DocumentRef-"):
                out.append(f"relationships/{i}/{key}: {ref!r} names no element of this document")
    for i, ref in enumerate(doc.get("documentDescribes", [])):
        if ref not in known:
            out.append(f"documentDescribes/{i}: {ref!r} names no element of this document")
    if not any(r.get("spdxElementId") == DOCUMENT_ID and r.get("relationshipType") == "DESCRIBES"
               for r in doc.get("relationships", [])) and not doc.get("documentDescribes"):
        out.append("relationships: the document DESCRIBES nothing")
    return out


def check(doc: Any) -> None:
    found = problems(doc)
    if found:
        raise SbomInvalid(f"the SBOM is not a valid SPDX 2.3 document ({len(found)} problem(s)):\n"
                          + "\n".join(f"  - {p}" for p in found))
