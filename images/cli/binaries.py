"""`compile` and `publish-binaries`: llama-server binaries of a target, compiled and published."""

from __future__ import annotations

import argparse
import sys

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


def _compile(args: argparse.Namespace) -> int:
    from ..binaries import obtain as binaries

    target, pins = opt.target_and_pins(args.target)
    _llamacpp_only(target, "nothing to compile")
    _refuse_floating(target, pins, args.allow_floating)
    if args.jobs is not None and args.jobs < 1:
        raise KilnError(f"--jobs {args.jobs}: must be 1 or more")
    prefix, packed = binaries.host_compile(target, pins, patch_files=opt.parse_patch_files(args.patch_file),
                                           jobs=args.jobs, force=args.force)
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
    finished = provenance.now()
    statement_path = attest_binaries.write_statement(
        target, pins, packed, patch_files=patch_files, in_build=args.in_build, allow_floating=args.allow_floating,
        started_on=started, finished_on=finished)
    print(f"wrote {packed.sha256_file} and {statement_path}", file=sys.stderr)
    print(opt.open_binaries_store(args.store, target).put(packed))
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
)
