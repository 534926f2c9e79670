"""What the repository holds works in every clone: a committed symlink must point inside the checkout.
Issue 24, item 11: `.whl` was committed as a link to another machine's absolute path
(an absolute path on another machine), dangling in every clone (and scripts/device/*.sh make directories under it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tracked_links() -> dict[str, str]:
    """Every symlink in the index: path -> the target it stores."""
    listing = subprocess.run(["git", "ls-files", "-s", "-z"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    links = {}
    for entry in filter(None, listing.split("\0")):
        meta, path = entry.split("\t", 1)
        mode, blob, _ = meta.split()
        if mode == "120000":
            links[path] = subprocess.run(["git", "cat-file", "-p", blob], cwd=ROOT, capture_output=True,
                                         text=True, check=True).stdout
    return links


def test_no_committed_symlink_points_outside_the_checkout():
    bad = []
    for path, target in tracked_links().items():
        where = os.path.normpath(os.path.join(os.path.dirname(path), target))     # relative to the checkout
        if os.path.isabs(target) or where == ".." or where.startswith("../"):
            bad.append(f"{path} -> {target}")
    assert bad == [], "committed symlinks that dangle in a clone: " + ", ".join(bad)


def test_the_local_wheel_cache_is_ignored_whatever_it_is():
    # .whl is each machine's own (scripts/device/pack.sh): a directory, or a link to one elsewhere.
    for kind in (".whl", ".whl/device/x.whl"):
        r = subprocess.run(["git", "check-ignore", "--no-index", "-q", kind], cwd=ROOT)
        assert r.returncode == 0, f"{kind} is not ignored"
