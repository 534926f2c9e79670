"""Rewrite images/schemas/runpod-rest-v2.json from a copy of RunPod's published OpenAPI document.

    python -m images.runpod.vendor OPENAPI.json --commit SHA --date YYYY-MM-DD [--gpu-types GPU-TYPES.mdx]

The file keeps, verbatim, the operations Kiln calls (OPERATIONS) and every component they reach
through `$ref`, whole: nothing is edited, so a body that validates here validates against the
document RunPod publishes. The notes written by hand (`verified`, `unresolved`, `kiln_reading`)
are carried over from the current file. `--gpu-types` refreshes the GPU id list and the serverless
pool table from the docs page references/gpu-types.mdx (the v2 document enumerates neither: the
catalog is live; `endpoint plan` reads the pool table offline, `endpoint up` the live catalog).
Get the document from the public runpod/docs repository, api-reference-v2/openapi.json.

The file is vendored, not generated: `python build.py generate --check` cannot re-derive it
without the document, but checks what the file shows alone (excerpt_problems): it holds exactly
the operations in OPERATIONS, and exactly the components they reach through `$ref`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

from ..paths import RUNPOD_SCHEMA

DOCUMENT_PATH = "api-reference-v2/openapi.json"
GPU_TYPES_PATH = "references/gpu-types.mdx"
REPOSITORY = "https://github.com/runpod/docs"
# Every operation Kiln sends or its stand-in answers (the stop action only so the stand-in can
# prove Kiln never calls it).
OPERATIONS: dict[str, tuple[str, ...]] = {
    "/v2/templates": ("get", "post"),
    "/v2/templates/{id}": ("get", "patch", "delete"),
    "/v2/pods": ("get", "post"),
    "/v2/pods/{id}": ("get", "delete"),
    "/v2/pods/{id}/logs": ("get",),
    "/v2/pods/{id}/action": ("post",),
    "/v2/catalog/gpus": ("get",),
    "/v2/network-volumes": ("get", "post"),
    "/v2/network-volumes/{id}": ("get", "delete"),
    "/v2/serverless": ("get", "post"),
    "/v2/serverless/{id}": ("get", "patch", "delete"),
    "/v2/serverless/{id}/workers": ("get",),
    "/v2/serverless/{id}/workers/{workerId}/logs": ("get",),
    "/v2/serverless/{id}/releases": ("get",),
    "/v2/clusters": ("get", "post"),
    "/v2/clusters/{id}": ("get", "delete"),
    "/v2/clusters/{id}/pods": ("get",),
}
METHODS = ("get", "put", "post", "patch", "delete")


def _refs(node: Any, out: set[str]) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                out.add(v)
            else:
                _refs(v, out)
    elif isinstance(node, list):
        for v in node:
            _refs(v, out)


def excerpt(doc: dict[str, Any]) -> dict[str, Any]:
    """The operations Kiln uses and the transitive closure of their components, verbatim."""
    paths: dict[str, Any] = {}
    for path, methods in OPERATIONS.items():
        item = doc["paths"][path]
        paths[path] = {k: v for k, v in item.items() if k not in METHODS or k in methods}
    todo: set[str] = set()
    _refs(paths, todo)
    seen: set[str] = set()
    components: dict[str, dict[str, Any]] = {}
    while todo:
        ref = todo.pop()
        if ref in seen:
            continue
        seen.add(ref)
        _, section, name = ref.removeprefix("#/").split("/")
        node = doc["components"][section][name]
        components.setdefault(section, {})[name] = node
        _refs(node, todo)
    components = {s: dict(sorted(v.items())) for s, v in sorted(components.items())}
    return {"openapi": doc["openapi"], "info": doc["info"], "servers": doc["servers"],
            "security": doc.get("security"), "paths": paths, "components": components}


def excerpt_problems(vendored: dict[str, Any]) -> list[str]:
    """Why `vendored` is not what `excerpt` makes of a document: operations missing or added, a `$ref`
    it cannot resolve, a component nothing reaches, provenance naming other operations."""
    problems: list[str] = []
    paths = vendored.get("paths") or {}
    missing = [f"{m.upper()} {p}" for p, ms in OPERATIONS.items() for m in ms if m not in paths.get(p, {})]
    extra = [f"{m.upper()} {p}" for p, item in paths.items() for m in item
             if m in METHODS and m not in OPERATIONS.get(p, ())]
    if missing:
        problems.append(f"operations Kiln calls are missing: {', '.join(missing)}")
    if extra:
        problems.append(f"operations Kiln does not call are kept: {', '.join(extra)}")
    if missing:
        return problems
    try:
        again = excerpt(vendored)
    except KeyError as e:
        return problems + [f"a $ref reaches {e.args[0]!r}, which the file does not hold"]
    kept = vendored.get("components") or {}
    for section in sorted(set(again["components"]) | set(kept)):
        unreached = sorted(set(kept.get(section, {})) - set(again["components"].get(section, {})))
        if unreached:
            problems.append(f"components.{section} nothing reaches: {', '.join(unreached)}")
    named = (vendored.get("provenance") or {}).get("excerpt")
    if named != {p: list(m) for p, m in OPERATIONS.items()}:
        problems.append("provenance.excerpt does not name OPERATIONS")
    return problems


def gpu_ids(mdx: str) -> list[str]:
    """The `GPU ID` column of the first table of references/gpu-types.mdx."""
    ids, in_table = [], False
    for line in mdx.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == "GPU ID":
            in_table = True
            continue
        if in_table:
            if not line.strip().startswith("|"):
                break
            if not re.fullmatch(r"-+", cells[0]):
                ids.append(cells[0])
    return ids


def gpu_pools(mdx: str) -> dict[str, list[str]]:
    """The `Pool ID` table of references/gpu-types.mdx: pool id -> the GPU names it lists (short
    names as the page writes them, "A6000", "6000 Ada": not the catalog's type ids)."""
    pools: dict[str, list[str]] = {}
    in_table = False
    for line in mdx.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == "Pool ID":
            in_table = True
            continue
        if in_table:
            if not line.strip().startswith("|"):
                break
            if len(cells) >= 2 and not re.fullmatch(r":?-+:?", cells[0]):
                pools[cells[0].strip("`")] = [g.strip() for g in cells[1].split(",") if g.strip()]
    return pools


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m images.runpod.vendor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("openapi", type=Path)
    ap.add_argument("--commit", required=True, help="the runpod/docs commit the copy is from (40 hex)")
    ap.add_argument("--date", required=True, help="that commit's date")
    ap.add_argument("--gpu-types", type=Path, help=f"{GPU_TYPES_PATH} at the same commit")
    args = ap.parse_args(argv)
    if not re.fullmatch(r"[0-9a-f]{40}", args.commit):
        print(f"error: --commit {args.commit!r}: expected 40 hex digits", file=sys.stderr)
        return 2
    raw = args.openapi.read_bytes()
    old = json.loads(RUNPOD_SCHEMA.read_text(encoding="utf-8")) if RUNPOD_SCHEMA.is_file() else {}
    gpu = old.get("gpu_types", {})
    if args.gpu_types:
        mdx = args.gpu_types.read_text(encoding="utf-8")
        gpu = {"from": f"{REPOSITORY}/blob/{args.commit}/{GPU_TYPES_PATH}",
               "rendered_at": "https://docs.runpod.io/references/gpu-types",
               "ids": gpu_ids(mdx), "serverless_pools": gpu_pools(mdx)}
    out = {
        "$comment": old.get("$comment", ""),
        "provenance": {
            "repository": REPOSITORY, "path": DOCUMENT_PATH, "commit": args.commit, "commit_date": args.date,
            "copied_from": f"{REPOSITORY}/blob/{args.commit}/{DOCUMENT_PATH}",
            "document_sha256": hashlib.sha256(raw).hexdigest(), "document_bytes": len(raw),
            "excerpt": {p: list(m) for p, m in OPERATIONS.items()},
        },
        "verified": old.get("verified", []),
        "unresolved": old.get("unresolved", []),
        "kiln_reading": old.get("kiln_reading", []),
        "gpu_types": gpu,
        **excerpt(json.loads(raw)),
    }
    RUNPOD_SCHEMA.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(RUNPOD_SCHEMA)
    return 0


if __name__ == "__main__":
    sys.exit(main())
