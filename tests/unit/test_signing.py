"""The formats a signed image is made of, checked against their specifications' own examples:
DSSE's PAE and its published ECDSA P-256 test vector (secure-systems-lab/dsse protocol.md, "Test
Vectors"), cosign's Simple Signing payload and storage tags (sigstore/cosign specs/SIGNATURE_SPEC.md), the
gate verdict predicate, key files, and how `gh attestation verify`'s JSON is read."""

from __future__ import annotations

import base64
import json
import subprocess

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from images.attest import dsse, keys, simplesigning, store, verdict
from images.ci.gh_attestations import GhVerifier

# protocol.md, "Test Vectors": the public point and the envelope it signed (raw r||s signature).
VECTOR_X = 46950820868899156662930047687818585632848591499744589407958293238635476079160
VECTOR_Y = 5640078356564379163099075877009565129882514886557779369047442380624545832820
VECTOR_SIG = "A3JqsQGtVsJ2O2xqrI5IcnXip5GToJ3F+FnZ+O88SjtR6rDAajabZKciJTfUiHqJPcIAriEGAHTVeCUjW2JIZA=="


def test_pae_is_the_specs_example():
    assert dsse.pae("http://example.com/HelloWorld", b"hello world") == \
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


def test_the_specs_test_vector_verifies_over_our_pae():
    pub = keys.PublicKey(ec.EllipticCurvePublicNumbers(VECTOR_X, VECTOR_Y, ec.SECP256R1()).public_key(), "vector")
    raw = base64.b64decode(VECTOR_SIG)
    der = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
    envelope = json.dumps({"payload": "aGVsbG8gd29ybGQ=", "payloadType": "http://example.com/HelloWorld",
                           "signatures": [{"sig": base64.b64encode(der).decode()}]}).encode()
    opened = dsse.open_envelope(envelope, pub)
    assert opened.verified and opened.body == b"hello world"
    forged = envelope.replace(b"aGVsbG8gd29ybGQ=", base64.b64encode(b"hello worle"))
    assert not dsse.open_envelope(forged, pub).verified


def test_an_envelope_signed_here_verifies_in_both_base64_alphabets_and_not_with_another_key(tmp_path):
    key = keys.load_private(keys.generate(tmp_path / "k")[0])
    other = keys.load_private(keys.generate(tmp_path / "o")[0])
    body = b'{"_type":"https://in-toto.io/Statement/v1","x":"\xff?>"}'
    env = json.loads(dsse.sign(body, key))
    assert env["payloadType"] == "application/vnd.in-toto+json" and env["signatures"][0]["keyid"] == ""
    assert dsse.open_envelope(json.dumps(env).encode(), key.public).verified
    env["payload"] = base64.urlsafe_b64encode(body).decode().rstrip("=")
    env["signatures"][0]["sig"] = env["signatures"][0]["sig"].replace("+", "-").replace("/", "_")
    assert dsse.open_envelope(json.dumps(env).encode(), key.public).body == body
    assert not dsse.open_envelope(json.dumps(env).encode(), other.public).verified
    with pytest.raises(dsse.EnvelopeError, match="no 'signatures' field"):
        dsse.open_envelope(b'{"payload": "", "payloadType": "x"}', key.public)


def test_the_signature_payload_and_its_tags_are_cosigns():
    digest = "sha256:" + "ab" * 32
    payload = json.loads(simplesigning.payload("ghcr.io/you/kiln", digest, {"io.kiln.target": "t"}))
    assert payload["critical"] == {"identity": {"docker-reference": "ghcr.io/you/kiln"},
                                   "image": {"docker-manifest-digest": digest},
                                   "type": "cosign container image signature"}
    assert simplesigning.signed_digest(json.dumps(payload).encode()) == digest
    assert simplesigning.signed_digest(b'{"critical": {"type": "something else"}}') is None
    assert store.tag_for(digest, store.SIG) == "sha256-" + "ab" * 32 + ".sig"
    assert store.tag_for(digest, store.ATT).endswith(".att")


GATE = {"target": "a40-vllm", "image": "ghcr.io/you/kiln@sha256:" + "cd" * 32, "passed": True, "state": "READY",
        "reason": "ready, selftest passed", "gate": "runpod", "gpus": ["NVIDIA A40", "NVIDIA A40"],
        "driver": "580.159.04", "finished": "2026-12-07T10:00:00Z",
        "selftest": {"passed": True, "summary": "passed (probes 5/5)", "decode_tok_s": 31.5, "probes": ["..."]}}


