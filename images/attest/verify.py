"""Verify an image before anything trusts it: `promote` before it moves a tag, `up --verify` before it
rents anything. Given an image reference and a public key:

    1. the manifest: the tag (or digest) resolved, its bytes hashed here: that digest is what is checked
    2. the signature: <repo>:sha256-<hex>.sig has a layer whose signature verifies with the key over a
       Simple Signing payload that names exactly this digest
    3. the attestations: <repo>:sha256-<hex>.att has, for each of SBOM, provenance and the gate's
       verdict, a DSSE envelope that verifies with the key (over the PAE of its bytes) whose in-toto
       statement has this digest as a subject
    4. the verdict says passed (every verified verdict about this digest does)

These are the checks `cosign verify --key` (steps 1-2: the signature, then its payload's
docker-manifest-digest, pkg/cosign/verifiers.go SimpleClaimVerifier) and `cosign verify-attestation --key
--type T` (step 3: IntotoSubjectClaimVerifier) make, read at cosign v3.0.5; step 4 is Kiln's policy.
Key-based signatures are not in a transparency log, so cosign needs --insecure-ignore-tlog=true for them.

Every failure is one line: what failed, on which image, and the fix. A layer changed after signing makes a
new manifest digest: unsigned, or (when a signature was copied to it) a signature over another digest.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from supervisor.errors import KilnError

from ..registry import ImageRef, RegistryClient, RegistryError, parse_ref
from . import dsse, simplesigning, store, verdict
from .keys import PublicKey
from .sign import PROVENANCE_TYPE, SBOM_TYPE

STATEMENT_TYPES = ("https://in-toto.io/Statement/v1", "https://in-toto.io/Statement/v0.1")
# (what, predicate types that count, how to make it)
SBOM = ("SBOM", (SBOM_TYPE, "https://spdx.dev/Document/v2.3"), "--attest DIR (the build's attest/)")
PROVENANCE = ("provenance", (PROVENANCE_TYPE,), "--attest DIR (the build's attest/)")
VERDICT = ("selftest verdict", (verdict.PREDICATE_TYPE,), "--verdict verdict.json (what the GPU gate printed)")


class VerifyFailed(KilnError):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class Verified:
    name: str
    digest: str
    lines: tuple[str, ...]        # what was checked, one line each


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _sign_hint(name: str, digest: str, what: str = "") -> str:
    return f"`python build.py sign --target T --image {name}@{digest} --key FILE{what}`"


def signature_problems(client: RegistryClient, image: ImageRef, digest: str, key: PublicKey) -> list[str]:
    ref, tag = f"{image.name}@{digest}", store.tag_for(digest, store.SIG)
    layers = store.read(client, image, digest, store.SIG)
    if not layers:
        return [f"{ref}: unsigned: no signature at {image.name}:{tag}. Fix: sign this digest ("
                f"{_sign_hint(image.name, digest)}), or deploy the digest that was signed"]
    others = []
    for layer in layers:
        if layer.media_type != simplesigning.MEDIA_TYPE:
            continue
        try:
            raw = base64.b64decode(layer.annotations.get(store.SIGNATURE_ANNOTATION, ""), validate=True)
        except (binascii.Error, ValueError):
            continue
        if not key.verifies(layer.blob, raw):
            continue
        named = simplesigning.signed_digest(layer.blob)
        if named == digest:
            return []
        others.append(str(named))
    if others:
        return [f"{ref}: the signature at {image.name}:{tag} is over {', '.join(sorted(set(others)))}, not this "
                f"manifest ({digest}): the manifest or a layer changed after signing, or the signature was copied "
                "from another image. Fix: deploy the digest that was signed, or rebuild, gate and sign"]
    return [f"{ref}: the signature at {image.name}:{tag} does not verify with {key.describe()}: signed with "
            "another key, or altered. Fix: --key the public key of the key that signed it, or re-sign with yours "
            f"({_sign_hint(image.name, digest)})"]


def _statements(client: RegistryClient, image: ImageRef, digest: str,
                key: PublicKey) -> tuple[list[dict[str, Any]], int, bool]:
    """The statements of .att envelopes that verify with the key; how many did not; whether .att exists."""
    layers = store.read(client, image, digest, store.ATT)
    if layers is None:
        return [], 0, False
    good, bad = [], 0
    for layer in layers:
        try:
            opened = dsse.open_envelope(layer.blob, key)
        except dsse.EnvelopeError:
            bad += 1
            continue
        if not opened.verified or opened.payload_type != dsse.PAYLOAD_TYPE:
            bad += 1
            continue
        try:
            st = json.loads(opened.body)
        except (ValueError, UnicodeDecodeError):
            bad += 1
            continue
        if isinstance(st, dict) and st.get("_type") in STATEMENT_TYPES:
            good.append(st)
        else:
            bad += 1
    return good, bad, True


def _subjects(st: dict[str, Any]) -> list[str]:
    out = []
    for s in st.get("subject") or []:
        if isinstance(s, dict) and isinstance(s.get("digest"), dict) and isinstance(s["digest"].get("sha256"), str):
            out.append("sha256:" + s["digest"]["sha256"])
    return out


def attestation_problems(client: RegistryClient, image: ImageRef, digest: str, key: PublicKey, *,
                         require_verdict: bool = True) -> tuple[list[str], list[str]]:
    """(problems, lines checked) for the SBOM, provenance and (unless not required) verdict attestations.
    Kinds that fail the same way share one line."""
    ref, tag = f"{image.name}@{digest}", store.tag_for(digest, store.ATT)
    kinds = (SBOM, PROVENANCE) + ((VERDICT,) if require_verdict else ())
    names = _and([k[0] for k in kinds])
    hows = " ".join(dict.fromkeys(k[2].split(" (")[0] for k in kinds))
    statements, unverified, exists = _statements(client, image, digest, key)
    if not exists:
        return [f"{ref}: no attestations at {image.name}:{tag} (wanted: {names}). Fix: "
                f"{_sign_hint(image.name, digest, ' ' + hows)}"], []
    if not statements:
        return [f"{ref}: none of the {unverified} attestation(s) at {image.name}:{tag} verifies with "
                f"{key.describe()}: made with another key, or altered. Fix: --key the public key of the key that "
                f"signed them, or attest with yours ({_sign_hint(image.name, digest, ' ' + hows)})"], []
    problems, lines = [], []
    foreign: dict[tuple[str, ...], list[tuple[str, str]]] = {}    # other digests -> (kind, how) about them
    missing: list[tuple[str, str, str]] = []
    for what, types, how in kinds:
        of_type = [st for st in statements if st.get("predicateType") in types]
        mine = [st for st in of_type if digest in _subjects(st)]
        if not mine and of_type:
            about = tuple(sorted({d for st in of_type for d in _subjects(st)}))
            foreign.setdefault(about, []).append((what, how.split(" (")[0]))
            continue
        if not mine:
            missing.append((what, types[0], how))
            continue
        if types[0] == verdict.PREDICATE_TYPE:
            failed = [st for st in mine if verdict.failures(st.get("predicate"))]
            if failed:
                pred = failed[0].get("predicate")
                said = verdict.describe(pred) if isinstance(pred, dict) else "no predicate"
                problems.append(f"{ref}: the GPU gate's verdict is {said}. Fix: an image that failed its gate is "
                                "never promoted or deployed with --verify: fix what the selftest found, then build, "
                                "gate and sign a new image")
                continue
            lines.append(f"{ref}: gate verdict {verdict.describe(mine[-1]['predicate'])}")
        else:
            lines.append(f"{ref}: {what} attestation verified ({mine[-1].get('predicateType')})")
    for about, whats in foreign.items():
        many = len(whats) > 1
        about_s = ", ".join(about) or "no digest"
        problems.append(f"{ref}: the {_and([w for w, _ in whats])} attestation{'s' if many else ''} at "
                        f"{image.name}:{tag} {'are' if many else 'is'} about {about_s}, not this image ({digest}): "
                        "made for another image. Fix: attest this image's own "
                        f"({_sign_hint(image.name, digest, ' ' + ' '.join(dict.fromkeys(h for _, h in whats)))})")
    for what, ptype, how in missing:
        why = f"{unverified} other(s) there do not verify with {key.describe()}" if unverified else "none there"
        problems.append(f"{ref}: no {what} attestation ({ptype}) at {image.name}:{tag} ({why}). Fix: "
                        f"{_sign_hint(image.name, digest, ' ' + how)}")
    return problems, lines


def resolve(client: RegistryClient, ref: str) -> tuple[ImageRef, str]:
    """The image and the digest of the manifest it names (hashed here)."""
    image = parse_ref(ref)
    found = client.manifest(image)
    if found is None:
        raise VerifyFailed([f"{ref}: {image.registry} has no manifest for {image.repo}:{image.reference}. Fix: name "
                            "an image that exists (push it first)"])
    return image, found.digest


def verify_digest(client: RegistryClient, image: ImageRef, digest: str, key: PublicKey, *,
                  require_verdict: bool = True) -> Verified:
    problems = signature_problems(client, image, digest, key)
    more, lines = attestation_problems(client, image, digest, key, require_verdict=require_verdict)
    if problems or more:
        raise VerifyFailed(problems + more)
    return Verified(image.name, digest, (f"{image.name}@{digest}: signature verified with {key.describe()}", *lines))


def verify(client: RegistryClient, ref: str, key: PublicKey, *, require_verdict: bool = True) -> Verified:
    """Every check on the image `ref` names; raises VerifyFailed with one line per problem."""
    try:
        image, digest = resolve(client, ref)
        return verify_digest(client, image, digest, key, require_verdict=require_verdict)
    except RegistryError as e:
        raise VerifyFailed([f"{ref}: could not be verified: {e}"]) from None
