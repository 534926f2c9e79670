"""The payload of an image signature, cosign's "Simple Signing", which names the manifest digest.

sigstore/cosign specs/SIGNATURE_SPEC.md ("Payloads"), with the field names sigstore/sigstore
pkg/signature/payload/payload.go spells:

    {"critical": {"identity": {"docker-reference": "<registry>/<repo>"},
                  "image": {"docker-manifest-digest": "sha256:<hex>"},
                  "type": "cosign container image signature"},
     "optional": {...}}

The signature is over these bytes (SHA-256, ECDSA P-256), and the bytes name the manifest digest: a
signature binds exactly one manifest, so a changed layer (a new manifest, a new digest) is unsigned.
`docker-reference` is ignored when verifying, as the spec says: an image copied to another registry keeps
its signature.
"""

from __future__ import annotations

import json
from typing import Any

MEDIA_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
TYPE = "cosign container image signature"


def payload(docker_reference: str, digest: str, optional: dict[str, Any] | None = None) -> bytes:
    return json.dumps({"critical": {"identity": {"docker-reference": docker_reference},
                                    "image": {"docker-manifest-digest": digest}, "type": TYPE},
                       "optional": optional}, separators=(",", ":"), sort_keys=True).encode()


def signed_digest(data: bytes) -> str | None:
    """The manifest digest a (verified) payload names; None when it is not a cosign signature payload."""
    try:
        doc = json.loads(data)
        critical = doc["critical"]
        if critical.get("type") != TYPE:
            return None
        digest = critical["image"]["docker-manifest-digest"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        return None
    return digest if isinstance(digest, str) else None
