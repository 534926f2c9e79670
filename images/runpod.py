"""RunPod templates generated from targets: `python build.py --target T --runpod-template`.

The seed created pods with `create-pod` and no start command, so the container ran the image's
default; a pod's start command cannot be fixed in place, only a template's. So Kiln deploys from a
template that says everything explicitly:

- imageName: the target's immutable tag (images/tags.py), the one `build.py` gives the image;
- dockerEntrypoint and dockerStartCmd: never [] (RunPod's "use the image default"), taken from the
  ENTRYPOINT and CMD of the Dockerfile Kiln renders for the target, so they cannot drift apart;
- env: secrets as RunPod secret references ({{ RUNPOD_SECRET_<name> }}), never values: this module
  never reads a secret's value from anywhere; the API and status ports from the deploy config;
- ports: the API and the status page over RunPod's HTTP proxy, plus a TCP port for requests the
  proxy cuts (~100-125 s, error 524); container disk, volume size and mount path.

The body is a TemplateCreateInput of RunPod's published REST API, checked against the kept schema
(images/runpod_schema.py) before anyone prints or sends it. Committed goldens:
images/rendered/<target>/runpod-template.json (`python -m images.golden` rewrites them).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from supervisor.errors import KilnError

from . import render, runpod_schema, tags
from .lock import Pin
from .target import Target


@dataclass(frozen=True)
class RunPodTemplate:
    body: dict[str, Any]               # a TemplateCreateInput, schema-checked
    floating: tuple[str, ...]          # unresolved pins of the image it names ("" when reproducible)

    @property
    def name(self) -> str:
        return str(self.body["name"])

    def to_json(self) -> str:
        return dumps(self.body)


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


def build_template(target: Target, pins: Mapping[str, Pin], *, repository: str | None = None,
                   image: str | None = None, name: str | None = None,
                   registry_auth_id: str | None = None) -> RunPodTemplate:
    """The template for `target`. `image` replaces the whole image reference (CI points a staging
    template at a staging tag); `repository` only the repository part of the release tag."""
    floating = tags.floating_keys(target, pins)
    image_ref = image or tags.release_tag(target, pins, repository)
    ctx = render.make_context(target, dict(pins), allow_floating=True)
    entrypoint, cmd = exec_form(render.render_dockerfile(ctx))
    cfg = target.deploy_config()
    rp = target.runpod

    env = {key: secret_ref(secret) for key, secret in rp.secrets}
    env["KILN_SERVER_PORT"] = str(cfg.server.port)
    env["KILN_STATUS_PORT"] = str(cfg.status.port)
    env.update(dict(rp.env))
    body: dict[str, Any] = {
        "name": name or rp.template_name,
        "imageName": image_ref,
        "category": "NVIDIA" if target.is_gpu else "CPU",
        "isServerless": False,
        "isPublic": False,
        "dockerEntrypoint": entrypoint,
        "dockerStartCmd": cmd,
        "env": dict(sorted(env.items())),
        "ports": list(rp.ports),
        "containerDiskInGb": rp.container_disk_gb,
        "volumeInGb": rp.volume_gb,
        "volumeMountPath": rp.volume_mount,
        "readme": readme(target, image_ref, floating),
    }
    if registry_auth_id:
        body["containerRegistryAuthId"] = registry_auth_id
    runpod_schema.check(body, "TemplateCreateInput")
    return RunPodTemplate(body=body, floating=floating)


def readme(target: Target, image_ref: str, floating: tuple[str, ...]) -> str:
    cfg = target.deploy_config()
    rp = target.runpod
    api, status = cfg.server.port, cfg.status.port
    tcp = [p for p in rp.port_numbers("tcp") if p not in (api, status)]
    lines = [
        f"# Kiln: {target.name}",
        "",
        target.description + ".",
        "",
        f"Image `{image_ref}`. Generated by Kiln from images/targets/{target.name}.toml "
        f"(`python build.py --target {target.name} --runpod-template`): change the target, not this template.",
    ]
    if floating:
        lines += ["", f"**FLOATING**: {', '.join(floating)} unresolved. The image is labelled io.kiln.floating=true "
                      "and cannot be rebuilt bit for bit."]
    lines += [
        "",
        "## Ports",
        "",
        f"- `{api}/http`: the OpenAI-compatible API, `https://<POD_ID>-{api}.proxy.runpod.net/v1`, with "
        f"`Authorization: Bearer <your kiln_api_key>`. RunPod's proxy closes a request after ~100 s (error 524).",
        f"- `{status}/http`: Kiln's status page (`/ready`, `/status`, `/metrics`). `/ready` turns 200 after the "
        "selftest passed.",
    ]
    for port in tcp:
        if port == cfg.server.tcp_port:
            lines.append(f"- `{port}/tcp`: the same API over plain TCP at the Pod's public IP and mapped port (the "
                         "supervisor relays it to the engine), for requests longer than the proxy allows, such as "
                         "a long cold prefill.")
        else:
            lines.append(f"- `{port}/tcp`: exposed, but the deploy config relays nothing there "
                         "(set [server] tcp_port to use it for the API).")
    lines += ["", "## Secrets", "", "Create these RunPod secrets first (Settings > Secrets); the template holds "
              "only references:", ""]
    lines += [f"- `{secret}` -> `{key}`" for key, secret in rp.secrets]
    if target.profiles:
        lines += ["", "## Profiles", ""]
        lines += [f"- `{n}`: set `KILN_CONFIG=/etc/kiln/profiles/{n}.toml`" for n in sorted(target.profiles)]
    lines += [
        "",
        "## Cost",
        "",
        "Terminate the Pod when done, never Stop it: a stopped Pod's volume bills at twice the running "
        "rate, and a stopped Pod is pinned to its host. Model weights are re-downloaded on the next Pod.",
    ]
    return "\n".join(lines) + "\n"
