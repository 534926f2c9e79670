"""RunPod's published REST v2 schema, kept in the repo, and the check every request body passes
before it is sent.

images/schemas/runpod-rest-v2.json holds a verbatim excerpt of RunPod's OpenAPI 3.1 document
(api-reference-v2/openapi.json of the public runpod/docs repository; commit and hash in the
file, rewritten by `python -m images.runpod.vendor`). Its schemas are JSON Schema 2020-12
(`allOf` compositions closed with `unevaluatedProperties: false`), so the `jsonschema` library's
Draft202012Validator checks a body against them offline, with the document's `components` as the
root its `$ref`s resolve in. A body that breaks the schema never leaves the machine.

On top, Kiln checks the rules the document states in prose and leaves to RunPod's handler (400):
exactly one of `gpu`/`cpu` on a pod or an endpoint, a non-empty `gpu.allowedCudaVersions` never
with `gpu.minCudaVersion`, at most one of `mounts.persistent`/`mounts.network`, no persistent
mount on a CPU pod; and its own stricter reading: ports look like N/http or N/tcp (the document's
description), a template's or an endpoint's `args` is never empty (that would start the image's
default).
Every problem is collected and reported at once.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import jsonschema

from supervisor.errors import ConfigError
from supervisor.validate import Problem

from .paths import RUNPOD_SCHEMA

PORT_RE = re.compile(r"[0-9]{1,5}/(http|tcp)")
# The request bodies Kiln sends (components.schemas names).
REQUESTS = ("CreateTemplateRequest", "UpdateTemplateRequest", "CreatePodRequest", "CreateNetworkVolumeRequest",
            "CreateEndpointRequest", "UpdateEndpointRequest", "CreateClusterRequest")


class RunPodSchemaError(ConfigError):
    """A request body does not match RunPod's published schema (every problem listed)."""


@lru_cache(maxsize=1)
def document() -> dict[str, Any]:
    return json.loads(RUNPOD_SCHEMA.read_text(encoding="utf-8"))


def schema(name: str) -> dict[str, Any]:
    return document()["components"]["schemas"][name]


@lru_cache(maxsize=None)
def validator(name: str) -> jsonschema.Draft202012Validator:
    """Draft 2020-12 over `components.schemas.<name>`, its $refs resolved in the components."""
    root = {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$ref": f"#/components/schemas/{name}", "components": document()["components"]}
    return jsonschema.Draft202012Validator(root)


def gpu_types() -> tuple[str, ...]:
    """RunPod's GPU type ids as its docs list them (the v2 document enumerates none; `up` asks
    the live catalog, this list only catches a typo in a target offline)."""
    return tuple(document()["gpu_types"]["ids"])


def serverless_pools() -> dict[str, tuple[str, ...]]:
    """RunPod's serverless pools as its docs table lists them: pool id -> GPU short names ("A40").
    Offline only (`endpoint plan`); the live catalog's `pool` field is authoritative."""
    return {k: tuple(v) for k, v in document()["gpu_types"].get("serverless_pools", {}).items()}


def _path(name: str, parts: Any) -> str:
    out = name
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _declared(node: dict[str, Any], doc: dict[str, Any]) -> set[str]:
    """Property names a schema declares through its $ref and allOf chain."""
    ref = node.get("$ref")
    if isinstance(ref, str):
        _, section, name = ref.removeprefix("#/").split("/")
        node = doc["components"][section][name]
    names = set(node.get("properties", {}))
    for sub in node.get("allOf", []):
        names |= _declared(sub, doc)
    return names


def _message(error: jsonschema.ValidationError) -> str | None:
    """The error in words; for unevaluatedProperties only the names the schema never declares
    (when a sibling check fails, jsonschema counts every property as unevaluated)."""
    if error.validator != "unevaluatedProperties" or not isinstance(error.instance, dict):
        return error.message
    unknown = sorted(set(error.instance) - _declared(error.schema, document()))
    if not unknown:
        return None
    return f"{', '.join(map(repr, unknown))}: not a property the schema lists (Kiln sends no invented field)"


def problems(body: Any, name: str) -> list[Problem]:
    """Every way `body` fails components.schemas.<name>, then the handler's and Kiln's rules."""
    errors = sorted(validator(name).iter_errors(body), key=lambda e: list(map(str, e.absolute_path)))
    out = [Problem(_path(name, e.absolute_path), m) for e in errors if (m := _message(e)) is not None]
    if isinstance(body, dict):
        out += _rules(body, name)
    return out


def check(body: Any, name: str) -> None:
    found = problems(body, name)
    if found:
        raise RunPodSchemaError(f"RunPod {name} (schema: images/schemas/{RUNPOD_SCHEMA.name}; "
                                "nothing was sent)", found)


def _rules(body: dict[str, Any], name: str) -> list[Problem]:
    out: list[Problem] = []
    ports = body.get("ports")
    if isinstance(ports, list):
        for i, p in enumerate(ports):
            if isinstance(p, str) and not PORT_RE.fullmatch(p):
                out.append(Problem(f"{name}.ports[{i}]", "must be [port number]/[protocol], protocol http or tcp",
                                   p, "e.g. 8080/http, 8082/tcp"))
    if name in ("CreateTemplateRequest", "CreateEndpointRequest") and not str(body.get("args") or "").strip():
        out.append(Problem(f"{name}.args", "must start the supervisor explicitly: empty args run the image's "
                           "default command (Kiln never relies on it)", body.get("args", "")))
    mounts = body.get("mounts") if isinstance(body.get("mounts"), dict) else {}
    if mounts.get("persistent") and mounts.get("network"):
        out.append(Problem(f"{name}.mounts", "holds both persistent and network: at most one (RunPod answers 400)"))
    if name in ("CreatePodRequest", "CreateEndpointRequest"):
        has_gpu, has_cpu = "gpu" in body, "cpu" in body
        if has_gpu == has_cpu:
            allowed = "gpu: {id, count}, or cpu: {id, vcpuCount}" if name == "CreatePodRequest" \
                else "gpu: {pools, count}, or cpu: [{id, vcpuCount}]"
            out.append(Problem(name, "needs exactly one of gpu or cpu (RunPod answers 400)", allowed=allowed))
    gpu = body.get("gpu") if isinstance(body.get("gpu"), dict) else {}
    if gpu.get("allowedCudaVersions") and gpu.get("minCudaVersion"):
        out.append(Problem(f"{name}.gpu", "a non-empty allowedCudaVersions excludes minCudaVersion "
                           "(RunPod answers 400)", {k: gpu[k] for k in ("allowedCudaVersions", "minCudaVersion")}))
    if name == "CreatePodRequest":
        if "cpu" in body and mounts.get("persistent"):
            out.append(Problem(f"{name}.mounts.persistent", "is invalid on a CPU pod (network volumes only)"))
    return out
