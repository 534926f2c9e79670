"""RunPod's REST API (v1), the few calls Kiln makes: templates by name, and a Pod from a template.

    upsert_template(api, body)   create the template, or update the one with its name (names are
                                 unique per account); unchanged -> no write at all

Every body is checked against the kept schema (images/runpod_schema.py) before it is sent.
Errors never carry the API key, the request headers, or the body Kiln sent (a template's env holds
only secret references, but a caller's might not): only the status, the operation, and RunPod's
own message with anything that looks like the key removed.

The base URL is $RUNPOD_API_URL when set (tests point it at a local stand-in), else
https://rest.runpod.io/v1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

import requests

from supervisor.errors import KilnError

from . import runpod_schema
from supervisor.redact import redact

DEFAULT_BASE_URL = "https://rest.runpod.io/v1"
# TemplateCreateInput fields TemplateUpdateInput lacks: fixed at creation.
CREATE_ONLY = ("category", "isServerless")


class RunPodAPIError(KilnError):
    """A RunPod API call failed. `status` is the HTTP status (0: no answer)."""

    def __init__(self, operation: str, status: int, message: str):
        self.operation = operation
        self.status = status
        super().__init__(f"RunPod API {operation}: " + (f"HTTP {status}: " if status else "") + message)


@dataclass(frozen=True)
class UpsertResult:
    action: str          # created | updated | unchanged
    template_id: str
    name: str


class RunPodAPI:
    def __init__(self, api_key: str, base_url: str | None = None, *, timeout: float = 60.0,
                 session: requests.Session | None = None):
        if not api_key:
            raise KilnError("RUNPOD_API_KEY is empty: create an API key in RunPod's console (Settings > API Keys)")
        self._key = api_key
        self.base_url = (base_url or os.environ.get("RUNPOD_API_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.timeout = timeout
        self._s = session or requests.Session()

    def _scrub(self, text: str) -> str:
        text = redact(text, [self._key])
        return " ".join(text.split())[:300]

    def _call(self, method: str, path: str, operation: str, *, json_body: Any = None,
              params: Mapping[str, str] | None = None, ok: tuple[int, ...] = (200,)) -> Any:
        try:
            r = self._s.request(method, self.base_url + path, json=json_body, params=params, timeout=self.timeout,
                                headers={"Authorization": f"Bearer {self._key}", "Accept": "application/json"})
        except requests.RequestException as e:
            # requests' messages name the URL, never headers; scrub anyway.
            raise RunPodAPIError(operation, 0, self._scrub(f"{type(e).__name__}: {e}")) from None
        if r.status_code not in ok:
            hint = " (is RUNPOD_API_KEY valid, with read/write access?)" if r.status_code in (401, 403) else ""
            raise RunPodAPIError(operation, r.status_code, self._scrub(_message(r)) + hint)
        if r.status_code == 204 or not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            raise RunPodAPIError(operation, r.status_code, "the answer is not JSON") from None

    # -- templates -------------------------------------------------------------------------
    def list_templates(self) -> list[dict[str, Any]]:
        out = self._call("GET", "/templates", "GET /templates")
        if not isinstance(out, list):
            raise RunPodAPIError("GET /templates", 200, "expected a list of templates")
        return out

    def create_template(self, body: Mapping[str, Any]) -> dict[str, Any]:
        runpod_schema.check(dict(body), "TemplateCreateInput")
        return self._call("POST", "/templates", "POST /templates", json_body=dict(body))

    def update_template(self, template_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        runpod_schema.check(dict(body), "TemplateUpdateInput")
        return self._call("PATCH", f"/templates/{template_id}", f"PATCH /templates/{template_id}",
                          json_body=dict(body))

    def delete_template(self, template_id: str) -> None:
        self._call("DELETE", f"/templates/{template_id}", f"DELETE /templates/{template_id}", ok=(200, 204))

    # -- pods (CI's selftest on a RunPod GPU) ----------------------------------------------
    def create_pod(self, body: Mapping[str, Any]) -> dict[str, Any]:
        runpod_schema.check(dict(body), "PodCreateInput")
        return self._call("POST", "/pods", "POST /pods", json_body=dict(body), ok=(200, 201))

    def terminate_pod(self, pod_id: str) -> None:
        """DELETE /pods/{id}: terminate, never stop (a stopped Pod's volume bills at twice the rate)."""
        self._call("DELETE", f"/pods/{pod_id}", f"DELETE /pods/{pod_id}", ok=(200, 204))


def _message(r: requests.Response) -> str:
    try:
        data = r.json()
    except ValueError:
        return r.text or r.reason or "no message"
    if isinstance(data, dict):
        for key in ("error", "message", "detail"):
            if data.get(key):
                return str(data[key])
    return str(data)


def _same(existing: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    return all(existing.get(k) == v for k, v in body.items())


def upsert_template(api: RunPodAPI, body: Mapping[str, Any]) -> UpsertResult:
    """Create the template named body["name"], or bring the existing one to `body`. Idempotent:
    a second run with the same body writes nothing."""
    runpod_schema.check(dict(body), "TemplateCreateInput")
    name = body["name"]
    found = [t for t in api.list_templates() if t.get("name") == name]
    if len(found) > 1:
        ids = ", ".join(str(t.get("id")) for t in found)
        raise RunPodAPIError("upsert", 0, f"{len(found)} templates are named {name!r} ({ids}); "
                             "template names should be unique: delete the extra ones")
    if not found:
        created = api.create_template(body)
        return UpsertResult("created", str(created.get("id")), name)
    existing = found[0]
    tid = str(existing.get("id"))
    fixed = [k for k in CREATE_ONLY if k in body and k in existing and existing[k] != body[k]]
    if fixed:
        raise RunPodAPIError("upsert", 0, f"template {name!r} ({tid}) has {', '.join(fixed)} "
                             f"{[existing[k] for k in fixed]}, which cannot be updated; delete it or rename "
                             "this one ([runpod] template_name)")
    if _same(existing, body):
        return UpsertResult("unchanged", tid, name)
    update = {k: v for k, v in body.items() if k not in CREATE_ONLY}
    api.update_template(tid, update)
    return UpsertResult("updated", tid, name)
