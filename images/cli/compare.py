"""`compare-images`: do two builds of an image share their layers? (the check behind "Rebuild and compare")."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from .command import Command


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("first", metavar="IMAGE", help="an image in the local Docker engine (a tag or an ID)")
    p.add_argument("second", metavar="OTHER", help="the image to compare it with, e.g. a rebuild with --no-cache")
    p.add_argument("--show", type=int, default=10, metavar="N",
                   help="differences to show per differing layer (default 10)")


def _compare(args: argparse.Namespace) -> int:
    from ..build import layers

    with tempfile.TemporaryDirectory(prefix="kiln-compare-") as tmp:
        rows = layers.compare(layers.saved(args.first, Path(tmp) / "first"),
                              layers.saved(args.second, Path(tmp) / "second"))
    for r in rows:
        mark = "same" if r.same else "DIFFERS"
        whose = "kiln" if r.kilns else "    "
        print(f"{r.index:3} {mark:8} {whose} {r.first[7:19]} {r.second[7:19]}  {r.created_by[:90]}")
        for d in r.differences[:args.show]:
            print(f"      {d}")
        if len(r.differences) > args.show:
            print(f"      ... {len(r.differences) - args.show} more")
    bad = [r for r in rows if r.kilns and not r.same]
    kiln = [r for r in rows if r.kilns]
    if not kiln:
        print("compare-images: no layer copies a staged /kiln-layer/: not an image Kiln built", file=sys.stderr)
        return 1
    if bad:
        print(f"compare-images: {len(bad)} of Kiln's {len(kiln)} layers differ", file=sys.stderr)
        return 1
    print(f"compare-images: Kiln's {len(kiln)} layers are the same; {sum(not r.same for r in rows)} other "
          "layer(s) differ (package managers' logs and caches, see docs/images.md)", file=sys.stderr)
    return 0


COMMANDS = (
    Command("compare-images", "compare the layers of two builds of an image (does a rebuild reproduce it?)",
            _compare, _arguments,
            description="Compare two images in the local Docker engine layer by layer (diff_ids, with the files "
            "and header fields of each layer that differs).\nExits 0 when every layer Kiln writes is the same, 1 "
            "when one differs."),
)
