"""Image tags: immutable release tags and the staging tags CI pushes before a selftest.

A release tag names what is inside the image and never moves:

    <repository>:<target>-<kiln version>-<engine id>[-floating]

The engine id is the first 12 hex digits of the pinned engine source (git commit, or the sha256
of the sdist / wheel). A target with unresolved pins gets `floating` instead (or a `-floating`
suffix when only a patch floats): such a tag says it is not reproducible. CI pushes every image
to a staging tag first and copies it to the release tags only after every image of the run built
and passed its selftest (images/ci/promote.py); `docker buildx bake --push` tags each image as it
finishes even when a later one fails (docker/buildx#1089), which is what this avoids.
"""

from __future__ import annotations

import re
from typing import Mapping

from supervisor.errors import KilnError

from ..pins.lock import Pin, missing
from ..target import Target

REPOSITORY_RE = r"[a-z0-9][a-z0-9._:/-]*"


def floating_keys(target: Target, pins: Mapping[str, Pin]) -> tuple[str, ...]:
    """The unresolved pins that make an image floating (bases excluded when a base override is used)."""
    return tuple(m.split(":", 1)[0] for m in missing(target, pins))


def engine_id(pins: Mapping[str, Pin]) -> str:
    pin = pins.get("source.commit") or pins.get("source.sha256")
    if pin is None:
        return "na"
    return str(pin.value)[:12] if pin.value else "floating"


def release_tag(target: Target, pins: Mapping[str, Pin], repository: str | None = None, *,
                floating: bool | None = None) -> str:
    from supervisor import __version__

    repo = repository or target.image
    if not re.fullmatch(REPOSITORY_RE, repo) or ":" in repo.rsplit("/", 1)[-1]:
        raise KilnError(f"image repository {repo!r}: expected a repository such as ghcr.io/you/kiln (no tag)")
    is_floating = bool(floating_keys(target, pins)) if floating is None else floating
    eid = engine_id(pins)
    suffix = "-floating" if is_floating and eid != "floating" else ""
    return f"{repo}:{target.name}-{__version__}-{eid}{suffix}"


def staging_tag(release: str, run_id: str) -> str:
    """`repo:staging-<release tag>-<run id>`: unique per CI run, in the release's own repository
    (so promoting is a manifest copy inside one repository, no layer moves)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", run_id):
        raise KilnError(f"staging run id {run_id!r}: letters, digits, . _ - only")
    repo, _, tag = release.rpartition(":")
    out = f"staging-{tag}-{run_id}"
    if len(out) > 128:     # the OCI tag limit
        raise KilnError(f"staging tag {out!r} is longer than 128 characters")
    return f"{repo}:{out}"
