"""Signed images (issue 53): an image is trusted only when a signature over its exact manifest digest
and its SBOM, provenance and passed GPU-gate verdict, attested about that digest, verify with the
user's public key. `promote` refuses (all or nothing) and `up --verify` rents nothing otherwise, and each
says what failed and the fix:

    a changed layer   the tag now names a new manifest: unsigned
    a copied signature  a signature over another digest
    a swapped SBOM    an attestation made for another image
    a failed gate     the verdict says FAILED
    unsigned          no signature at all
    a wrong key       signed, but not by the key given

kiln_dev/registry.py is a real registry (Debian's docker-registry, the CNCF distribution server 2.8) on
loopback, standing for ghcr.io; the images are real OCI images pushed to it (kiln_dev.registry.push_image).
kiln_dev/runpod stands for RunPod's REST API v2 (nothing is created there unless the checks pass)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from images.attest import store
from images.ci.promote import Promotion, PromoteError, key_verifier, promote
from images.registry import RegistryClient, client_for, parse_ref
from kiln_dev.registry import Registry, push_image
from kiln_dev.runpod import ClusterStandIn, gpu_type
from tests.support.signing import TARGET, make_key, sign_all

ROOT = Path(__file__).resolve().parents[2]
RUNPOD_KEY = "rpa_signed-images-canary-53"


@dataclass
class World:
    root: Path
    host: str
    key: object
    pub: Path
    other_pub: Path
    digests: dict[str, str]
    client: RegistryClient


def _copy(client: RegistryClient, host: str, src: str, dst: str, kind: str, drop_sbom_of: str | None = None,
          sbom_from: str | None = None) -> None:
    """An attacker's registry write: the .sig/.att of digest `src` stored under digest `dst`'s tag."""
    image = parse_ref(f"{host}/kiln")
    layers = store.read(client, image, src, kind) or []
    if sbom_from is not None:
        foreign = [x for x in store.read(client, image, sbom_from, kind) or []
                   if x.annotations.get(store.PREDICATE_ANNOTATION) == "https://spdx.dev/Document"]
        layers = [x for x in layers if x.annotations.get(store.PREDICATE_ANNOTATION) != "https://spdx.dev/Document"]
        layers = foreign + layers
    store.write(client, image, dst, kind, layers)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("signed")
    (root / "registry").mkdir()
    reg = Registry(root / "registry")
    try:
        h = reg.host
        client = client_for(h)
        key, pub = make_key(root, "kiln")
        _, other_pub = make_key(root, "other")
        d = {name: push_image(h, "kiln", name, name) for name in ("good", "moved", "copied", "swapped", "failed",
                                                                  "unsigned")}
        for name in ("good", "moved", "swapped"):
            sign_all(root, f"{h}/kiln@{d[name]}", key)
        sign_all(root, f"{h}/kiln@{d['failed']}", key, passed=False)
        # A changed layer: a rebuilt image pushed over the signed tag is a new manifest digest.
        d["moved-rebuilt"] = push_image(h, "kiln", "moved", "moved with a changed layer")
        # The signed image's signature and attestations copied onto another image's digest.
        for kind in (store.SIG, store.ATT):
            _copy(client, h, d["moved"], d["copied"], kind)
        # Another image's (good's) SBOM put in place of swapped's own.
        _copy(client, h, d["swapped"], d["swapped"], store.ATT, sbom_from=d["good"])
        yield World(root, h, key, pub, other_pub, d, client)
    finally:
        reg.close()


# (name, the image to check, which public key, what the refusal says)
TAMPERS = [
    ("changed-layer", "moved", "pub", "unsigned: no signature at"),
    ("copied-signature", "copied", "pub", "is over {moved}, not this manifest ({copied})"),
    ("copied-attestations", "copied", "pub", "the SBOM, provenance and selftest verdict attestations at "
                                             "{host}/kiln:{copied_att} are about {moved}, not this image ({copied})"),
    ("swapped-sbom", "swapped", "pub", "the SBOM attestation at {host}/kiln:{swapped_att} is about {good}, not this "
                                       "image ({swapped}): made for another image"),
    ("failed-gate", "failed", "pub", "the GPU gate's verdict is FAILED: FAILED: probe arithmetic: expected 4"),
    ("unsigned", "unsigned", "pub", "unsigned: no signature at {host}/kiln:{unsigned_sig}"),
    ("wrong-key", "good", "other_pub", "does not verify with {other_pub}"),
    ("wrong-key-attestations", "good", "other_pub", "none of the 3 attestation(s) at {host}/kiln:{good_att} verifies "
                                                    "with {other_pub}"),
]


def _said(w: World, text: str) -> str:
    d = w.digests
    return text.format(host=w.host, moved=d["moved"], copied=d["copied"], good=d["good"], swapped=d["swapped"],
                       swapped_att=store.tag_for(d["swapped"], store.ATT),
                       copied_att=store.tag_for(d["copied"], store.ATT), good_att=store.tag_for(d["good"], store.ATT),
                       other_pub=w.other_pub,
                       unsigned_sig=store.tag_for(d["unsigned"], store.SIG))


def test_a_signed_image_verifies_and_promotes(world):
    r = subprocess.run([sys.executable, str(ROOT / "build.py"), "verify", "--image", f"{world.host}/kiln:good",
                        "--key", str(world.pub)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    for said in ("signature verified with", "SBOM attestation verified (https://spdx.dev/Document)",
                 "provenance attestation verified (https://slsa.dev/provenance/v1)",
                 "gate verdict passed: passed (probes 5/5, decode 61.20 tok/s on 256 tokens) (target cpu-llamacpp, "
                 "1x NVIDIA H100 80GB HBM3, local 2026-12-07T10:00:00Z)"):
        assert said in r.stdout, (said, r.stdout)
    lines = promote([Promotion(f"{world.host}/kiln:good", (f"{world.host}/kiln:good-1.0",), ())], world.client,
                    key_verifier(world.client, _key(world, "pub")))
    assert lines[0] == f"verified {world.host}/kiln:good ({world.digests['good']})"
    assert world.client.get(f"{world.host}/kiln:good-1.0").digest == world.digests["good"]


def _key(w: World, which: str):
    from images.attest.keys import load_public

    return load_public(getattr(w, which))


@pytest.mark.parametrize("name,image,which,said", TAMPERS, ids=[t[0] for t in TAMPERS])
def test_promote_refuses_each_tamper_and_moves_no_tag(world, name, image, which, said):
    h = world.host
    run = [Promotion(f"{h}/kiln:{image}", (f"{h}/kiln:{image}-rel-{name}",), (f"{h}/kiln:{name}-moving",)),
           Promotion(f"{h}/kiln:good", (f"{h}/kiln:good-rel-{name}",), ())]
    with pytest.raises(PromoteError) as e:
        promote(run, world.client, key_verifier(world.client, _key(world, which)))
    assert _said(world, said) in str(e.value), str(e.value)
    assert "nothing promoted" in str(e.value) and "Fix:" in str(e.value)
    for tag in (f"{image}-rel-{name}", f"{name}-moving", f"good-rel-{name}"):    # all or nothing
        assert world.client.get(f"{h}/kiln:{tag}") is None, tag


@pytest.fixture(scope="module")
def standin():
    with ClusterStandIn(RUNPOD_KEY, catalog=[gpu_type("NVIDIA A40"), gpu_type("NVIDIA B200", memory=180)]) as s:
        yield s


def up(standin, *args: str, key_env: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "KILN_", "HF_"))}
    env.update(RUNPOD_API_KEY=RUNPOD_KEY, RUNPOD_API_URL=standin.url, RUNPOD_PROXY_URL=standin.proxy_url)
    if key_env:
        env["KILN_VERIFY_KEY"] = key_env
    return subprocess.run([sys.executable, str(ROOT / "build.py"), *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)


@pytest.mark.parametrize("name,image,which,said", TAMPERS, ids=[t[0] for t in TAMPERS])
def test_pods_up_verify_refuses_each_tamper_and_rents_nothing(world, standin, name, image, which, said):
    r = up(standin, "pods", "up", "--target", "a40-vllm", "--image-ref", f"{world.host}/kiln:{image}",
           "--verify", "--key", str(getattr(world, which)), "--timeout", "1")
    assert r.returncode == 2, r.stdout + r.stderr
    assert _said(world, said) in r.stderr, r.stderr
    assert "nothing was rented" in r.stderr and "--verify: " in r.stderr and "Fix:" in r.stderr
    assert standin.writes() == []


def test_endpoint_and_cluster_up_verify_too_before_anything_is_created(world, standin):
    unsigned = f"{world.host}/kiln@{world.digests['unsigned']}"
    said = _said(world, "unsigned: no signature at {host}/kiln:{unsigned_sig}")
    ep = up(standin, "endpoint", "up", "--target", "a40-vllm", "--image-ref", unsigned, "--verify",
            key_env=str(world.pub))
    assert ep.returncode == 2 and said in ep.stderr, ep.stderr
    cl = up(standin, "cluster", "up", "--target", "b200-vllm", "--image-ref", unsigned, "--verify", "--key",
            str(world.pub), "--timeout", "1")
    assert cl.returncode == 2 and said in cl.stderr, cl.stderr
    assert standin.writes() == [] and standin.clusters == {}


def test_pods_up_verify_passes_a_signed_image_and_names_the_digest_to_pin(world, standin):
    r = up(standin, "pods", "up", "--target", "a40-vllm", "--image-ref", f"{world.host}/kiln:good", "--verify",
           "--key", str(world.pub), "--timeout", "1", "--poll", "0.2")
    assert f"verified {world.host}/kiln@{world.digests['good']}: signature verified with" in r.stderr, r.stderr
    assert f"--image-ref {world.host}/kiln@{world.digests['good']} pins the digest verified here" in r.stderr
    assert len(standin.pods) == 1


def test_sign_from_the_command_line_with_an_encrypted_key(world, tmp_path):
    """keygen + sign as a user runs them: the password only in the environment, never printed; the key's
    PEM in no output; a tag is refused (sign the digest)."""
    password = "correct horse battery 53"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    run = lambda *a, **kw: subprocess.run([sys.executable, str(ROOT / "build.py"), *a], capture_output=True,  # noqa: E731
                                          text=True, cwd=ROOT, timeout=60, env={**env, **kw})
    made = run("keygen", "--out", str(tmp_path / "user"), KILN_SIGNING_KEY_PASSWORD=password)
    assert made.returncode == 0, made.stderr
    pem = (tmp_path / "user.key").read_text()
    assert "ENCRYPTED PRIVATE KEY" in pem and oct((tmp_path / "user.key").stat().st_mode & 0o777) == "0o600"
    digest = push_image(world.host, "cli", "v1", "cli")
    image = f"{world.host}/cli@{digest}"
    from tests.support.signing import attest_dir, verdict_file

    args = ("sign", "--target", TARGET, "--image", image, "--key", str(tmp_path / "user.key"), "--attest",
            str(attest_dir(tmp_path, image)), "--verdict", str(verdict_file(tmp_path, image)))
    no_password = run(*args)
    assert no_password.returncode == 2
    assert "the key is encrypted: export KILN_SIGNING_KEY_PASSWORD" in no_password.stderr
    wrong = run(*args, KILN_SIGNING_KEY_PASSWORD="nope")
    assert wrong.returncode == 2 and "does not open it" in wrong.stderr
    by_tag = run(*(a if a != image else f"{world.host}/cli:v1" for a in args), KILN_SIGNING_KEY_PASSWORD=password)
    assert by_tag.returncode == 2 and "name the digest to sign" in by_tag.stderr
    signed = run(*args, KILN_SIGNING_KEY_PASSWORD=password)
    assert signed.returncode == 0, signed.stderr
    assert signed.stdout.count("attested ") == 3 and f"signed {image}" in signed.stdout
    again = run(*args, KILN_SIGNING_KEY_PASSWORD=password)       # re-signing keeps one of each
    assert again.returncode == 0
    assert len(store.read(world.client, parse_ref(image), digest, store.SIG)) == 1
    assert len(store.read(world.client, parse_ref(image), digest, store.ATT)) == 3
    for r in (made, no_password, wrong, by_tag, signed, again):
        out = r.stdout + r.stderr
        assert password not in out and "PRIVATE KEY" not in out and pem.splitlines()[1] not in out
    ok = run("verify", "--image", f"{world.host}/cli:v1", "--key", str(tmp_path / "user.pub"))
    assert ok.returncode == 0, ok.stderr


def test_a_verdict_from_another_image_is_not_signed(world, tmp_path):
    from tests.support.signing import verdict_file

    h = world.host
    other = verdict_file(tmp_path, f"{h}/kiln@{world.digests['good']}")
    r = subprocess.run([sys.executable, str(ROOT / "build.py"), "sign", "--target", TARGET, "--image",
                        f"{h}/kiln@{world.digests['unsigned']}", "--key", str(world.root / "kiln.key"),
                        "--verdict", str(other)], capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env={k: v for k, v in os.environ.items() if not k.startswith("KILN_")})
    assert r.returncode == 2
    assert f"the gate ran {h}/kiln@{world.digests['good']}" in r.stderr and "a verdict is signed only for the image" \
        in r.stderr
    assert store.read(world.client, parse_ref(f"{h}/kiln"), world.digests["unsigned"], store.SIG) is None


@pytest.mark.docker
def test_an_image_the_docker_engine_built_and_pushed_is_signed_verified_and_pulled_by_digest(world, tmp_path):
    """A real engine's image (Docker's v2 schema2 manifest, FROM scratch with one file): pushed, signed from
    the command line, verified, pulled by the verified digest; rebuilt with a changed layer and pushed to the
    same tag, it no longer verifies."""
    from kiln_dev.docker import docker_cli

    prefix, env = docker_cli()

    def docker(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*prefix, *args], capture_output=True, text=True, env=env, timeout=300)

    ref = f"{world.host}/engine-made:v1"
    digests = []
    for marker in ("first build", "a changed layer"):
        ctx = tmp_path / marker.replace(" ", "-")
        ctx.mkdir()
        (ctx / "marker").write_text(marker)
        (ctx / "Dockerfile").write_text("FROM scratch\nCOPY marker /marker\n")
        built = docker("build", "--network", "host", "-t", ref, str(ctx))
        assert built.returncode == 0, built.stderr
        pushed = docker("push", ref)
        assert pushed.returncode == 0, pushed.stderr
        digests.append(next(w for w in pushed.stdout.split() if w.startswith("sha256:")))
        if len(digests) == 1:
            sign_all(world.root, f"{world.host}/engine-made@{digests[0]}", world.key)
            ok = subprocess.run([sys.executable, str(ROOT / "build.py"), "verify", "--image", ref, "--key",
                                 str(world.pub)], capture_output=True, text=True, cwd=ROOT, timeout=60)
            assert ok.returncode == 0, ok.stderr
            assert f"{world.host}/engine-made@{digests[0]}: signature verified" in ok.stdout
            docker("rmi", ref)
            pulled = docker("pull", f"{world.host}/engine-made@{digests[0]}")
            assert pulled.returncode == 0, pulled.stderr
    assert digests[0] != digests[1]
    moved = subprocess.run([sys.executable, str(ROOT / "build.py"), "verify", "--image", ref, "--key",
                            str(world.pub)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert moved.returncode == 1
    assert f"FAILED {world.host}/engine-made@{digests[1]}: unsigned: no signature at" in moved.stderr
    docker("rmi", ref, f"{world.host}/engine-made@{digests[0]}")
