"""Signing a test image as a release is signed: the signature over its digest and the three
attestations (images/attest/sign.py), with a key made here.

The SBOM and provenance documents are minimal stand-ins for what the build writes into attest/ (issue 53's
SBOM/provenance builders, images/attest/sbom.py and provenance.py): an SPDX 2.3 document and a SLSA
provenance v1 predicate with only their required top-level fields, each naming the image it describes, so
two images' documents differ. The verdict is what `python -m images.ci gate` prints, for that image."""

from __future__ import annotations

import json
from pathlib import Path

from images.attest import keys
from images.attest.sign import Request, sign
from images.registry import client_for

TARGET = "cpu-llamacpp"


def make_key(root: Path, name: str) -> tuple[keys.PrivateKey, Path]:
    key, pub, _ = keys.generate(root / name)
    return keys.load_private(key), pub


def attest_dir(root: Path, image: str) -> Path:
    d = root / ("attest-" + image.rsplit("@", 1)[-1].replace(":", "-"))
    d.mkdir(exist_ok=True)
    (d / "sbom.spdx.json").write_text(json.dumps({
        "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT", "name": image,
        "documentNamespace": f"https://kiln.invalid/spdx/{image}", "creationInfo": {
            "created": "2026-12-07T00:00:00Z", "creators": ["Tool: kiln-test"]}, "packages": []}))
    (d / "provenance.predicate.json").write_text(json.dumps({
        "buildDefinition": {"buildType": "https://kiln.invalid/test-build", "externalParameters": {"image": image}},
        "runDetails": {"builder": {"id": "https://kiln.invalid/test-builder"}}}))
    return d


def verdict_file(root: Path, image: str, *, passed: bool = True, target: str = TARGET) -> Path:
    path = root / ("verdict-" + image.rsplit("@", 1)[-1].replace(":", "-") + ".json")
    summary = "passed (probes 5/5, decode 61.20 tok/s on 256 tokens)" if passed else \
        "FAILED: probe arithmetic: expected 4 (probes 4/5)"
    path.write_text(json.dumps({
        "target": target, "image": image, "passed": passed, "state": "READY" if passed else "FAILED",
        "reason": "ready, selftest passed" if passed else "FAILED: selftest: probe arithmetic: expected 4",
        "selftest": {"passed": passed, "summary": summary, "decode_tok_s": 61.2,
                     "failures": [] if passed else ["probe arithmetic: expected 4"]},
        "gate": "local", "gpus": ["NVIDIA H100 80GB HBM3"], "driver": "580.159.04",
        "finished": "2026-12-07T10:00:00Z"}))
    return path


def sign_all(root: Path, image: str, key: keys.PrivateKey, *, passed: bool = True) -> list[str]:
    """Sign `image` (REF@sha256:…) and attest its SBOM, provenance and gate verdict."""
    host = image.split("/", 1)[0]
    return sign(client_for(host), Request(image, TARGET, attest_dir(root, image),
                                          verdict_file(root, image, passed=passed)), key)
