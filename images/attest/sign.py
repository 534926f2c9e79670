"""Sign one pushed image with a key the user holds: a signature over its manifest digest, and
DSSE-signed in-toto statements about that digest for the SBOM, the provenance and the GPU gate's verdict,
stored beside the image (store.py). Each part is optional but the signature; `verify` wants all four.

    signature    Simple Signing payload naming the digest (simplesigning.py), ECDSA P-256 (keys.py)
    SBOM         attest/sbom.spdx.json as the predicate, predicateType https://spdx.dev/Document
    provenance   attest/provenance.predicate.json, predicateType https://slsa.dev/provenance/v1
    verdict      the gate's JSON (verdict.py), predicateType https://kiln.dev/selftest-verdict/v1

The statement is in-toto Statement v1 (statement.py; in-toto/attestation spec/v1/statement.md, read at commit
051624ce): _type https://in-toto.io/Statement/v1, one subject {name: <registry>/<repo>, digest:
{sha256: <hex>}}, as `cosign attest` and actions/attest name an image subject. The predicate types are
in-toto's own for SPDX 2 (spec/predicates/spdx2.md) and SLSA provenance v1, the ones cosign's `--type
spdxjson` and `--type slsaprovenance1` stand for (cmd/cosign/cli/options/predicate.go).

Nothing is signed for a digest the registry does not serve, nor a verdict the gate reached on another
image or target.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.errors import KilnError

from ..registry import ImageRef, RegistryClient, parse_ref
from . import dsse, simplesigning, store, verdict
from .keys import PrivateKey
from .statement import SLSA_PROVENANCE_V1 as PROVENANCE_TYPE
from .statement import SPDX_DOCUMENT as SBOM_TYPE
from .statement import statement
SBOM_FILE = "sbom.spdx.json"                        # B's build writes these two into attest/ (issue 53)
PROVENANCE_FILE = "provenance.predicate.json"


class SignError(KilnError):
    pass


@dataclass(frozen=True)
class Request:
    image: str                       # REF@sha256:…
    target: str
    attest_dir: Path | None = None   # the build's attest/ directory: SBOM and provenance
    verdict_file: Path | None = None # what `python -m images.ci gate` printed


def _json_file(option: str, path: Path) -> Any:
    if not path.is_file():
        raise SignError(f"{option}: {path} is missing (the build writes it into its attest/ directory)")
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise SignError(f"{option}: {path} is not JSON ({e})") from None


def predicates(req: Request, image: ImageRef, client: RegistryClient) -> list[tuple[str, dict]]:
    """(predicateType, predicate) for every attestation asked for, each checked before anything is written."""
    out: list[tuple[str, dict]] = []
    if req.attest_dir is not None:
        for name, ptype in ((SBOM_FILE, SBOM_TYPE), (PROVENANCE_FILE, PROVENANCE_TYPE)):
            doc = _json_file("--attest", req.attest_dir / name)
            if not isinstance(doc, dict):
                raise SignError(f"--attest: {req.attest_dir / name} is {type(doc).__name__}, not a JSON object")
            out.append((ptype, doc))
    if req.verdict_file is not None:
        pred = verdict.predicate(_json_file("--verdict", req.verdict_file), f"--verdict {req.verdict_file}")
        if pred["target"] != req.target:
            raise SignError(f"--verdict {req.verdict_file}: the gate ran target {pred['target']!r}, not --target "
                            f"{req.target}: sign each image with its own gate's verdict")
        gated = parse_ref(pred["image"])
        ran = gated.digest
        if ran is None:
            found = client.manifest(gated)
            ran = found.digest if found else None
        if ran != image.digest:
            ran_desc = ran or "no longer in its registry"
            raise SignError(f"--verdict {req.verdict_file}: the gate ran {pred['image']} ({ran_desc}), not "
                            f"{image.digest}: a verdict is signed only for the image it judged; "
                            "gate this digest (`python -m images.ci gate --image REPO@sha256:...`)")
        out.append((verdict.PREDICATE_TYPE, pred))
    return out


def sign(client: RegistryClient, req: Request, key: PrivateKey) -> list[str]:
    """Sign and push; returns one line per thing written."""
    image = parse_ref(req.image)
    if image.digest is None:
        raise SignError(f"--image {req.image}: name the digest to sign (REPO@sha256:…, what the push printed): a "
                        "tag can move between reading it and signing it")
    if client.manifest(image) is None:
        raise SignError(f"--image {req.image}: {image.registry} has no manifest {image.digest} in {image.repo}: "
                        "push the image first, and sign the digest the push printed")
    attestations = predicates(req, image, client)     # every input checked before anything is written
    lines = []
    payload = simplesigning.payload(image.name, image.digest, {"io.kiln.target": req.target})
    layer = store.Layer(simplesigning.MEDIA_TYPE, payload,
                        {store.SIGNATURE_ANNOTATION: base64.b64encode(key.sign(payload)).decode()})

    def same_signature(old: store.Layer) -> bool:       # this key already signed this payload: keep one
        sig = old.annotations.get(store.SIGNATURE_ANNOTATION, "")
        try:
            raw = base64.b64decode(sig, validate=True)
        except ValueError:
            return False
        return old.blob == payload and key.public.verifies(payload, raw)

    tag = store.merge(client, image, image.digest, store.SIG, [layer], same_signature)
    lines.append(f"signed {image.at(image.digest)}: {image.name}:{tag}")
    if attestations:
        hexdigest = image.digest.split(":", 1)[1]
        new = []
        for ptype, pred in attestations:
            body = json.dumps(statement(image.name, hexdigest, ptype, pred), separators=(",", ":")).encode()
            new.append(store.Layer(dsse.MEDIA_TYPE, dsse.sign(body, key),
                                   {store.PREDICATE_ANNOTATION: ptype, store.SIGNATURE_ANNOTATION: ""}))
        types = {ptype for ptype, _ in attestations}

        def superseded(old: store.Layer) -> bool:       # the same key's earlier attestation of a type re-signed now
            if old.annotations.get(store.PREDICATE_ANNOTATION) not in types:
                return False
            try:
                return dsse.open_envelope(old.blob, key.public).verified
            except dsse.EnvelopeError:
                return False

        tag = store.merge(client, image, image.digest, store.ATT, new, superseded)
        for ptype, pred in attestations:
            what = verdict.describe(pred) if ptype == verdict.PREDICATE_TYPE else ptype
            lines.append(f"attested {image.at(image.digest)}: {ptype} in {image.name}:{tag}"
                         + (f" ({what})" if ptype == verdict.PREDICATE_TYPE else ""))
    return lines
