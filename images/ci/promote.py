"""Promote-on-pass: copy staging tags to release tags, all or nothing, after every image passed.

CI builds each target into a staging tag (images/build/tags.py) and runs its selftest; only then does
the promote job call this once for the whole run. Nothing is written until every pair has been
checked: each staging manifest exists, each release tag lives in the staging tag's repository (a
manifest copy, no layer moves), and no immutable release tag already names a different image
(an immutable tag never moves; re-promoting the same digest is a no-op). Then the immutable tags
are written, then the moving ones (e.g. `<target>`). `docker buildx bake --push` tags each image
as it finishes even when a later target fails (docker/buildx#1089); this is the opposite.

Speaks the OCI distribution API directly (GET/PUT /v2/<repo>/manifests/<ref>) with the Bearer
token flow registries use (ghcr.io, Docker Hub); credentials from $KILN_REGISTRY_USER and
$KILN_REGISTRY_PASSWORD (in GitHub Actions: github.actor and GITHUB_TOKEN).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence


from ..pins.resolve import split_ref
from ..registry import Manifest, RegistryClient, RegistryError


class PromoteError(RegistryError):
    pass


@dataclass(frozen=True)
class Promotion:
    staging: str                    # repo:staging-tag
    immutable: tuple[str, ...]      # release tags that must never move
    moving: tuple[str, ...] = ()    # release tags that follow the latest promotion


def client_from_env(scheme: str = "https") -> RegistryClient:
    return RegistryClient(scheme=scheme, username=os.environ.get("KILN_REGISTRY_USER") or None,
                          password=os.environ.get("KILN_REGISTRY_PASSWORD") or None)


def promote(promotions: Sequence[Promotion], client: RegistryClient) -> list[str]:
    """Check everything, then write. Returns one line per tag: written / already there."""
    problems: list[str] = []
    plan: list[tuple[str, Manifest, bool]] = []      # (release ref, manifest, immutable)
    for p in promotions:
        s_reg, s_repo, _ = split_ref(p.staging)
        staged = client.get(p.staging)
        if staged is None:
            problems.append(f"{p.staging}: no such staging image (did its build push it?)")
            continue
        for ref, immutable in [(r, True) for r in p.immutable] + [(r, False) for r in p.moving]:
            reg, repo, _ = split_ref(ref)
            if (reg, repo) != (s_reg, s_repo):
                problems.append(f"{ref}: not in the staging image's repository {s_reg}/{s_repo}")
                continue
            if immutable:
                current = client.get(ref)
                if current is not None and current.digest != staged.digest:
                    problems.append(f"{ref}: already names {current.digest}, not {staged.digest}: an immutable "
                                    "tag never moves (bump the version or the engine pin)")
                    continue
                if current is not None:
                    plan.append((ref, staged, True))   # same digest: reported, not rewritten
                    continue
            plan.append((ref, staged, immutable))
    if problems:
        raise PromoteError("nothing promoted:\n  - " + "\n  - ".join(problems))
    done: list[str] = []
    for ref, manifest, immutable in sorted(plan, key=lambda x: not x[2]):
        current = client.get(ref) if immutable else None
        if current is not None and current.digest == manifest.digest:
            done.append(f"{ref} already {manifest.digest}")
            continue
        client.put(ref, manifest)
        done.append(f"{ref} -> {manifest.digest}")
    return done
