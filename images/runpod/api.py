"""RunPod's REST API v2, the calls Kiln makes. Every request body is checked against the vendored
schema (images/runpod_schema.py) first: a body that breaks it is never sent.

    templates / create_template / update_template / delete_template
    gpu_types                 GET /catalog/gpus?include=AVAILABILITY&product=POD|SERVERLESS (cudaVersions,
                              prices; for SERVERLESS each type's pool and price.serverless)
    pods / pod / create_pod / terminate_pod    terminate is DELETE /pods/{id}; nothing here stops a pod
    pod_logs                  GET /pods/{id}/logs (Server-Sent Events)
    network_volumes / create_network_volume / delete_network_volume
    endpoints / endpoint / create_endpoint / update_endpoint / delete_endpoint    /serverless[/{id}]
    endpoint_workers / endpoint_releases     GET /serverless/{id}/workers, /releases
    clusters / cluster / create_cluster / delete_cluster / cluster_pods    /clusters[/{id}[/pods]]
    worker_logs               GET /serverless/{id}/workers/{workerId}/logs (Server-Sent Events)

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

from .. import runpod_schema as schema

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
    def gpu_types(self, *, count: int = 1, cloud: str = "SECURE", product: str = "POD") -> list[dict[str, Any]]:
        """GPU types with their availability for `product` (POD, CLUSTER or SERVERLESS), per-GPU prices and
        the CUDA versions their hosts report; for SERVERLESS also each type's pool and its
        price.serverless. `cloud` filters pod capacity (a serverless endpoint takes no cloud)."""
        params: dict[str, Any] = {"include": "AVAILABILITY", "product": product, "count": count}
        if product == "POD":
            params["cloud"] = cloud
        return self._list("/catalog/gpus", "gpus", params=params)

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
        return self._delete(f"/pods/{pod_id}")

    def _delete(self, path: str) -> bool:
        """DELETE `path`; False when it was already gone (404)."""
        try:
            self._json("DELETE", path, f"DELETE {path}", ok=(200, 204))
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
        yield from self._events(f"/pods/{pod_id}/logs", params, idle_s)

    def _events(self, path: str, params: Mapping[str, Any], idle_s: float) -> Iterator[dict[str, Any]]:
        """A Server-Sent Events log stream's JSON events, until it is quiet for `idle_s`."""
        r = self._request("GET", path, f"GET {path}", params=params, stream=True,
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


    # -- serverless endpoints ----------------------------------------------------------------------
    def endpoints(self) -> list[dict[str, Any]]:
        return self._list("/serverless", "endpoints")

    def endpoint(self, endpoint_id: str) -> dict[str, Any]:
        return self._json("GET", f"/serverless/{endpoint_id}", f"GET /serverless/{endpoint_id}")

    def create_endpoint(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._json("POST", "/serverless", "POST /serverless", body=dict(body),
                          schema_name="CreateEndpointRequest", ok=(200, 201))

    def update_endpoint(self, endpoint_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PATCH: partial, only the fields in `body` change; a container change is a new release."""
        return self._json("PATCH", f"/serverless/{endpoint_id}", f"PATCH /serverless/{endpoint_id}",
                          body=dict(body), schema_name="UpdateEndpointRequest")

    def delete_endpoint(self, endpoint_id: str) -> bool:
        """DELETE /serverless/{id}: the endpoint and its workers. False when it was already gone (404)."""
        return self._delete(f"/serverless/{endpoint_id}")

    def endpoint_workers(self, endpoint_id: str) -> dict[str, Any]:
        """{workers: [Worker], summary, endpointVersion}: the active workers only."""
        return self._object(f"/serverless/{endpoint_id}/workers", "workers")

    def endpoint_releases(self, endpoint_id: str) -> dict[str, Any]:
        """{endpointVersion, rollout: RolloutSummary, releases: [Release], newest first}."""
        return self._object(f"/serverless/{endpoint_id}/releases", "releases")

    def worker_logs(self, endpoint_id: str, worker_id: str, *, tail: int = 100, source: str | None = None,
                    idle_s: float = 3.0) -> Iterator[dict[str, Any]]:
        """A worker's log events ({source, line, ts}), as pod_logs."""
        params: dict[str, Any] = {"tail": tail}
        if source:
            params["source"] = source
        yield from self._events(f"/serverless/{endpoint_id}/workers/{worker_id}/logs", params, idle_s)

    # -- instant clusters ----------------------------------------------------------------------
    def clusters(self) -> list[dict[str, Any]]:
        return self._list("/clusters", "clusters")

    def cluster(self, cluster_id: str) -> dict[str, Any]:
        return self._json("GET", f"/clusters/{cluster_id}", f"GET /clusters/{cluster_id}")

    def create_cluster(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._json("POST", "/clusters", "POST /clusters", body=dict(body), schema_name="CreateClusterRequest",
                          ok=(200, 201))

    def delete_cluster(self, cluster_id: str) -> bool:
        """DELETE /clusters/{id}: the cluster and every member pod. False when it was already gone (404)."""
        return self._delete(f"/clusters/{cluster_id}")

    def cluster_pods(self, cluster_id: str) -> list[dict[str, Any]]:
        """The member pods, each a whole Pod with `cluster` {id, rank, ip}."""
        return self._list(f"/clusters/{cluster_id}/pods", "pods")

    def _object(self, path: str, key: str) -> dict[str, Any]:
        out = self._json("GET", path, f"GET {path}")
        if not isinstance(out, dict) or not isinstance(out.get(key), list):
            raise RunPodAPIError(f"GET {path}", 200, f"expected an object with a {key!r} list")
        return out


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
