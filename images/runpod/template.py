"""RunPod templates generated from targets: `python build.py template --target T`.

The field notes' pod was created with no start command, so the container ran the image's default; a pod's
start command cannot be fixed in place, only a template's. So Kiln deploys from a template that
says everything explicitly, as a v2 CreateTemplateRequest:

- image: the target's immutable tag (images/build/tags.py), the one `build.py` gives the image;
- args: the CMD of the Dockerfile Kiln renders for the target (`run`), never empty. v2 has no
  entrypoint field, so the image's ENTRYPOINT (the supervisor, checked here) receives it;
- env: secrets as RunPod secret references ({{ RUNPOD_SECRET_<name> }}), never values: this
  module never reads a secret's value from anywhere; the API and status ports from the deploy
  config;
- ports: the API and the status page over RunPod's HTTP proxy, plus a TCP port for requests the
  proxy cuts (100 s per RunPod's docs, ~125 s measured, error 524); container disk; the volume as
  mounts.persistent; allowedCudaVersions = [cuda_floor(target)] for a GPU image (templates take
  only an exact list: a console deploy lands on a host reporting exactly that CUDA; `up` asks for
  minCudaVersion instead, after reading the catalog);
- startJupyter and startSsh false: they default to true, and Kiln's image runs neither.

Checked against the vendored schema (images/runpod_schema.py) before anyone prints or sends it.
Committed goldens: images/rendered/<target>/runpod-template.json (`python build.py generate`).
`upsert` creates the template or brings the one with its name to this body; a second run writes
nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from supervisor.errors import KilnError

from ..build import render, tags
from ..pins.lock import Pin
from ..target import Target
from .. import runpod_schema as schema
from .api import RunPodAPI, RunPodAPIError
from .cuda import cuda_floor

# The one shape an ENTRYPOINT must have for `args` to reach the supervisor.
SUPERVISOR_ENTRYPOINT_TAIL = ["-m", "supervisor"]
# An argument RunPod cannot split differently whatever its rule (the document does not give it).
PLAIN_ARG = re.compile(r"[A-Za-z0-9_./=:,+@%-]+")


@dataclass(frozen=True)
class RunPodTemplate:
    body: dict[str, Any]               # a CreateTemplateRequest, schema-checked
    floating: tuple[str, ...]          # unresolved pins of the image it names (() when reproducible)

    @property
    def name(self) -> str:
        return str(self.body["name"])

    def to_json(self) -> str:
        return dumps(self.body)


@dataclass(frozen=True)
class UpsertResult:
    action: str          # created | updated | unchanged
    template_id: str
    name: str


def dumps(body: Mapping[str, Any]) -> str:
    """The one serialisation: the golden files are compared to it byte for byte."""
    return json.dumps(body, indent=2, ensure_ascii=False) + "\n"


def secret_ref(name: str) -> str:
    """RunPod's reference syntax for a secret (docs.runpod.io/pods/templates/secrets)."""
    return "{{ RUNPOD_SECRET_" + name + " }}"


def exec_form(dockerfile: str) -> tuple[list[str], list[str]]:
    """The ENTRYPOINT and CMD (exec form, JSON arrays) a Dockerfile ends up with."""
    found: dict[str, list[str]] = {}
    for line in dockerfile.splitlines():
        m = re.match(r"(ENTRYPOINT|CMD)\s+(.*)$", line.strip())
        if m:
            try:
                value = json.loads(m.group(2))
            except json.JSONDecodeError:
                value = None
            if not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
                raise KilnError(f"{m.group(1)} {m.group(2)!r} is not a non-empty exec-form array: "
                                "a template cannot repeat it exactly")
            found[m.group(1)] = value
    if set(found) != {"ENTRYPOINT", "CMD"}:
        raise KilnError("the rendered Dockerfile has no ENTRYPOINT or no CMD for the template to repeat")
    return found["ENTRYPOINT"], found["CMD"]


def start_args(dockerfile: str) -> str:
    """The template's `args`: the image's CMD, handed to its ENTRYPOINT, which must be the supervisor."""
    entrypoint, cmd = exec_form(dockerfile)
    if entrypoint[-2:] != SUPERVISOR_ENTRYPOINT_TAIL:
        raise KilnError(f"ENTRYPOINT {entrypoint} does not end in {SUPERVISOR_ENTRYPOINT_TAIL}: the template's "
                        "args would not start the supervisor")
    bad = [a for a in cmd if not PLAIN_ARG.fullmatch(a)]
    if bad:
        raise KilnError(f"CMD argument(s) {bad} hold spaces or quotes: RunPod's args is one string and the "
                        "document does not say how it is split")
    return " ".join(cmd)


def build_template(target: Target, pins: Mapping[str, Pin], *, repository: str | None = None,
                   image: str | None = None, name: str | None = None,
                   registry: str | None = None) -> RunPodTemplate:
    """The template for `target`. `image` replaces the whole image reference (CI points a staging
    template at a staging tag); `repository` only the repository part of the release tag;
    `registry` is a RunPod container registry credential id, for a private image."""
    floating = tags.floating_keys(target, pins)
    image_ref = image or tags.release_tag(target, pins, repository)
    ctx = render.make_context(target, dict(pins), allow_floating=True)
    args = start_args(render.render_dockerfile(ctx))
    cfg = target.deploy_config()
    rp = target.runpod

    env = {key: secret_ref(secret) for key, secret in rp.secrets}
    env["KILN_SERVER_PORT"] = str(cfg.server.port)
    env["KILN_STATUS_PORT"] = str(cfg.status.port)
    env.update(dict(rp.env))
    body: dict[str, Any] = {
        "name": name or rp.template_name,
        "image": image_ref,
        "category": "NVIDIA" if target.is_gpu else "CPU",
        "args": args,
        "env": dict(sorted(env.items())),
        "ports": list(rp.ports),
        "disk": rp.container_disk_gb,
    }
    if rp.volume_gb:
        body["mounts"] = {"persistent": {"size": rp.volume_gb, "path": rp.volume_mount}}
    floor = cuda_floor(target)
    if floor:
        body["allowedCudaVersions"] = [floor]
    body.update(startJupyter=False, startSsh=False, public=False, serverless=False)
    if registry:
        body["registry"] = registry
    schema.check(body, "CreateTemplateRequest")
    return RunPodTemplate(body=body, floating=floating)


def _same(existing: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    return all(existing.get(k) == v for k, v in body.items())


def upsert(api: RunPodAPI, body: Mapping[str, Any]) -> UpsertResult:
    """Create the template named body["name"], or bring the existing one to `body` (PATCH: v2 may
    change every field Kiln sets). Idempotent: a second run with the same body writes nothing."""
    schema.check(dict(body), "CreateTemplateRequest")
    name = body["name"]
    found = [t for t in api.templates() if t.get("name") == name]
    if len(found) > 1:
        ids = ", ".join(str(t.get("id")) for t in found)
        raise RunPodAPIError("upsert", 0, f"{len(found)} templates are named {name!r} ({ids}); Kiln finds its "
                             "template by name: delete the extra ones")
    if not found:
        created = api.create_template(body)
        return UpsertResult("created", str(created.get("id")), name)
    existing = found[0]
    tid = str(existing.get("id"))
    if _same(existing, body):
        return UpsertResult("unchanged", tid, name)
    api.update_template(tid, {k: v for k, v in body.items() if existing.get(k) != v})
    return UpsertResult("updated", tid, name)
