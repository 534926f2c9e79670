"""DSSE, the signed envelope around an in-toto statement (what `cosign attest` stores and
`cosign verify-attestation` reads; sigstore/cosign specs/ATTESTATION_SPEC.md).

Follows secure-systems-lab/dsse envelope.md and protocol.md (v1.0.2, read at commit eebf7b59):

    SIGNATURE = Sign(PAE(UTF8(PAYLOAD_TYPE), SERIALIZED_BODY))
    PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body

    {"payload": Base64(body), "payloadType": type, "signatures": [{"keyid": "", "sig": Base64(signature)}]}

`keyid` is left empty: the spec makes it an unauthenticated hint, and go-securesystemslib's verifier (which
cosign's goes through) skips a signature whose non-empty keyid differs from the key's own SSH-style
fingerprint (dsse/verify.go). Verification follows the protocol: the signature is checked over the PAE of
the decoded bytes, and those same bytes, never a re-parse of the envelope, are what the caller gets;
standard and URL-safe base64 are both accepted, as the protocol requires of verifiers.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from supervisor.errors import KilnError

from .keys import PrivateKey, PublicKey

PAYLOAD_TYPE = "application/vnd.in-toto+json"         # in-toto attestation spec/v1/envelope.md
MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"   # cosign ATTESTATION_SPEC.md: the layer's media type


class EnvelopeError(KilnError):
    """Not a DSSE envelope (bad JSON, a missing field, bad base64)."""


def pae(payload_type: str, body: bytes) -> bytes:
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def sign(body: bytes, key: PrivateKey, payload_type: str = PAYLOAD_TYPE) -> bytes:
    """The JSON envelope (bytes) of `body` signed with `key`."""
    signature = key.sign(pae(payload_type, body))
    return json.dumps({"payloadType": payload_type, "payload": base64.b64encode(body).decode(),
                       "signatures": [{"keyid": "", "sig": base64.b64encode(signature).decode()}]},
                      separators=(",", ":")).encode()


def _b64(value: object, field: str) -> bytes:
    if not isinstance(value, str):
        raise EnvelopeError(f"DSSE envelope: {field} is {type(value).__name__}, not a base64 string")
    s = value.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(s + "=" * (-len(s) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise EnvelopeError(f"DSSE envelope: {field} is not base64") from None


@dataclass(frozen=True)
class Opened:
    payload_type: str
    body: bytes            # exactly the bytes the signature was checked over
    verified: bool         # a signature in it verifies with the key


def open_envelope(data: bytes, key: PublicKey) -> Opened:
    try:
        env = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise EnvelopeError("DSSE envelope: not JSON") from None
    if not isinstance(env, dict):
        raise EnvelopeError("DSSE envelope: not a JSON object")
    for name in ("payload", "payloadType", "signatures"):
        if name not in env:
            raise EnvelopeError(f"DSSE envelope: no {name!r} field")
    if not isinstance(env["payloadType"], str) or not isinstance(env["signatures"], list):
        raise EnvelopeError("DSSE envelope: payloadType must be a string and signatures a list")
    body = _b64(env["payload"], "payload")
    signed = pae(env["payloadType"], body)
    verified = False
    for i, s in enumerate(env["signatures"]):
        if not isinstance(s, dict) or "sig" not in s:
            raise EnvelopeError(f"DSSE envelope: signatures[{i}] has no 'sig'")
        if key.verifies(signed, _b64(s["sig"], f"signatures[{i}].sig")):
            verified = True
            break
    return Opened(env["payloadType"], body, verified)
