"""SLSA provenance v1 predicates (https://slsa.dev/spec/v1.0/provenance): how an image or an engine
tarball was built, by what, from what.

    image_predicate(inputs, ...)       `build.py build`: the image (its statement's subject is the
                                       pushed manifest digest, known only after the push)
    binaries_predicate(target, ...)    `build.py publish-binaries`: the engine tarball
    run(started_on, ...)               runDetails: builder id and versions, invocation id, times

Field names are the spec's (spec/provenance.md of slsa-framework/slsa, branch releases/v1.0, commit
7d5078a986b4783bc8eab32b8e2804187b4cdbb0): buildDefinition {buildType, externalParameters,
internalParameters, resolvedDependencies}, runDetails {builder {id, version}, metadata {invocationId,
startedOn, finishedOn}}. resolvedDependencies are in-toto ResourceDescriptors: each has a `uri` or a
`digest`. The build types and builder ids are Kiln's own and documented in docs/images.md (section
"What an image contains: SBOM and provenance"); what each field holds is there too.
"""

from __future__ import annotations

import datetime as _dt
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..digest import sha256_file
from ..paths import COMPILE_SCRIPT
from ..pins import lock as lockfile
from ..pins.lock import Pin
from ..target import Target
from . import inputs as build_inputs
from .inputs import Base, BuildInputs, Input, Source
from .refs import docker_purl, oci_purl, pypi_purl

DOCS = "https://github.com/kiln-llm/kiln/blob/main/docs/images.md"
BUILD_TYPE_IMAGE = f"{DOCS}#build-type-image-v1"
BUILD_TYPE_BINARIES = f"{DOCS}#build-type-binaries-v1"
BUILDER_CLI = f"{DOCS}#builder-kiln-cli-v1"     # a build.py run outside GitHub Actions


