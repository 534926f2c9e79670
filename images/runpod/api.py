"""RunPod's REST API v2, the calls Kiln makes. Every request body is checked against the vendored
schema (images/runpod/schema.py) first: a body that breaks it is never sent.

    templates / create_template / update_template / delete_template
    gpu_types                 GET /catalog/gpus?include=AVAILABILITY&product=POD (cudaVersions, prices)
    pods / pod / create_pod / terminate_pod    terminate is DELETE /pods/{id}; nothing here stops a pod
    pod_logs                  GET /pods/{id}/logs (Server-Sent Events)
    network_volumes / create_network_volume / delete_network_volume

Errors never carry the API key, the request headers or the body Kiln sent: only the operation,
the HTTP status and RunPod's own problem object (title, detail, errors) with anything that looks
like the key removed. The base URL is `base_url`, else $RUNPOD_API_URL (tests point it at the
stand-in, kiln_dev/runpod), else https://api.runpod.io/v2.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator, Mapping

import requests

from supervisor.errors import KilnError
from supervisor.redact import redact

from . import schema

DEFAULT_BASE_URL = "https://api.runpod.io/v2"


class RunPodAPIError(KilnError):
    """A RunPod API call failed. `status` is the HTTP status (0: no answer)."""

    def __init__(self, operation: str, status: int, message: str):
        self.operation = operation
        self.status = status
        super().__init__(f"RunPod API {operation}: " + (f"HTTP {status}: " if status else "") + message)


class RunPodAPI:
    def __init__(self, api_key: str, base_url: str | None = None, *, timeout: float = 60.0,
                 session: requests.Session | None = None):
        if not api_key:
            raise KilnError("RUNPOD_API_KEY is empty: create an API key in RunPod's console (Settings > API Keys)")
        self._key = api_key
        self.base_url = (base_url or os.environ.get("RUNPOD_API_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.timeout = timeout
        self._s = session or requests.Session()

    def scrub(self, text: str) -> str:
        return " ".join(redact(text, [self._key]).split())[:600]

    def _request(self, method: str, path: str, operation: str, *, body: Any = None, schema_name: str | None = None,
                 params: Mapping[str, Any] | None = None, ok: tuple[int, ...] = (200,),
                 stream: bool = False, timeout: Any = None, accept: str = "application/json") -> requests.Response:
        if schema_name is not None:
            schema.check(body, schema_name)          # before anything leaves the machine
        headers = {"Authorization": f"Bearer {self._key}", "Accept": accept}
        try:
            r = self._s.request(method, self.base_url + path, json=body, params=params, headers=headers,
                                timeout=timeout or self.timeout, stream=stream)
        except requests.RequestException as e:
            # requests' messages name the URL, never headers; scrub anyway.
            raise RunPodAPIError(operation, 0, self.scrub(f"{type(e).__name__}: {e}")) from None
        if r.status_code not in ok:
            hint = " (is RUNPOD_API_KEY valid, with read/write access?)" if r.status_code in (401, 403) else ""
            raise RunPodAPIError(operation, r.status_code, self.scrub(problem_text(r)) + hint)
        return r

    def _json(self, method: str, path: str, operation: str, **kw: Any) -> Any:
        r = self._request(method, path, operation, **kw)
        if r.status_code == 204 or not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            raise RunPodAPIError(operation, r.status_code, "the answer is not JSON") from None

    def _list(self, path: str, key: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        out = self._json("GET", path, f"GET {path}", params=params)
        items = out.get(key) if isinstance(out, dict) else None
        if not isinstance(items, list):
            raise RunPodAPIError(f"GET {path}", 200, f"expected {{\"{key}\": [...]}}")
        return items

    # -- templates ---------------------------------------------------------------------------
    def templates(self) -> list[dict[str, Any]]:
        return self._list("/templates", "templates")

    def create_template(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._json("POST", "/templates", "POST /templates", body=dict(body),
                          schema_name="CreateTemplateRequest", ok=(200, 201))

    def update_template(self, template_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._json("PATCH", f"/templates/{template_id}", f"PATCH /templates/{template_id}", body=dict(body),
                          schema_name="UpdateTemplateRequest")

    def delete_template(self, template_id: str) -> None:
        self._json("DELETE", f"/templates/{template_id}", f"DELETE /templates/{template_id}", ok=(200, 204))

    # -- catalog -------------------------------------------------------------------------------
    def gpu_types(self, *, count: int = 1, cloud: str = "SECURE") -> list[dict[str, Any]]:
        """GPU types with pod availability, per-GPU prices and the CUDA versions their hosts report."""
        return self._list("/catalog/gpus", "gpus",
                          params={"include": "AVAILABILITY", "product": "POD", "count": count, "cloud": cloud})

    # -- pods -------------------------------------------------------------------------------
    def pods(self) -> list[dict[str, Any]]:
        return self._list("/pods", "pods")

    def pod(self, pod_id: str) -> dict[str, Any]:
        return self._json("GET", f"/pods/{pod_id}", f"GET /pods/{pod_id}")

    def create_pod(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._json("POST", "/pods", "POST /pods", body=dict(body), schema_name="CreatePodRequest",
                          ok=(200, 201))

    def terminate_pod(self, pod_id: str) -> bool:
        """DELETE /pods/{id}: terminate, never stop. False when the pod was already gone (404)."""
        try:
            self._json("DELETE", f"/pods/{pod_id}", f"DELETE /pods/{pod_id}", ok=(200, 204))
        except RunPodAPIError as e:
            if e.status == 404:
                return False
            raise
        return True

    def pod_logs(self, pod_id: str, *, tail: int = 100, source: str | None = None,
                 idle_s: float = 3.0) -> Iterator[dict[str, Any]]:
        """The pod's log events ({source, line, ts}): the backfill of `tail` lines, then live lines
        until the stream is quiet for `idle_s` (the stream itself never ends)."""
        params: dict[str, Any] = {"tail": tail}
        if source:
            params["source"] = source
        op = f"GET /pods/{pod_id}/logs"
        r = self._request("GET", f"/pods/{pod_id}/logs", op, params=params, stream=True,
                          timeout=(self.timeout, idle_s), accept="text/event-stream")
        try:
            for raw in r.iter_lines(decode_unicode=True):
                if not raw or not raw.startswith("data:"):
                    continue
                try:
                    event = json.loads(raw[5:].strip())
                except ValueError:
                    continue
                if isinstance(event, dict):
                    yield event
        except (requests.ConnectionError, requests.Timeout):
            return          # quiet for idle_s (a read timeout), or the stream closed
        finally:
            r.close()

    # -- network volumes ---------------------------------------------------------------------
    def network_volumes(self) -> list[dict[str, Any]]:
        return self._list("/network-volumes", "networkVolumes")

    def create_network_volume(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._json("POST", "/network-volumes", "POST /network-volumes", body=dict(body),
                          schema_name="CreateNetworkVolumeRequest", ok=(200, 201))

    def delete_network_volume(self, volume_id: str) -> None:
        self._json("DELETE", f"/network-volumes/{volume_id}", f"DELETE /network-volumes/{volume_id}", ok=(200, 204))


def problem_text(r: requests.Response) -> str:
    """RunPod's RFC 9457 problem object as one line: detail, then each validation error."""
    try:
        data = r.json()
    except ValueError:
        return r.text or r.reason or "no message"
    if isinstance(data, dict):
        text = str(data.get("detail") or data.get("title") or data)
        errors = data.get("errors")
        if isinstance(errors, list) and errors:
            text += " [" + "; ".join(map(str, errors[:10])) + "]"
        return text
    return str(data)
