"""The SBOM and provenance of the CPU target's real image, built here by the main job's short form
(`python build.py --target cpu-llamacpp --base-image kiln-local/debian:bookworm`), and of the engine
tarball `publish-binaries` publishes, which that build then fetches (so the build is cached and fast
once the engine is compiled: `build.py compile` is cached by its inputs).

What the SBOM lists is checked against the image itself by another road than Kiln's: `dpkg-query -W`
run in the image (Kiln copies /var/lib/dpkg/status out of it and runs nothing), and the hashes of
supervisor/requirements.txt parsed here. The provenance's digests are recomputed from the files."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from images.attest import sbom
from images.binaries.artifacts import Packed
from images.cli import attest_binaries
from images.cli.command import target_and_pins
from images.paths import LOCK_PATH, RENDERED_DIR, SPDX_SCHEMA, SUPERVISOR_REQUIREMENTS
from kiln_dev.docker import docker_cli, local_base_image, require_docker

ROOT = Path(__file__).resolve().parents[2]


def purl(package: dict) -> str:
    return next((r["referenceLocator"] for r in package.get("externalRefs", []) if r["referenceType"] == "purl"), "")


def build_py(*args: str, env: dict | None = None, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "build.py", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=timeout)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    host = require_docker()
    env = {**os.environ, "DOCKER_HOST": host}
    tmp = tmp_path_factory.mktemp("attest")
    store = tmp / "store"
    published = build_py("publish-binaries", "--target", "cpu-llamacpp", "--store", str(store), env=env)
    assert published.returncode == 0, published.stderr[-3000:]
    out = tmp / "out"
    r = build_py("--target", "cpu-llamacpp", "--base-image", local_base_image(), "--binaries-store", str(store),
                 "--out", str(out), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    tag = r.stdout.strip().splitlines()[-1]
    return {"tag": tag, "out": out, "store": store, "tmp": tmp, "env": env, "publish_stderr": published.stderr,
            "sbom": json.loads((out / "attest" / "sbom.spdx.json").read_text()),
            "predicate": json.loads((out / "attest" / "provenance.predicate.json").read_text())}


def test_the_real_images_sbom_is_valid_spdx_and_lists_its_dpkg_packages_and_every_wheel(built):
    doc = built["sbom"]
    jsonschema.validate(doc, json.loads(SPDX_SCHEMA.read_text()))      # the spec's own schema
    assert sbom.problems(doc) == []
    packages = doc["packages"]

    # every installed deb, as dpkg-query itself reports them, run inside the image
    prefix, env = docker_cli()
    q = subprocess.run([*prefix, "run", "--rm", "--network", "host", "--entrypoint", "dpkg-query", built["tag"], "-W",
                        "-f", "${db:Status-Status} ${Package} ${Version} ${Architecture}\n"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert q.returncode == 0, q.stderr
    in_image = {tuple(line.split()[1:]) for line in q.stdout.splitlines() if line.startswith("installed ")}
    debs = {(p["name"], p["versionInfo"], purl(p).split("arch=")[1].split("&")[0])
            for p in packages if purl(p).startswith("pkg:deb/")}
    assert len(in_image) > 50 and debs == in_image
    assert ("libgomp1" in {name for name, _, _ in debs})            # the runtime package the target asks for

    # every wheel of the image's closure, with each sha256 pip accepts for it
    wanted: dict[tuple[str, str], set[str]] = {}
    name = ""
    for line in SUPERVISOR_REQUIREMENTS.read_text().splitlines():
        s = line.strip().rstrip("\\").strip()
        if "==" in s and not s.startswith("#"):
            name = s.split("==")[0]
            wanted[(name, s.split("==")[1])] = set()
        elif s.startswith("--hash=sha256:"):
            wanted[next(k for k in wanted if k[0] == name)].add(s.removeprefix("--hash=sha256:"))
    wheels = {(p["name"], p["versionInfo"]): {c["checksumValue"] for c in p["checksums"]}
              for p in packages if purl(p).startswith("pkg:pypi/")
              and p.get("primaryPackagePurpose") == "LIBRARY"}
    assert len(wanted) > 10 and wheels == wanted

    # the image, described; its packages contained; its ID the one the engine has
    image = next(p for p in packages if p["SPDXID"] == "SPDXRef-image")
    inspect = subprocess.run([*prefix, "image", "inspect", "--format", "{{.Id}}", built["tag"]], capture_output=True,
                             text=True, env=env)
    assert image["checksums"] == [{"algorithm": "SHA256", "checksumValue": inspect.stdout.strip().removeprefix("sha256:")}]
    contained = {r["relatedSpdxElement"] for r in doc["relationships"]
                 if r["spdxElementId"] == "SPDXRef-image" and r["relationshipType"] == "CONTAINS"}
    assert {p["SPDXID"] for p in packages if p["name"] in {n for n, _, _ in debs} | {n for n, _ in wheels}} <= contained


def test_a_tampered_or_incomplete_copy_of_the_real_sbom_fails_validation(built):
    doc = copy.deepcopy(built["sbom"])
    del doc["packages"][-1]["SPDXID"]
    assert any("'SPDXID' is a required property" in p for p in sbom.problems(doc))
    doc = copy.deepcopy(built["sbom"])
    doc["packages"] = doc["packages"][:3]                 # relationships now name packages that are gone
    assert any("names no element of this document" in p for p in sbom.problems(doc))
    with pytest.raises(jsonschema.ValidationError):
        bad = copy.deepcopy(built["sbom"])
        bad["relationships"][0]["relationshipType"] = "INCLUDES"   # not an SPDX 2.3 relationship
        jsonschema.validate(bad, json.loads(SPDX_SCHEMA.read_text()))


def test_the_provenance_names_the_locks_and_the_dockerfiles_real_digests(built):
    rendered = built["tmp"] / "rendered"
    r = build_py("render", "--target", "cpu-llamacpp", "--base-image", local_base_image(), "--out", str(rendered))
    assert r.returncode == 0, r.stderr
    p = built["predicate"]
    deps = {d.get("name") or d["uri"]: d for d in p["buildDefinition"]["resolvedDependencies"]}
    assert deps["images/lock.toml"]["digest"]["sha256"] == hashlib.sha256(LOCK_PATH.read_bytes()).hexdigest()
    assert deps["Dockerfile"]["digest"]["sha256"] == hashlib.sha256((rendered / "Dockerfile").read_bytes()).hexdigest()
    assert p["buildDefinition"]["externalParameters"]["target"] == "cpu-llamacpp"
    assert p["buildDefinition"]["externalParameters"]["baseImage"] == local_base_image()
    tarball = next(f for f in built["store"].iterdir() if f.name.endswith(".tar.gz"))
    assert deps[tarball.name]["digest"]["sha256"] == hashlib.sha256(tarball.read_bytes()).hexdigest()
    builder = p["runDetails"]["builder"]
    assert builder["version"]["docker-engine"] and builder["version"]["kiln"]


def test_publish_binaries_writes_a_statement_whose_subject_is_the_tarball(built):
    tarball = next(f for f in built["store"].iterdir() if f.name.endswith(".tar.gz"))
    wrote = [line for line in built["publish_stderr"].splitlines() if line.startswith("wrote ")][-1]
    shafile, statement_file = (Path(w) for w in wrote.removeprefix("wrote ").split(" and "))
    assert statement_file.parent == shafile.parent and statement_file.name == tarball.name.removesuffix(".tar.gz") + ".provenance.json"
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    assert shafile.read_text().split() == [digest, tarball.name]
    s = json.loads(statement_file.read_text())
    assert s["_type"] == "https://in-toto.io/Statement/v1" and s["predicateType"] == "https://slsa.dev/provenance/v1"
    assert s["subject"] == [{"name": tarball.name, "digest": {"sha256": digest}}]
    assert s["predicate"]["buildDefinition"]["buildType"].endswith("#build-type-binaries-v1")
    # the store got it too, beside the tarball: whoever fetches the tarball can read how it was made
    published = built["store"] / statement_file.name
    assert published.read_bytes() == statement_file.read_bytes()


def test_an_in_build_compiles_statement_names_the_committed_dockerfile_and_the_pinned_build_base(built, tmp_path):
    """publish-binaries --in-build compiles in the Dockerfile's engine-compile stage on the pinned build base:
    its statement names that Dockerfile, which is the committed golden render (images/rendered/), and the
    base by the lock's digest. The compile itself is not rerun here: the statement is written for the
    tarball publish-binaries packed above, as the in-build path would write it."""
    for f in built["store"].iterdir():
        shutil.copy(f, tmp_path / f.name)
    tarball = next(tmp_path.glob("*.tar.gz"))
    packed = Packed(tarball=tarball, manifest=next(tmp_path.glob("*.manifest.json")),
                    sha256_file=next(tmp_path.glob("*.sha256")), sha256=hashlib.sha256(tarball.read_bytes()).hexdigest())
    target, pins = target_and_pins("cpu-llamacpp")
    path = attest_binaries.write_statement(target, pins, packed, patch_files={}, in_build=True, allow_floating=False,
                                           started_on="2026-12-06T00:00:00Z", finished_on="2026-12-06T00:00:01Z")
    s = json.loads(path.read_text())
    deps = {d.get("name") or d["uri"]: d for d in s["predicate"]["buildDefinition"]["resolvedDependencies"]}
    golden = RENDERED_DIR / "cpu-llamacpp" / "Dockerfile"
    assert deps["Dockerfile"]["digest"]["sha256"] == hashlib.sha256(golden.read_bytes()).hexdigest()
    assert deps["base.build"]["digest"]["sha256"] == pins["base.build"].value.removeprefix("sha256:")
    assert s["predicate"]["buildDefinition"]["externalParameters"] == {"target": "cpu-llamacpp", "inBuild": True}
    assert s["predicate"]["runDetails"]["byproducts"][0]["name"] == packed.manifest.name