def test_the_verdict_predicate_keeps_the_key_figures_and_the_gpu():
    pred = verdict.predicate(GATE)
    assert pred["gpu"] == {"names": ["NVIDIA A40", "NVIDIA A40"], "count": 2, "driver": "580.159.04"}
    assert pred["selftest"]["decode_tok_s"] == 31.5 and "probes" not in pred["selftest"]
    assert verdict.failures(pred) == []
    assert verdict.describe(pred) == "passed: passed (probes 5/5) (target a40-vllm, 2x NVIDIA A40, runpod " \
                                     "2026-12-07T10:00:00Z)"
    failed = verdict.predicate({**GATE, "passed": False, "selftest": {**GATE["selftest"], "passed": False}})
    assert verdict.failures(failed) == ["passed = False", "selftest.passed = False"]
    with pytest.raises(verdict.VerdictError) as e:
        verdict.predicate({"target": 3, "image": "x", "passed": "yes", "state": "READY", "finished": "today"})
    for said in ("target = 3: expected a str", "passed = 'yes': expected a bool", "reason = None",
                 "finished = 'today': expected an RFC 3339 time"):
        assert said in str(e.value)


def test_key_files_are_refused_by_name_never_shown(tmp_path, monkeypatch):
    monkeypatch.delenv(keys.PASSWORD_ENV, raising=False)
    key_path, pub_path, encrypted = keys.generate(tmp_path / "k")
    assert not encrypted and oct(key_path.stat().st_mode & 0o777) == "0o600"
    with pytest.raises(keys.KeyFileError, match="already exist"):
        keys.generate(tmp_path / "k")
    with pytest.raises(keys.KeyFileError, match="a public key; signing takes the private key"):
        keys.load_private(pub_path)
    with pytest.raises(keys.KeyFileError, match="a private key; verifying takes only the public key") as e:
        keys.load_public(key_path)
    assert key_path.read_text().splitlines()[1] not in str(e.value)
    p384 = tmp_path / "p384.pub"
    from cryptography.hazmat.primitives import serialization
    p384.write_bytes(ec.generate_private_key(ec.SECP384R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(keys.KeyFileError, match="an EC secp384r1 key; Kiln signs with ECDSA P-256"):
        keys.load_public(p384)
    with pytest.raises(keys.KeyFileError, match=r"\$KILN_VERIFY_KEY"):
        monkeypatch.delenv(keys.VERIFY_KEY_ENV, raising=False)
        keys.verify_key(None)


def test_an_openssl_made_key_signs(tmp_path):
    """docs/images.md's openssl recipe: a SEC1 `EC PRIVATE KEY` and its public half."""
    subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out",
                    str(tmp_path / "o.key")], check=True, capture_output=True)
    subprocess.run(["openssl", "ec", "-in", str(tmp_path / "o.key"), "-pubout", "-out", str(tmp_path / "o.pub")],
                   check=True, capture_output=True)
    key, pub = keys.load_private(tmp_path / "o.key"), keys.load_public(tmp_path / "o.pub")
    assert pub.verifies(b"x", key.sign(b"x")) and key.public.fingerprint == pub.fingerprint


class GhStandIn:
    """Stands for the GitHub CLI (`gh attestation verify`), which needs GitHub's API and Sigstore's trust
    root: answers per predicate type with an exit status and the JSON shape gh's help documents
    (an array of {attestation, verificationResult: {statement: {subject, predicateType, predicate}}})."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def __call__(self, argv):
        self.calls.append(argv)
        rc, predicate = self.answers[argv[argv.index("--predicate-type") + 1]]
        out = json.dumps([{"attestation": {}, "verificationResult": {"statement": {
            "subject": [{"name": "ghcr.io/you/kiln", "digest": {"sha256": "ab" * 32}}],
            "predicateType": argv[argv.index("--predicate-type") + 1], "predicate": predicate}}}]) if rc == 0 else ""
        return subprocess.CompletedProcess(argv, rc, out, "" if rc == 0 else "✗ No attestations found with predicate "
                                           "type: x\n")


def test_gh_verification_asks_each_type_and_reads_the_verdict():
    ok = verdict.predicate(GATE)
    gh = GhStandIn({"https://spdx.dev/Document/v2.3": (0, {}), "https://slsa.dev/provenance/v1": (0, {}),
                    verdict.PREDICATE_TYPE: (0, ok)})
    v = GhVerifier("you/kiln", "you/kiln/.github/workflows/images.yml", run=gh)
    assert v("ghcr.io/you/kiln", "sha256:" + "ab" * 32) == []
    assert gh.calls[0] == ["gh", "attestation", "verify", "oci://ghcr.io/you/kiln@sha256:" + "ab" * 32, "--repo",
                           "you/kiln", "--predicate-type", "https://spdx.dev/Document/v2.3", "--format", "json",
                           "--signer-workflow", "you/kiln/.github/workflows/images.yml"]
    gh.answers[verdict.PREDICATE_TYPE] = (0, {**ok, "passed": False})
    (failed,) = v("ghcr.io/you/kiln", "sha256:" + "ab" * 32)
    assert "the GPU gate's verdict is FAILED" in failed
    gh.answers["https://spdx.dev/Document/v2.3"] = (1, None)
    assert "no SBOM attestation (https://spdx.dev/Document/v2.3) verified by `gh attestation verify --repo you/kiln`: " \
           "✗ No attestations found" in v("ghcr.io/you/kiln", "sha256:" + "ab" * 32)[0]
