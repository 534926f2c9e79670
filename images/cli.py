"""build.py's command line. Errors become one clear message and exit 2; nothing half-written."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from supervisor.errors import KilnError

from . import binaries, docker_build, render, tags
from .lock import LOCK_PATH, load_lock, missing, pins_for, refresh, save_lock
from .target import DEFAULT_TARGET, load_target, target_names

EXIT_USAGE = 2
COMMANDS = ("build", "lock", "compile", "publish-binaries")


def _patch_files(items: list[str] | None) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for item in items or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise KilnError(f"--patch-file {item!r}: expected NAME=PATH, e.g. llama-k3-moe-cache=./x.patch")
        if not Path(path).is_file():
            raise KilnError(f"--patch-file {name}={path}: no such file")
        out[name] = Path(path)
    return out


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python build.py", description="Build a Kiln image for a target.")
    p.add_argument("--list", action="store_true", help="list the targets and exit")
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"target name (default: {DEFAULT_TARGET})")
    p.add_argument("--render", action="store_true", help="write the Dockerfile and build context only (no engine)")
    p.add_argument("--out", type=Path, help="with --render: directory to write (default: a temp dir)")
    p.add_argument("--push", action="store_true", help="push the image's tags after building")
    p.add_argument("--tag", action="append", default=[], help="extra tag for the image (repeatable)")
    p.add_argument("--staging", metavar="REF", help="tag the image only as REF (and push only REF with --push), "
                   "not with its release tag: CI's promote-on-pass copies REF to the release tags after the "
                   "selftest (python -m images.ci promote)")
    p.add_argument("--image", help="repository for the image's tags (default: the target's `image`, "
                   "e.g. ghcr.io/you/kiln)")
    p.add_argument("--base-image", help="use this image for both build and runtime bases (air-gapped or "
                   "registry-less builds, e.g. kiln-local/debian:bookworm)")
    p.add_argument("--ca-bundle", type=Path, help="extra CA bundle for TLS-intercepting proxies, passed as a "
                   "build secret (never in a layer)")
    p.add_argument("--allow-floating", action="store_true", help="build even with unresolved pins (labelled floating)")
    p.add_argument("--binaries", choices=("auto", "compile", "fetch"), default="auto",
                   help="engine binaries: fetch a verified prebuilt tarball, compile in the build, or auto "
                   "(fetch when a store has the exact artifact, else compile)")
    p.add_argument("--binaries-store", help="where prebuilt tarballs live: a directory or hf://owner/name[@rev] "
                   "(default: $KILN_BINARIES_STORE, the target's [binaries] repo, then the local cache)")
    p.add_argument("--fallback-compile", action="store_true",
                   help="with --binaries fetch: compile when the fetched tarball is refused")
    p.add_argument("--patch-file", action="append", metavar="NAME=PATH", help="a patch the target names")
    p.add_argument("--cache-from", action="append", default=[], metavar="SPEC",
                   help="BuildKit cache source, passed to docker build (e.g. type=registry,ref=ghcr.io/you/kiln-cache:T)")
    p.add_argument("--cache-to", action="append", default=[], metavar="SPEC",
                   help="BuildKit cache export (e.g. type=registry,ref=...,mode=max); needs a buildx builder that "
                   "can export cache (docker-container driver); the image is then --load-ed for the push")
    p.add_argument("--build-network", default="host", help="network for RUN steps: host (default; needed by the "
                   "private dockerd with --bridge=none) or default (a buildx docker-container builder)")
    p.add_argument("--print-tag", action="store_true",
                   help="print the image's immutable tag (<target>-<kiln version>-<engine id>) and exit")
    rp = p.add_argument_group("RunPod templates (README: From zero to a serving pod)")
    rp.add_argument("--runpod-template", action="store_true",
                    help="print the target's RunPod template (a REST v2 CreateTemplateRequest, JSON) and exit")
    rp.add_argument("--runpod-upsert", action="store_true",
                    help="create or update the template by name through RunPod's REST API v2 ($RUNPOD_API_KEY); "
                    "prints the template id")
    rp.add_argument("--runpod-image", metavar="REF", help="image reference for the template (default: the "
                    "target's immutable tag in --image or the target's repository)")
    rp.add_argument("--runpod-template-name", metavar="NAME", help="template name (default: [runpod] "
                    "template_name, kiln-<target>)")
    rp.add_argument("--runpod-registry-auth", metavar="ID", help="RunPod container registry credential id "
                    "(the template's `registry`) for a private image")
    rp.add_argument("--runpod-api", metavar="URL", help="REST API v2 base URL (default: $RUNPOD_API_URL or "
                    "https://api.runpod.io/v2)")
    return p


def _cmd_parser(cmd: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python build.py {cmd}")
    p.add_argument("--target", default=DEFAULT_TARGET)
    if cmd == "lock":
        p.description = "Resolve the target's pins (registry digests, git commit, sha256s) into images/lock.toml."
        p.add_argument("--patch-file", action="append", metavar="NAME=PATH")
    elif cmd == "compile":
        p.description = "Compile llama-server on this host with the target's locked inputs (cached by them)."
        p.add_argument("--patch-file", action="append", metavar="NAME=PATH")
        p.add_argument("--jobs", type=int)
        p.add_argument("--force", action="store_true", help="ignore the cache")
        p.add_argument("--allow-floating", action="store_true")
        p.add_argument("--publish", help="also publish the packed tarball to this store (dir or hf://owner/name)")
    elif cmd == "publish-binaries":
        p.description = "Publish the compiled binaries of a target (from `compile`) to a store."
        p.add_argument("--store", required=True, help="a directory or hf://owner/name[@rev]")
        p.add_argument("--patch-file", action="append", metavar="NAME=PATH")
        p.add_argument("--allow-floating", action="store_true")
        p.add_argument("--in-build", action="store_true",
                       help="compile in the Dockerfile's engine-compile stage on the target's pinned build base "
                       "(needs a Docker engine; no CUDA toolkit on the host), so the tarball is keyed by that "
                       "base and an image build of the target fetches it; default: compile on this host")
        p.add_argument("--build-network", default="host")
    return p


def main(argv: list[str]) -> int:
    try:
        if argv and argv[0] in COMMANDS:
            cmd, rest = argv[0], argv[1:]
            if cmd == "build":
                return _build(_build_parser().parse_args(rest))
            args = _cmd_parser(cmd).parse_args(rest)
            return {"lock": _lock, "compile": _compile, "publish-binaries": _publish}[cmd](args)
        return _build(_build_parser().parse_args(argv))
    except render.FloatingRefused as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KilnError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _target_and_pins(name: str):
    target = load_target(name)
    return target, pins_for(target, load_lock())


def _store(spec: str | None, target):
    from .stores import open_store

    choice = spec or os.environ.get("KILN_BINARIES_STORE") or target.binaries_repo
    return open_store(choice or str(binaries.local_store_dir()), token=os.environ.get("HF_TOKEN") or None,
                      endpoint=os.environ.get("HF_ENDPOINT") or None)


# -- build ---------------------------------------------------------------------------------
def _build(args: argparse.Namespace) -> int:
    if args.list:
        for name in target_names():
            t = load_target(name)
            default = "  (default)" if name == DEFAULT_TARGET else ""
            print(f"{name:24} {t.engine:9} {t.description}{default}")
        return 0
    target, pins = _target_and_pins(args.target)
    if args.print_tag:
        keys = [k for k in tags.floating_keys(target, pins) if not (args.base_image and k.startswith("base."))]
        print(tags.release_tag(target, pins, args.image, floating=bool(keys)))
        return 0
    if args.runpod_template or args.runpod_upsert:
        return _runpod(args, target, pins)
    patch_files = _patch_files(args.patch_file)
    ctx = render.make_context(target, pins, allow_floating=args.allow_floating, base_image=args.base_image)
    if args.render:
        out = args.out or Path(tempfile.mkdtemp(prefix=f"kiln-{target.name}-"))
        dockerfile = render.write_context(ctx, out, patch_files=patch_files)
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

    absent = [p.name for p in target.patches if p.name not in patch_files
              and not (p.path and (render.IMAGES_DIR / p.path).is_file())]
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
    with tempfile.TemporaryDirectory(prefix=f"kiln-{target.name}-") as tmp:
        out = Path(tmp)
        render.write_context(ctx, out, patch_files=patch_files)
        mode, binaries_ref = _prepare_binaries(args, target, pins, ctx, out)
        req = docker_build.BuildRequest(
            context=out, tags=[tag, *args.tag],
            build_args={"ENGINE_FROM": mode, "KILN_BINARIES": binaries_ref},
            ca_bundle=args.ca_bundle, hf_token=os.environ.get("HF_TOKEN") or None,
            cache_from=args.cache_from, cache_to=args.cache_to, network=args.build_network)
        print(f"building {tag} (engine: {mode}{', ' + binaries_ref if mode == 'fetch' else ''})", file=sys.stderr)
        docker_build.build(req)
    print(tag)
    if args.push:
        for t in [tag, *args.tag]:
            docker_build.push(t)
    return 0


def _runpod(args: argparse.Namespace, target, pins) -> int:
    """--runpod-template: print the template. --runpod-upsert: create or update it by name."""
    from .pods import template_command

    return template_command(args, target, pins)


def _prepare_binaries(args, target, pins, ctx, out: Path) -> tuple[str, str]:
    """Decide compile vs fetch; for fetch, put a verified tarball into the context."""
    if target.engine != "llamacpp" or args.binaries == "compile":
        return "compile", "compiled-in-build"
    from .artifacts import ArtifactError

    base = docker_build.os_identity_of_image(args.base_image) if args.base_image else str(pins["base.build"].value)
    spec = binaries.expected_spec(target, pins, base)
    store = _store(args.binaries_store, target)
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


# -- lock / compile / publish -------------------------------------------------------------
def _lock(args: argparse.Namespace) -> int:
    from .resolve import default_resolvers

    target = load_target(args.target)
    lock = load_lock()
    report = refresh(target, lock, resolvers=default_resolvers(), patch_files=_patch_files(args.patch_file))
    save_lock(lock)
    for line in report:
        print(line)
    unresolved = missing(target, pins_for(target, lock))
    print(f"wrote {LOCK_PATH}: {len(unresolved)} pin(s) of {target.name} unresolved")
    return 0 if not unresolved else 1


def _compile(args: argparse.Namespace) -> int:
    target, pins = _target_and_pins(args.target)
    if target.engine != "llamacpp":
        raise KilnError(f"{target.name} is a {target.engine} target: nothing to compile")
    gaps = [m for m in missing(target, pins) if not m.startswith("base.")]
    if gaps and not args.allow_floating:
        raise render.FloatingRefused(target, gaps)
    prefix, packed = binaries.host_compile(target, pins, patch_files=_patch_files(args.patch_file),
                                           jobs=args.jobs, force=args.force)
    print(prefix)
    print(packed.tarball)
    if args.publish:
        print(_store(args.publish, target).put(packed))
    return 0


def _publish(args: argparse.Namespace) -> int:
    target, pins = _target_and_pins(args.target)
    gaps = [m for m in missing(target, pins) if not m.startswith("base.")]
    if gaps and not args.allow_floating:
        raise render.FloatingRefused(target, gaps)
    if target.engine != "llamacpp":
        raise KilnError(f"{target.name} is a {target.engine} target: no compiled binaries to publish")
    if args.in_build:
        packed = binaries.compile_in_build(target, pins, patch_files=_patch_files(args.patch_file),
                                           allow_floating=args.allow_floating, network=args.build_network)
    else:
        _, packed = binaries.host_compile(target, pins, patch_files=_patch_files(args.patch_file))
    print(_store(args.store, target).put(packed))
    return 0
