"""RunPod's published REST API schema, kept in the repo, and a validator for request bodies.

images/schemas/runpod-rest-v1.json holds verbatim excerpts of RunPod's OpenAPI document (where
and when they came from is in the file, with what is verified and what is not). Every body Kiln
sends is checked against it first, collecting every problem; Kiln's stricter reading (no field
the schema does not list, env values are strings, ports look like N/http or N/tcp) is applied on
top, so a field Kiln invented can never reach RunPod.

The validator covers the JSON Schema keywords those excerpts use (type, required, properties,
items, enum, minimum, maximum, maxLength, $ref); a test cross-checks it against the
`jsonschema` library on the same bodies. Stdlib only: build.py must not need a dev extra.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from supervisor.errors import ConfigError
from supervisor.validate import Problem

SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "runpod-rest-v1.json"
PORT_RE = re.compile(r"[0-9]{1,5}/(http|tcp)")
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "integer": (int,), "number": (int, float),
    "boolean": (bool,),
}


class RunPodSchemaError(ConfigError):
    """A request body does not match RunPod's published schema (every problem listed)."""


@lru_cache(maxsize=1)
def document() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def schema(name: str) -> dict[str, Any]:
    return document()["components"]["schemas"][name]


def gpu_types() -> tuple[str, ...]:
    """RunPod's GPU type ids, as PodCreateInput.gpuTypeIds enumerates them."""
    return tuple(schema("PodCreateInput")["properties"]["gpuTypeIds"]["items"]["enum"])


def problems(body: Any, name: str) -> list[Problem]:
    """Every way `body` fails components.schemas.<name>, plus Kiln's stricter reading."""
    out: list[Problem] = []
    _check(body, schema(name), name, out, strict=True)
    return out


def check(body: Any, name: str) -> None:
    found = problems(body, name)
    if found:
        raise RunPodSchemaError(f"RunPod {name} (schema: {SCHEMA_PATH.name})", found)


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if not ref:
        return node
    assert ref.startswith("#/"), ref
    cur: Any = document()
    for part in ref[2:].split("/"):
        cur = cur[part]
    return cur


def _type_ok(value: Any, kind: str) -> bool:
    if isinstance(value, bool) and kind not in ("boolean",):
        return False
    return isinstance(value, _TYPES[kind])


def _check(value: Any, node: dict[str, Any], path: str, out: list[Problem], *, strict: bool) -> None:
    node = _resolve(node)
    if value is None and node.get("nullable"):
        return
    kind = node.get("type")
    if kind and not _type_ok(value, kind):
        out.append(Problem(path, f"must be of type {kind}", value))
        return
    if "enum" in node and value not in node["enum"]:
        out.append(Problem(path, "is not one of the values the schema allows", value, ", ".join(map(str, node["enum"]))))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in node and value < node["minimum"]:
            out.append(Problem(path, f"must be >= {node['minimum']}", value))
        if "maximum" in node and value > node["maximum"]:
            out.append(Problem(path, f"must be <= {node['maximum']}", value))
    if isinstance(value, str) and "maxLength" in node and len(value) > node["maxLength"]:
        out.append(Problem(path, f"must be at most {node['maxLength']} characters", len(value)))
    if kind == "array" and "items" in node:
        for i, item in enumerate(value):
            _check(item, node["items"], f"{path}[{i}]", out, strict=strict)
        if strict and path.endswith(".ports"):
            for i, item in enumerate(value):
                if isinstance(item, str) and not PORT_RE.fullmatch(item):
                    out.append(Problem(f"{path}[{i}]", "must be [port number]/[protocol], protocol http or tcp",
                                       item, "e.g. 8080/http, 8082/tcp"))
    if kind == "object":
        props: dict[str, Any] = node.get("properties", {})
        for req in node.get("required", []):
            if req not in value:
                out.append(Problem(f"{path}.{req}", "is required"))
        for key, item in value.items():
            if key in props:
                _check(item, props[key], f"{path}.{key}", out, strict=strict)
            elif props and strict:
                out.append(Problem(f"{path}.{key}", "is not a property the schema lists (Kiln sends no invented field)",
                                   allowed=", ".join(sorted(props))))
            elif not props and "items" in node:
                # RunPod declares env as {type: object, items: {type: string}}: read as the value type.
                _check(item, node["items"], f"{path}.{key}", out, strict=strict)
