"""`build`'s SBOM and provenance: from the build's arguments, its context and the image it made, to
<out>/attest/ (images/attest/ makes and checks the documents; this only gathers what they take)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..attest import dpkg, inputs as build_inputs, provenance, sbom, write as attest_files
from ..build import docker as docker_build
from ..build.render import KILN_VERSION, RenderContext
from ..pins.lock import Pin, missing
from ..target import Target


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    image_id: str          # sha256:<hex>, from docker build --iidfile
    started_on: str
    finished_on: str
    engine_from: str       # compile | fetch
    binaries_ref: str      # KILN_BINARIES: "<tarball>@sha256:<hex>" when fetched


def external_parameters(args: argparse.Namespace, patch_files: Mapping[str, Path]) -> dict:
    """The user's choices that shape the image (docs/images.md, build type image v1)."""
    return {"baseImage": args.base_image, "allowFloating": args.allow_floating, "binaries": args.binaries,
            "binariesStore": args.binaries_store, "fallbackCompile": args.fallback_compile,
            "patchFiles": sorted(patch_files), "cacheFrom": list(args.cache_from)}


def internal_parameters(args: argparse.Namespace, built: BuiltImage, tags: list[str]) -> dict:
    return {"engineFrom": built.engine_from, "kilnBinaries": built.binaries_ref, "tags": tags,
            "buildNetwork": args.build_network or "host", "caBundleSecret": args.ca_bundle is not None,
            "cacheTo": list(args.cache_to), "imageId": built.image_id}


def attest(args: argparse.Namespace, target: Target, pins: Mapping[str, Pin], ctx: RenderContext, context: Path,
           built: BuiltImage, out: Path, patch_files: Mapping[str, Path]) -> tuple[Path, Path]:
    """Read the image's packages, make both documents, check the SBOM, write both. Returns their paths."""
    status = docker_build.read_image_file(built.image_id, dpkg.STATUS_PATH).decode("utf-8", errors="replace")
    release = docker_build.read_image_file(built.image_id, dpkg.OS_RELEASE_PATH).decode("utf-8", errors="replace")
    commit, dirty = build_inputs.kiln_checkout()
    floating = tuple(m.split(":", 1)[0] for m in missing(target, pins)
                     if not (args.base_image and m.startswith("base.")))
    inputs = build_inputs.collect(
        target, pins, context, kiln_version=KILN_VERSION, closure_name=ctx.closure_file, patch_files=patch_files,
        base_image=args.base_image, base_image_id=docker_build.image_id(args.base_image) if args.base_image else "",
        engine_from=built.engine_from, binaries_ref=built.binaries_ref, binaries_store=args.binaries_store or "",
        floating=floating, kiln_commit=commit, kiln_dirty=dirty)
    doc = sbom.document(inputs, image_ref=built.tag, image_id=built.image_id, debs=dpkg.installed(status),
                        os_release=dpkg.os_release(release), created=built.finished_on)
    sbom.check(doc)
    run = provenance.run(built.started_on, built.finished_on, kiln_version=KILN_VERSION,
                         tool_versions=docker_build.versions())
    internal = internal_parameters(args, built, [built.tag, *args.tag])
    if floating:
        internal["floatingPins"] = list(floating)
    predicate = provenance.image_predicate(inputs, external=external_parameters(args, patch_files), internal=internal,
                                           run_details=run)
    return attest_files.write_build(out, doc, predicate)
