"""Does the image a deployment names exist in its registry? Asked before anything is rented (issue 49):
a pod whose image cannot be pulled bills while RunPod retries the pull.

One manifest request (GET /v2/<repo>/manifests/<tag>, the OCI distribution API) with the Bearer token
flow registries use for anonymous pulls of public images (ghcr.io, Docker Hub), or the credentials in
$KILN_REGISTRY_USER / $KILN_REGISTRY_PASSWORD for a private one (images/ci/promote.py's client). A
registry on loopback (localhost, 127.0.0.1: a test's, or a mirror's) is spoken to over plain HTTP, as
Docker does for those hosts; every other one over HTTPS.

    found     the registry serves a manifest for the reference: go on
    missing   it answered that there is none (404 / MANIFEST_UNKNOWN / NAME_UNKNOWN): refuse, nothing rented
    unknown   it could not be asked (offline, a private image without credentials, an error): said, not refused
"""

from __future__ import annotations

from dataclasses import dataclass

import requests

from supervisor.errors import KilnError

from ..registry import client_for
from ..pins.resolve import split_ref


@dataclass(frozen=True)
class ImageCheck:
    verdict: str          # found | missing | unknown
    line: str


def check(ref: str, *, timeout: float = 15.0) -> ImageCheck:
    try:
        name, at, digest = ref.partition("@")
        registry, repo, tag = split_ref(name)
        tag = digest if at else tag            # repo@sha256:...: the manifest by its digest
    except KilnError as e:
        return ImageCheck("unknown", f"image {ref}: not checked ({e})")
    client = client_for(registry, timeout=timeout)
    try:
        found = client.get_digest(registry, repo, tag) if at else client.get(ref, push=False)
    except requests.RequestException as e:
        return ImageCheck("unknown", f"image {ref}: could NOT be checked, {registry} did not answer "
                                     f"({type(e).__name__}); RunPod will pull it as it is named")
    except KilnError as e:
        return ImageCheck("unknown", f"image {ref}: could NOT be checked ({e}); for a private image set "
                                     "KILN_REGISTRY_USER and KILN_REGISTRY_PASSWORD to check it before renting")
    if found is None:
        return ImageCheck("missing", f"image {ref}: {registry} has no manifest for {repo}:{tag}. Nothing was rented. "
                                     "Fix: build and push it first (`python build.py build --target T --image "
                                     f"{registry}/{repo} --push`), or name an image that exists (--image, --image-ref)")
    return ImageCheck("found", f"image {ref}: in its registry ({found.digest})")
