"""Signatures and attestations beside the image in its registry, laid out as cosign lays them, so
`cosign verify --key` and `cosign verify-attestation --key` find Kiln's and Kiln finds cosign's.

sigstore/cosign specs/SIGNATURE_SPEC.md ("Tag-based Discovery", "OCI Image Manifest V1") and
specs/ATTESTATION_SPEC.md, read at cosign commit d6d86c22 (v3.0.5), with the annotation keys of
pkg/oci/static/signature.go:

    <repo>:sha256-<hex>.sig   an OCI image manifest; each layer one signature: the Simple Signing payload
                              as the blob (application/vnd.dev.cosign.simplesigning.v1+json), the
                              base64 signature in the layer annotation dev.cosignproject.cosign/signature
    <repo>:sha256-<hex>.att   an OCI image manifest; each layer one DSSE envelope as the blob
                              (application/vnd.dsse.envelope.v1+json), annotations predicateType=<URI>
                              and dev.cosignproject.cosign/signature="" (the signature is inside)

The tag is the signed digest with ':' turned to '-', in the image's own repository. The config blob is
an empty OCI image config whose rootfs lists the layers, as go-containerregistry's mutate.Append writes it.
Writing reads the manifest there, changes its layers and puts it back: racy between two signers, as the
spec says of tag-based discovery. A signature already there (same payload, verifying with the same key)
is kept, not doubled; a new attestation replaces any of the same predicate type that the same key made.
cosign v3 by default stores Sigstore bundles as OCI 1.1 referrers instead; its `verify --key` falls back to
these tags when an image has no bundles (cmd/cosign/cli/verify/verify.go). Kiln does not use the referrers
API: the CNCF registry these tests run (distribution 2.8) has none, and the tags work on every registry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

from ..registry import ImageRef, RegistryClient

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
PREDICATE_ANNOTATION = "predicateType"
SIG, ATT = "sig", "att"


def tag_for(digest: str, kind: str) -> str:
    """sha256:abc… -> sha256-abc….sig (or .att)."""
    return digest.replace(":", "-") + "." + kind


@dataclass(frozen=True)
class Layer:
    media_type: str
    blob: bytes
    annotations: dict[str, str] = field(default_factory=dict)


def read(client: RegistryClient, image: ImageRef, digest: str, kind: str) -> list[Layer] | None:
    """The layers stored for `digest`, None when there is no .sig/.att manifest at all. A layer whose
    blob is missing is left out (it can verify nothing)."""
    found = client.manifest(ImageRef(image.registry, image.repo, tag_for(digest, kind), None))
    if found is None:
        return None
    try:
        doc = json.loads(found.body)
        descriptors = doc.get("layers") or []
    except (ValueError, AttributeError):
        return []
    layers = []
    for d in descriptors:
        if not isinstance(d, dict) or not isinstance(d.get("digest"), str):
            continue
        blob = client.blob(image, d["digest"])
        if blob is not None:
            annotations = d.get("annotations") if isinstance(d.get("annotations"), dict) else {}
            layers.append(Layer(str(d.get("mediaType", "")), blob, {str(k): str(v) for k, v in annotations.items()}))
    return layers


def write(client: RegistryClient, image: ImageRef, digest: str, kind: str, layers: list[Layer]) -> str:
    """Push every blob, then the manifest under the .sig/.att tag; returns the tag written."""
    descriptors = []
    for layer in layers:
        d = {"mediaType": layer.media_type, "size": len(layer.blob), "digest": client.push_blob(image, layer.blob)}
        if layer.annotations:
            d["annotations"] = layer.annotations
        descriptors.append(d)
    config = json.dumps({"architecture": "", "os": "", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in descriptors]}},
                        separators=(",", ":")).encode()
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
                "config": {"mediaType": CONFIG_TYPE, "size": len(config), "digest": client.push_blob(image, config)},
                "layers": descriptors}
    tag = tag_for(digest, kind)
    client.put_manifest(image, tag, json.dumps(manifest, separators=(",", ":")).encode(), MANIFEST_TYPE)
    return tag


def merge(client: RegistryClient, image: ImageRef, digest: str, kind: str, new: list[Layer],
          replaced: Callable[[Layer], bool]) -> str:
    """Read what is stored, drop the layers `replaced` says go, add `new` (those not already there), write."""
    kept = [layer for layer in read(client, image, digest, kind) or [] if not replaced(layer)]
    for layer in new:
        if layer not in kept:
            kept.append(layer)
    return write(client, image, digest, kind, kept)
