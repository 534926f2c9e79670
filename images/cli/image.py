"""`build`, `render`, `tag`, `list`: an image of a target, its Dockerfile and context, its tag."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from supervisor.errors import KilnError

from ..paths import IMAGES_DIR
from . import command as opt
from .command import Command

BINARIES_MODES = ("auto", "compile", "fetch")


# -- list ------------------------------------------------------------------------------------------
def _list(args: argparse.Namespace) -> int:
    from ..target import DEFAULT_TARGET, load_target, target_names

    for name in target_names():
        t = load_target(name)
        default = "  (default)" if name == DEFAULT_TARGET else ""
        print(f"{name:24} {t.engine:9} {t.description}{default}")
    return 0


# -- tag -------------------------------------------------------------------------------------------
def _tag_arguments(p: argparse.ArgumentParser) -> None:
    opt.target(p)
    opt.image(p)
    p.add_argument("--base-image", metavar="REF", help="the tag of a build with this --base-image (the bases' "
                   "pins then do not make it floating)")


def _tag(args: argparse.Namespace) -> int:
    from ..build import tags

    target, pins = opt.target_and_pins(args.target)
    keys = [k for k in tags.floating_keys(target, pins) if not (args.base_image and k.startswith("base."))]
    print(tags.release_tag(target, pins, args.image, floating=bool(keys)))
    return 0


# -- render ----------------------------------------------------------------------------------------
def _render_arguments(p: argparse.ArgumentParser) -> None:
    opt.target(p)
    p.add_argument("--out", type=Path, metavar="DIR", help="directory to write: new, empty, or an earlier "
                   "`render` of Kiln's (then only Kiln's own files are replaced; anything else in DIR is "
                   "kept, and a file of yours in Kiln's way is refused by name). Default: a new temp dir")
    opt.base_image(p)
    opt.allow_floating(p, "render")
    opt.patch_files(p)


def _render(args: argparse.Namespace) -> int:
    from ..build import outdir, render
    from ..pins.lock import missing

    target, pins = opt.target_and_pins(args.target)
    patch_files = opt.parse_patch_files(args.patch_file)
    ctx = render.make_context(target, pins, allow_floating=args.allow_floating, base_image=args.base_image)
    if args.out is None:
        out = Path(tempfile.mkdtemp(prefix=f"kiln-{target.name}-"))
        dockerfile = render.write_context(ctx, out, patch_files=patch_files)
    else:
        out = args.out
        dockerfile = outdir.render_into(out, lambda d: render.write_context(ctx, d, patch_files=patch_files),
                                        target=target.name, kiln_version=render.KILN_VERSION)
    print(dockerfile)
    if ctx.floating:
        keys = ", ".join(m.split(":", 1)[0] for m in missing(target, pins))
        print(f"note: FLOATING render: {keys} unresolved; the image would be labelled io.kiln.floating=true",
              file=sys.stderr)
    absent = [p.name for p in ctx.patches if not (out / "kiln" / "patches" / p.filename).is_file()]
    if absent:
        print(f"note: no file for patch(es) {', '.join(absent)} in the context: pass --patch-file NAME=PATH "
              "before building", file=sys.stderr)
    return 0


# -- build -----------------------------------------------------------------------------------------
def _build_arguments(p: argparse.ArgumentParser) -> None:
    opt.target(p)
    opt.image(p)
    p.add_argument("--tag", action="append", default=[], metavar="REF", help="extra tag for the image (repeatable)")
    p.add_argument("--push", action="store_true", help="push the image's tags after building")
    p.add_argument("--staging", metavar="REF", help="tag the image only as REF (and push only REF with --push), "
                   "not with its release tag: CI's promote-on-pass copies REF to the release tags after the "
                   "selftest (python -m images.ci promote)")
    opt.base_image(p)
    p.add_argument("--ca-bundle", type=Path, metavar="FILE", help="extra CA bundle for TLS-intercepting proxies, "
                   "passed as a build secret (never in a layer)")
    opt.allow_floating(p)
    p.add_argument("--binaries", choices=BINARIES_MODES, default="auto",
                   help="engine binaries: fetch a verified prebuilt tarball, compile in the build, or auto "
                   "(the default: fetch when a store has the exact artifact, else compile)")
    p.add_argument("--binaries-store", metavar="STORE", help="where prebuilt tarballs live: a directory or "
                   "hf://owner/name[@rev] (default: $KILN_BINARIES_STORE, the target's [binaries] repo, then the "
                   "local cache)")
    p.add_argument("--fallback-compile", action="store_true",
                   help="compile when a fetched tarball is refused (with --binaries fetch or auto)")
    opt.patch_files(p)
    p.add_argument("--cache-from", action="append", default=[], metavar="SPEC",
                   help="BuildKit cache source, passed to docker build (e.g. type=registry,ref=ghcr.io/you/kiln-cache:T)")
    p.add_argument("--cache-to", action="append", default=[], metavar="SPEC",
                   help="BuildKit cache export (e.g. type=registry,ref=...,mode=max); needs a buildx builder that "
                   "can export cache (docker-container driver); the image is then --load-ed for the push")
    p.add_argument("--no-cache", action="store_true",
                   help="build every step again, none from the builder's cache (to check that a rebuild "
                   "gives the same layers: docs/images.md, 'Rebuild and compare')")
    opt.build_network(p)
    p.add_argument("--out", type=Path, metavar="DIR", help="where the build writes its SBOM and provenance predicate "
                   "(DIR/attest/sbom.spdx.json, DIR/attest/provenance.predicate.json; default: build-out/<target>)")


def _build(args: argparse.Namespace) -> int:
    from ..attest import provenance, write as attest_files
    from ..build import docker as docker_build, render, tags
    from . import attest_build

    if args.binaries == "compile":
        extra = [o for o, given in (("--fallback-compile", args.fallback_compile),
                                    ("--binaries-store", args.binaries_store)) if given]
        if extra:
            raise KilnError(f"{' and '.join(extra)} cannot be combined with --binaries compile (nothing is fetched); "
                            "drop it, or use --binaries auto or fetch")
    ca_bundle = opt.readable_file("--ca-bundle", args.ca_bundle)
    target, pins = opt.target_and_pins(args.target)
    patch_files = opt.parse_patch_files(args.patch_file)
    ctx = render.make_context(target, pins, allow_floating=args.allow_floating, base_image=args.base_image)
    absent = [p.name for p in target.patches if p.name not in patch_files
              and not (p.path and (IMAGES_DIR / p.path).is_file())]
    if absent:
        raise KilnError(f"no file for patch(es) {', '.join(absent)}: pass --patch-file NAME=PATH "
                        "(the target names the patch; Kiln has no copy of it)")
    docker_build.ping()
    for ref in sorted({ctx.build_base, ctx.runtime_base}):
        if not docker_build.image_exists(ref):
            print(f"note: base {ref} is not in the local store; the build will pull it "
                  "(no registry here? make one: `bash scripts/dev-docker.sh base-image`, then --base-image)",
                  file=sys.stderr)
    if args.image and not re.fullmatch(tags.REPOSITORY_RE, args.image):
        raise KilnError(f"--image {args.image!r}: expected a repository such as ghcr.io/you/kiln (no tag)")
    if args.staging and not re.fullmatch(r"[a-z0-9][a-z0-9._/:-]*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", args.staging):
        raise KilnError(f"--staging {args.staging!r}: expected repository:tag, e.g. ghcr.io/you/kiln:staging-x")
    tag = args.staging or tags.release_tag(target, pins, args.image, floating=ctx.floating)
    out_dir = args.out or attest_files.default_out(target.name)
    with tempfile.TemporaryDirectory(prefix=f"kiln-{target.name}-") as tmp:
        context = Path(tmp) / "context"
        render.write_context(ctx, context, patch_files=patch_files)
        mode, binaries_ref = _prepare_binaries(args, target, pins, context)
        req = docker_build.BuildRequest(
            context=context, tags=[tag, *args.tag],
            build_args={"ENGINE_FROM": mode, "KILN_BINARIES": binaries_ref,
                        # A BuildKit that knows it (0.11+) also dates the image's config and history with it.
                        "SOURCE_DATE_EPOCH": str(ctx.source_date_epoch)},
            ca_bundle=ca_bundle, hf_token=os.environ.get("HF_TOKEN") or None,
            cache_from=args.cache_from, cache_to=args.cache_to, network=args.build_network or "host",
            no_cache=args.no_cache, iidfile=Path(tmp) / "image-id")
        print(f"building {tag} (engine: {mode}{', ' + binaries_ref if mode == 'fetch' else ''})", file=sys.stderr)
        started = provenance.now()
        docker_build.build(req)
        finished = provenance.now()
        built = attest_build.BuiltImage(tag=tag, image_id=req.iidfile.read_text(encoding="utf-8").strip(),
                           started_on=started, finished_on=finished, engine_from=mode, binaries_ref=binaries_ref)
        for path in attest_build.attest(args, target, pins, ctx, context, built, out_dir, patch_files):
            print(f"wrote {path}", file=sys.stderr)
    print(tag)
    if args.push:
        for t in [tag, *args.tag]:
            docker_build.push(t)
    return 0


def _prepare_binaries(args: argparse.Namespace, target, pins, out: Path) -> tuple[str, str]:
    """Decide compile vs fetch; for fetch, put a verified tarball into the context."""
    from ..binaries import obtain as binaries
    from ..build import docker as docker_build
    from ..binaries.artifacts import ArtifactError

    if target.engine != "llamacpp" or args.binaries == "compile":
        return "compile", "compiled-in-build"
    base = docker_build.os_identity_of_image(args.base_image) if args.base_image else str(pins["base.build"].value)
    spec = binaries.expected_spec(target, pins, base)
    store = opt.open_binaries_store(args.binaries_store, target)
    if args.binaries == "auto" and not store.exists(spec.name()):
        print(f"binaries: no {spec.name()} in the store: compiling in the build", file=sys.stderr)
        return "compile", "compiled-in-build"
    try:
        tarball, shafile, sha = binaries.fetch_verified(store, spec, out / "kiln" / "binaries",
                                                        smoke=not target.is_gpu)
    except ArtifactError as e:
        if args.fallback_compile:
            print(f"binaries: fetched tarball refused ({e}); compiling instead (--fallback-compile)", file=sys.stderr)
            shutil.rmtree(out / "kiln" / "binaries")
            (out / "kiln" / "binaries").mkdir()
            return "compile", "compiled-in-build"
        raise
    # Only the tarball and its checksum travel; the manifest was checked here.
    for f in (out / "kiln" / "binaries").iterdir():
        if f not in (tarball, shafile):
            f.unlink()
    return "fetch", f"{tarball.name}@sha256:{sha}"


COMMANDS = (
    Command("build", "build the image of a target with a Docker engine (BuildKit); prints its tag",
            _build, _build_arguments,
            description="Build the image of a target with a Docker engine (BuildKit) and print its tag on "
            "stdout.\nEvery input is a locked pin (images/lock.toml); the engine is fetched as a verified "
            "prebuilt tarball or compiled in the build (--binaries)."),
    Command("render", "write the Dockerfile and build context of a target, no engine needed",
            _render, _render_arguments,
            description="Write the Dockerfile and build context of a target (no Docker engine needed) and "
            "print the Dockerfile's path.\nThe committed goldens (images/rendered/) are regenerated with "
            "`python build.py generate`, not with this."),
    Command("list", "list the targets", _list),
    Command("tag", "print the immutable tag of a target's image", _tag, _tag_arguments,
            description="Print the immutable tag of a target's image: "
            "<repository>:<target>-<kiln version>-<engine id>[-floating]."),
)
