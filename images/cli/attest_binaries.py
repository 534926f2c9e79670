"""`publish-binaries`' provenance: an in-toto statement whose subject is the engine tarball (its name and
sha256), written beside the tarball and its .sha256 as <stem>.provenance.json."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Mapping

from ..attest import inputs as build_inputs, provenance, statement as intoto, write as attest_files
from ..binaries.artifacts import Packed, os_identity, provenance_name
from ..build import docker as docker_build, render
from ..digest import sha256_file
from ..pins.lock import Pin
from ..target import Target


def statement_path(tarball: Path) -> Path:
    return tarball.with_name(provenance_name(tarball.name))


def write_statement(target: Target, pins: Mapping[str, Pin], packed: Packed, *, patch_files: Mapping[str, Path],
                    in_build: bool, allow_floating: bool, started_on: str, finished_on: str) -> Path:
    manifest = json.loads(packed.manifest.read_text(encoding="utf-8"))
    dockerfile = None
    versions: dict[str, str] = {}
    if in_build:
        # The Dockerfile compile_in_build ran: the same render of the same target and pins.
        text = render.render_dockerfile(render.make_context(target, dict(pins), allow_floating=allow_floating))
        dockerfile = build_inputs.Input(name="Dockerfile", sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
                                        note=f"rendered from images/templates/{target.engine}.Dockerfile.j2")
        versions = docker_build.versions()
    commit, dirty = build_inputs.kiln_checkout()
    run = provenance.run(started_on, finished_on, kiln_version=render.KILN_VERSION, tool_versions=versions)
    run = dataclasses.replace(run, byproducts=({
        "name": packed.manifest.name, "digest": {"sha256": sha256_file(packed.manifest)},
        "annotations": {"role": "the tarball's manifest: its identity and every file's sha256"}},))
    predicate = provenance.binaries_predicate(
        target, pins, artifact=manifest.get("spec", {}), in_build=in_build, patch_files=patch_files,
        run_details=run, allow_floating=allow_floating, dockerfile=dockerfile, kiln_commit=commit, kiln_dirty=dirty,
        host="" if in_build else os_identity())
    return attest_files.write_json(statement_path(packed.tarball),
                                   intoto.statement(packed.tarball.name, packed.sha256, intoto.SLSA_PROVENANCE_V1, predicate))