def now() -> str:
    """A Timestamp as in-toto writes it: RFC 3339, UTC, `Z`."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Run:
    builder_id: str
    versions: Mapping[str, str]
    invocation_id: str
    started_on: str
    finished_on: str
    byproducts: tuple[dict, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "builder": {"id": self.builder_id, "version": dict(self.versions)},
            "metadata": {"invocationId": self.invocation_id, "startedOn": self.started_on,
                         "finishedOn": self.finished_on},
        }
        if self.byproducts:
            out["byproducts"] = list(self.byproducts)
        return out


def run(started_on: str, finished_on: str, *, kiln_version: str, tool_versions: Mapping[str, str],
        env: Mapping[str, str] | None = None) -> Run:
    """runDetails of this build.py run. In GitHub Actions the builder is the workflow that ran it
    (GITHUB_WORKFLOW_REF) and the invocation is the run's attempt; elsewhere the builder is Kiln's CLI
    on the machine that ran it, and the invocation a fresh UUID."""
    env = os.environ if env is None else env
    server = env.get("GITHUB_SERVER_URL", "https://github.com")
    if env.get("GITHUB_ACTIONS") == "true" and env.get("GITHUB_WORKFLOW_REF"):
        builder = f"{server}/{env['GITHUB_WORKFLOW_REF']}"
        invocation = (f"{server}/{env.get('GITHUB_REPOSITORY', '')}/actions/runs/{env.get('GITHUB_RUN_ID', '')}"
                      f"/attempts/{env.get('GITHUB_RUN_ATTEMPT', '1')}")
    else:
        builder, invocation = BUILDER_CLI, f"urn:uuid:{uuid.uuid4()}"
    return Run(builder_id=builder, versions={"kiln": kiln_version, **tool_versions}, invocation_id=invocation,
               started_on=started_on, finished_on=finished_on)


# -- resolvedDependencies ------------------------------------------------------------------------------
def _file(i: Input, **annotations: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": i.name, "digest": {"sha256": i.sha256}}
    if i.uri:
        d["uri"] = i.uri
    notes = {k: v for k, v in annotations.items() if v}
    if i.note:
        notes["note"] = i.note
    if notes:
        d["annotations"] = notes
    return d


def _source(s: Source) -> dict[str, Any]:
    if s.kind == "git":
        d: dict[str, Any] = {"uri": f"git+{s.url}@{s.commit}" if s.commit else f"git+{s.url}"}
        if s.commit:
            d["digest"] = {"gitCommit": s.commit}
    else:
        d = {"uri": s.url or pypi_purl(s.package, s.version, s.filename)}
        if s.filename:
            d["name"] = s.filename
        if s.sha256:
            d["digest"] = {"sha256": s.sha256}
    d.setdefault("annotations", {})["role"] = "engine source"
    if s.note:
        d["annotations"]["note"] = s.note
    return d


def _base(b: Base) -> dict[str, Any]:
    hexd = b.digest.removeprefix("sha256:")
    uri = docker_purl(b.ref, hexd) if b.override else oci_purl(b.ref, hexd)
    d: dict[str, Any] = {"name": f"base.{b.role}", "uri": uri}
    if hexd:
        d["digest"] = {"sha256": hexd}
    if b.note:
        d["annotations"] = {"note": b.note}
    return d


def _checkout(commit: str, dirty: bool) -> list[dict[str, Any]]:
    if not commit:
        return []
    d: dict[str, Any] = {"uri": f"git+https://github.com/kiln-llm/kiln@{commit}", "digest": {"gitCommit": commit},
                         "annotations": {"role": "the Kiln checkout that built"}}
    if dirty:
        d["annotations"]["trackedFilesChanged"] = True
    return [d]


def image_dependencies(inputs: BuildInputs) -> list[dict[str, Any]]:
    deps = _checkout(inputs.kiln_commit, inputs.kiln_dirty)
    deps += [_file(inputs.lock, role="the pins"), _file(inputs.target_file, role="the target"),
             _file(inputs.dockerfile, role="the Dockerfile the build ran"), _source(inputs.source)]
    deps += [_file(p, role="patch") for p in inputs.patches if p.sha256]
    seen = set()
    for b in inputs.bases:
        if (b.ref, b.digest) not in seen:
            seen.add((b.ref, b.digest))
            deps.append(_base(b))
    deps += [_file(c, role="hash-locked requirements the image installed") for c in inputs.closures]
    if inputs.binaries:
        deps.append(_file(inputs.binaries, role="engine tarball"))
    return deps


# -- the predicates --------------------------------------------------------------------------------------
def image_predicate(inputs: BuildInputs, *, external: Mapping[str, Any], internal: Mapping[str, Any],
                    run_details: Run) -> dict[str, Any]:
    """The provenance predicate of an image build (no statement around it: the image's manifest digest,
    its subject, is known only once it is pushed)."""
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE_IMAGE,
            "externalParameters": {"target": inputs.target, **{k: v for k, v in external.items() if v not in (None, False, [], "")}},
            "internalParameters": dict(internal),
            "resolvedDependencies": image_dependencies(inputs),
        },
        "runDetails": run_details.to_dict(),
    }


def binaries_predicate(target: Target, pins: Mapping[str, Pin], *, artifact: Mapping[str, str], in_build: bool,
                       patch_files: Mapping[str, Path], run_details: Run, allow_floating: bool = False,
                       dockerfile: Input | None = None, kiln_commit: str = "", kiln_dirty: bool = False,
                       host: str = "") -> dict[str, Any]:
    """The provenance predicate of a published engine tarball. `artifact` is its ArtifactSpec as a dict
    (the fields its name encodes); `dockerfile` the rendered Dockerfile of an --in-build compile; `host`
    the OS (os:<ID>-<VERSION_ID>) a host compile ran on."""
    lock = Input(name=build_inputs.repo_path(lockfile.LOCK_PATH), sha256=sha256_file(lockfile.LOCK_PATH))
    deps = _checkout(kiln_commit, kiln_dirty)
    deps += [_file(lock, role="the pins"),
             _file(Input(name=build_inputs.repo_path(target.path), sha256=sha256_file(target.path)), role="the target"),
             _file(Input(name=build_inputs.repo_path(COMPILE_SCRIPT), sha256=sha256_file(COMPILE_SCRIPT)),
                   role="the compile recipe"),
             _source(build_inputs.source_of(target, pins))]
    deps += [_file(p, role="patch") for p in build_inputs.patches_of(target, pins, patch_files) if p.sha256]
    if in_build:
        if dockerfile:
            deps.append(_file(dockerfile, role="the Dockerfile the build ran (its engine-prefix stage)"))
        deps.append(_base(build_inputs.bases_of(target, pins, base_image=None)[0]))
    external: dict[str, Any] = {"target": target.name}
    if in_build:
        external["inBuild"] = True
    if allow_floating:
        external["allowFloating"] = True
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE_BINARIES,
            "externalParameters": external,
            "internalParameters": {"artifact": dict(artifact), "cmakeFlags": list(target.cmake_flags),
                                   "cudaArchs": list(target.cuda_archs), **({"host": host} if host else {})},
            "resolvedDependencies": deps,
        },
        "runDetails": run_details.to_dict(),
    }
