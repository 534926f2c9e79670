"""`compile`, `publish-binaries` and `rebuild-binaries`: llama-server binaries of a target, compiled,
published, and compiled again to check that the same tarball comes out."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from supervisor.errors import KilnError

from . import command as opt
from .command import Command


def _llamacpp_only(target, what: str) -> None:
    if target.engine != "llamacpp":
        raise KilnError(f"{target.name} is a {target.engine} target: {what}")


def _refuse_floating(target, pins, allow: bool) -> None:
    from ..pins.lock import missing
    from ..build.render import FloatingRefused

    gaps = [m for m in missing(target, pins) if not m.startswith("base.")]
    if gaps and not allow:
        raise FloatingRefused(target, gaps)


def _compile_arguments(p: argparse.ArgumentParser) -> None:
    opt.target(p)
    opt.patch_files(p)
    p.add_argument("--jobs", type=int, metavar="N", help="parallel compile jobs (default: the CPU count)")
    p.add_argument("--force", action="store_true", help="compile even when the cache has these inputs")
    opt.allow_floating(p, "compile")
    p.add_argument("--publish", metavar="STORE", help="also publish the packed tarball to this store "
                   "(a directory or hf://owner/name[@rev])")
    _rebuild_check_argument(p)


def _rebuild_check_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rebuild-check", action="store_true",
                   help="compile once more from scratch (a new work directory; in a build, no build cache) and "
                   "stop, naming both sha256s, unless the tarball comes out the same byte for byte")


def _check_rebuild(packed, target, pins, *, in_build: bool, patch_files, allow_floating: bool = False,
                   network: str = "host") -> None:
    """Compile again and compare with `packed`; RebuildMismatch (nothing published) when they differ."""
    from ..binaries import rebuild

    print(f"rebuild check: compiling {target.name} once more from scratch", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="kiln-rebuild-check-") as tmp:
        second = rebuild.again(target, pins, Path(tmp), in_build=in_build, patch_files=patch_files,
                               allow_floating=allow_floating, network=network)
        sha = rebuild.check_same(packed.tarball, second.tarball)
    print(f"rebuild check: the same tarball again, sha256 {sha}", file=sys.stderr)


def _compile(args: argparse.Namespace) -> int:
    from ..binaries import obtain as binaries

    target, pins = opt.target_and_pins(args.target)
    _llamacpp_only(target, "nothing to compile")
    _refuse_floating(target, pins, args.allow_floating)
    if args.jobs is not None and args.jobs < 1:
        raise KilnError(f"--jobs {args.jobs}: must be 1 or more")
    patch_files = opt.parse_patch_files(args.patch_file)
    prefix, packed = binaries.host_compile(target, pins, patch_files=patch_files, jobs=args.jobs, force=args.force)
    if args.rebuild_check:
        _check_rebuild(packed, target, pins, in_build=False, patch_files=patch_files)
    print(prefix)
    print(packed.tarball)
    if args.publish:
        print(opt.open_binaries_store(args.publish, target).put(packed))
    return 0


def _publish_arguments(p: argparse.ArgumentParser) -> None:
    opt.target(p)
    p.add_argument("--store", required=True, metavar="STORE", help="a directory or hf://owner/name[@rev]")
    opt.patch_files(p)
    opt.allow_floating(p, "publish")
    p.add_argument("--in-build", action="store_true",
                   help="compile in the Dockerfile's engine-compile stage on the target's pinned build base "
                   "(needs a Docker engine; no CUDA toolkit on the host), so the tarball is keyed by that "
                   "base and an image build of the target fetches it; default: compile on this host")
    opt.build_network(p, "; with --in-build")
    _rebuild_check_argument(p)


def _publish(args: argparse.Namespace) -> int:
    from ..attest import provenance
    from ..binaries import obtain as binaries
    from . import attest_binaries

    if args.build_network and not args.in_build:
        raise KilnError("--build-network cannot be combined with a host compile (no build runs); add --in-build "
                        "or drop --build-network")
    target, pins = opt.target_and_pins(args.target)
    _refuse_floating(target, pins, args.allow_floating)
    _llamacpp_only(target, "no compiled binaries to publish")
    patch_files = opt.parse_patch_files(args.patch_file)
    started = provenance.now()
    if args.in_build:
        packed = binaries.compile_in_build(target, pins, patch_files=patch_files,
                                           allow_floating=args.allow_floating, network=args.build_network or "host")
    else:
        _, packed = binaries.host_compile(target, pins, patch_files=patch_files)
    if args.rebuild_check:
        _check_rebuild(packed, target, pins, in_build=args.in_build, patch_files=patch_files,
                       allow_floating=args.allow_floating, network=args.build_network or "host")
    finished = provenance.now()
    statement_path = attest_binaries.write_statement(
        target, pins, packed, patch_files=patch_files, in_build=args.in_build, allow_floating=args.allow_floating,
        started_on=started, finished_on=finished)
    print(f"wrote {packed.sha256_file} and {statement_path}", file=sys.stderr)
    print(opt.open_binaries_store(args.store, target).put(packed))
    return 0


def _rebuild_arguments(p: argparse.ArgumentParser) -> None:
    opt.target(p)
    p.add_argument("--against", metavar="STORE", help="the store holding the tarball to compare with (a directory "
                   "or hf://owner/name[@rev]; default: the one `compile` or `publish-binaries` left in the local "
                   "cache)")
    p.add_argument("--in-build", action="store_true",
                   help="compile in the Dockerfile's engine-compile stage on the target's pinned build base, with "
                   "no build cache (the tarballs CI publishes are made so); default: on this host")
    opt.patch_files(p)
    opt.allow_floating(p, "rebuild")
    opt.build_network(p, "; with --in-build")


def _rebuild(args: argparse.Namespace) -> int:
    from ..binaries import artifacts, obtain as binaries, rebuild
    from ..binaries.stores import open_store

    if args.build_network and not args.in_build:
        raise KilnError("--build-network cannot be combined with a host compile (no build runs); add --in-build "
                        "or drop --build-network")
    target, pins = opt.target_and_pins(args.target)
    _llamacpp_only(target, "no compiled binaries to rebuild")
    _refuse_floating(target, pins, args.allow_floating)
    patch_files = opt.parse_patch_files(args.patch_file)
    base = str(pins["base.build"].value) if args.in_build else artifacts.os_identity()
    spec = binaries.expected_spec(target, pins, base)
    store = (opt.open_binaries_store(args.against, target) if args.against
             else open_store(str(binaries.cache_dir() / "binaries" / spec.name().removesuffix(".tar.gz") / "packed")))
    if not store.exists(spec.name()):
        how = "--in-build " if args.in_build else ""
        raise KilnError(f"no {spec.name()} in {args.against or 'the local cache'} to compare with: pass --against "
                        f"STORE, or make one first (python build.py publish-binaries --target {target.name} {how}"
                        "--store DIR)")
    with tempfile.TemporaryDirectory(prefix="kiln-rebuild-") as tmp:
        tarball, _, first_sha = binaries.fetch_verified(store, spec, Path(tmp) / "published", smoke=False)
        print(f"rebuild: compiling {target.name} again from scratch to compare with {tarball.name}", file=sys.stderr)
        second = rebuild.again(target, pins, Path(tmp) / "again", in_build=args.in_build, patch_files=patch_files,
                               allow_floating=args.allow_floating, network=args.build_network or "host")
        print(f"published  sha256 {first_sha}")
        print(f"rebuilt    sha256 {second.sha256}")
        try:
            rebuild.check_same(tarball, second.tarball)
        except rebuild.RebuildMismatch as err:
            print("\n".join(f"  - {d}" for d in err.differences))
            print("rebuild: DIFFERENT: the published tarball is not what these inputs compile to", file=sys.stderr)
            return 1
    print("rebuild: the same, byte for byte", file=sys.stderr)
    return 0


COMMANDS = (
    Command("compile", "compile llama-server on this host with a target's locked inputs (cached)",
            _compile, _compile_arguments,
            description="Compile llama-server on this host with the target's locked inputs (cached by them) and "
            "pack it;\nprints the prefix and the packed tarball."),
    Command("publish-binaries", "compile and publish a target's llama-server binaries to a store",
            _publish, _publish_arguments,
            description="Publish the compiled binaries of a target (as `compile` makes them, or compiled in the "
            "build with --in-build) to a store; prints where."),
    Command("rebuild-binaries", "compile a target's binaries again and compare with a published tarball",
            _rebuild, _rebuild_arguments,
            description="Compile a target's llama-server binaries again from scratch with the locked inputs and "
            "compare the tarball, byte for byte, with one already published (or cached).\nPrints both sha256s; "
            "exits 0 when they are the same, 1 naming each difference when not."),
)
