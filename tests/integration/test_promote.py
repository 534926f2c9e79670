"""Promote-on-pass against a real OCI registry on loopback (kiln_dev/registry.py, the CNCF
distribution server; stands for ghcr.io): staging tags are copied to release tags all or nothing,
an immutable tag never moves, and nothing is tagged before every check passed. Every image here is
signed and attested (tests/support/signing.py): promote verifies each first (what it refuses:
tests/integration/test_signed_images.py)."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from images.ci import promote
from images.build import tags
from images.pins.lock import load_lock, pins_for
from images.attest.keys import load_public
from images.ci.promote import Promotion, PromoteError, RegistryClient, key_verifier
from images.target import load_target
from kiln_dev.registry import Registry, push_image
from tests.support.signing import make_key, sign_all

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = Registry(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.close()


@pytest.fixture(scope="module")
def signer(tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    key, pub = make_key(root, "kiln")

    def push_signed(host, repo, tag, marker):
        digest = push_image(host, repo, tag, marker)
        sign_all(root, f"{host}/{repo}@{digest}", key)
        return digest
    push_signed.pub = pub
    return push_signed


def verifier(client, signer):
    return key_verifier(client, load_public(signer.pub))


def digest_of(client, ref):
    m = client.get(ref)
    return m.digest if m else None


def test_promotes_all_or_nothing_and_never_moves_an_immutable_tag(registry, signer):
    h = registry.host
    client = RegistryClient(scheme="http")
    a = signer(h, "kiln", "staging-a-1", "a")
    b = signer(h, "kiln", "staging-b-1", "b")
    runs = [Promotion(f"{h}/kiln:staging-a-1", (f"{h}/kiln:a-0.1.0-aaaa",), (f"{h}/kiln:a",)),
            Promotion(f"{h}/kiln:staging-b-1", (f"{h}/kiln:b-0.1.0-bbbb",), (f"{h}/kiln:b",))]
    lines = promote.promote(runs, client, verifier(client, signer))
    assert digest_of(client, f"{h}/kiln:a-0.1.0-aaaa") == a == digest_of(client, f"{h}/kiln:a")
    assert digest_of(client, f"{h}/kiln:b-0.1.0-bbbb") == b == digest_of(client, f"{h}/kiln:b")
    assert len(lines) == 6
    assert lines[:2] == [f"verified {h}/kiln:staging-a-1 ({a})", f"verified {h}/kiln:staging-b-1 ({b})"]

    # The same run again: nothing moves, nothing fails.
    assert all(line.startswith("verified") or "already" in line or "->" in line
               for line in promote.promote(runs, client, verifier(client, signer)))

    # A rebuilt image under the same immutable tag is refused, and the whole promotion with it:
    # b's moving tag does not move even though b itself would have been fine.
    a2 = signer(h, "kiln", "staging-a-2", "a-rebuilt")
    b2 = signer(h, "kiln", "staging-b-2", "b-rebuilt")
    bad = [Promotion(f"{h}/kiln:staging-b-2", (f"{h}/kiln:b-0.1.1-bbbb",), (f"{h}/kiln:b",)),
           Promotion(f"{h}/kiln:staging-a-2", (f"{h}/kiln:a-0.1.0-aaaa",), (f"{h}/kiln:a",))]
    with pytest.raises(PromoteError, match="an immutable tag never moves") as e:
        promote.promote(bad, client, verifier(client, signer))
    assert "nothing promoted" in str(e.value)
    assert digest_of(client, f"{h}/kiln:a-0.1.0-aaaa") == a and digest_of(client, f"{h}/kiln:a") == a
    assert digest_of(client, f"{h}/kiln:b") == b and digest_of(client, f"{h}/kiln:b-0.1.1-bbbb") is None
    assert a2 != a and b2 != b


def test_missing_staging_and_foreign_repository_are_refused_before_any_write(registry, signer):
    h = registry.host
    client = RegistryClient(scheme="http")
    signer(h, "kiln", "staging-c-1", "c")
    with pytest.raises(PromoteError) as e:
        promote.promote([Promotion(f"{h}/kiln:staging-c-1", (f"{h}/other:c-1",)),
                         Promotion(f"{h}/kiln:staging-none", (f"{h}/kiln:none-1",))], client, verifier(client, signer))
    assert "not in the staging image's repository" in str(e.value) and "no such staging image" in str(e.value)
    assert digest_of(client, f"{h}/other:c-1") is None and digest_of(client, f"{h}/kiln:none-1") is None


def test_ci_promote_command_uses_the_matrix_tags(registry, signer):
    """`python -m images.ci promote`, as the workflow runs it, on the tags `matrix` computed."""
    h = registry.host
    target = load_target("cpu-llamacpp")
    release = tags.release_tag(target, pins_for(target, load_lock()), f"{h}/kiln")
    staging = tags.staging_tag(release, "777-1")
    _, repo_tag = staging.split("/", 1)
    digest = signer(h, repo_tag.split(":")[0], repo_tag.split(":")[1], "cpu")
    argv = [sys.executable, "-m", "images.ci", "promote", "--run-id", "777-1", "--targets", "cpu-llamacpp",
            "--image", f"{h}/kiln", "--scheme", "http"]
    unverified = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    assert unverified.returncode == 2 and "promote verifies every image before it moves a tag" in unverified.stderr
    assert digest_of(RegistryClient(scheme="http"), release) is None
    r = subprocess.run(argv + ["--key", str(signer.pub)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    client = RegistryClient(scheme="http")
    assert digest_of(client, release) == digest == digest_of(client, f"{h}/kiln:cpu-llamacpp")
    r = subprocess.run([sys.executable, "-m", "images.ci", "promote", "--run-id", "777-1", "--targets",
                        "a40-llamacpp", "--image", f"{h}/kiln", "--scheme", "http", "--key", str(signer.pub)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "not releasable" in r.stderr
