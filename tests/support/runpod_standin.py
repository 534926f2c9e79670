"""A stand-in for RunPod's REST API (v1) on loopback: the template and Pod routes Kiln calls.

It is not RunPod. It enforces what RunPod publishes (images/schemas/runpod-rest-v1.json), checked
with the `jsonschema` library rather than Kiln's own validator, plus the semantics the document
states: template names are unique (a create or rename onto a taken name fails), TemplateUpdateInput
cannot change category or isServerless, a Pod needs an existing templateId. It is stricter than
RunPod may be in one way: a property the schema does not list is refused (RunPod's handling of
unknown properties is unverified, so Kiln must never send one). It records every request, so tests
can prove an idempotent run writes nothing, and a Pod that was stopped rather than terminated.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jsonschema

from images.runpod_schema import document

TEMPLATE_DEFAULTS = {
    "category": "NVIDIA", "containerDiskInGb": 50, "dockerEntrypoint": [], "dockerStartCmd": [], "env": {},
    "isPublic": False, "isServerless": False, "ports": ["8888/http", "22/tcp"], "readme": "", "volumeInGb": 20,
    "volumeMountPath": "/workspace",
}


def _strict(name: str) -> dict[str, Any]:
    """The published schema, with unknown properties refused and env read as a string map."""
    s = copy.deepcopy(document()["components"]["schemas"][name])
    s["additionalProperties"] = False
    env = s["properties"].get("env")
    if env is not None:
        env["additionalProperties"] = env.pop("items")
    ports = s["properties"].get("ports")
    if ports is not None:
        ports.pop("default", None)     # the document's string default on an array property
    return s


class RunPodStandIn:
    def __init__(self, api_key: str):
        self.api_key = api_key
        self.templates: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.fail_next: tuple[int, str] | None = None     # (status, body) for the next call
        self._ids = (f"{n:010x}" for n in itertools.count(0x5a17))
        self._lock = threading.Lock()
        self._schemas = {n: _strict(n) for n in ("TemplateCreateInput", "TemplateUpdateInput", "PodCreateInput")}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "RunPodStandIn":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def writes(self) -> list[tuple[str, str]]:
        return [r for r in self.requests if r[0] != "GET"]

    # -- semantics ---------------------------------------------------------------------------
    def _errors(self, body: Any, schema: str) -> list[str]:
        v = jsonschema.Draft7Validator(self._schemas[schema])
        return [f"{'.'.join(map(str, e.absolute_path)) or '(body)'}: {e.message}" for e in v.iter_errors(body)]

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        m = re.fullmatch(r"/v1/templates(?:/([^/]+))?(/update)?", path)
        if m:
            tid, update = m.group(1), m.group(2)
            if method == "GET" and not tid:
                return 200, list(self.templates.values())
            if method == "POST" and not tid:
                return self._create(body)
            if tid and tid not in self.templates:
                return 404, {"error": "Template not found."}
            if method == "GET":
                return 200, self.templates[tid]
            if (method == "PATCH" and not update) or (method == "POST" and update):
                return self._update(tid, body)
            if method == "DELETE":
                del self.templates[tid]
                return 204, None
        m = re.fullmatch(r"/v1/pods(?:/([^/]+))?(/stop)?", path)
        if m:
            pid, stop = m.group(1), m.group(2)
            if method == "POST" and not pid:
                errors = self._errors(body, "PodCreateInput")
                if errors:
                    return 400, {"error": "Invalid input.", "details": errors}
                if body.get("templateId") not in self.templates:
                    return 400, {"error": f"template {body.get('templateId')!r} does not exist"}
                pod = {"id": next(self._ids), "desiredStatus": "RUNNING", **body}
                self.pods[pod["id"]] = pod
                return 201, pod
            if pid not in self.pods:
                return 404, {"error": "Pod not found."}
            if method == "POST" and stop:
                self.pods[pid]["desiredStatus"] = "EXITED"
                return 200, self.pods[pid]
            if method == "DELETE":
                self.pods[pid]["desiredStatus"] = "TERMINATED"
                return 204, None
            if method == "GET":
                return 200, self.pods[pid]
        return 404, {"error": f"no route {method} {path}"}

    def _create(self, body: Any) -> tuple[int, Any]:
        errors = self._errors(body, "TemplateCreateInput")
        if errors:
            return 400, {"error": "Invalid input.", "details": errors}
        if any(t["name"] == body["name"] for t in self.templates.values()):
            return 400, {"error": f"Template name must be unique: {body['name']!r} exists"}
        t = {**TEMPLATE_DEFAULTS, **copy.deepcopy(body), "id": next(self._ids), "earned": 0, "isRunpod": False,
             "runtimeInMin": 0}
        self.templates[t["id"]] = t
        return 200, t

    def _update(self, tid: str, body: Any) -> tuple[int, Any]:
        errors = self._errors(body, "TemplateUpdateInput")
        if errors:
            return 400, {"error": "Invalid input.", "details": errors}
        name = body.get("name")
        if name and any(t["name"] == name and k != tid for k, t in self.templates.items()):
            return 400, {"error": f"Template name must be unique: {name!r} exists"}
        self.templates[tid].update(copy.deepcopy(body))
        return 200, self.templates[tid]

    # -- HTTP ----------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def _go(self) -> None:
                path = self.path.split("?", 1)[0]
                with standin._lock:
                    standin.requests.append((self.command, path))
                    if self.headers.get("Authorization") != f"Bearer {standin.api_key}":
                        return self._send(401, {"error": "Unauthorized."})
                    if standin.fail_next:
                        status, text = standin.fail_next
                        standin.fail_next = None
                        return self._send(status, {"error": text.replace("$AUTH", self.headers["Authorization"])})
                    length = int(self.headers.get("Content-Length") or 0)
                    body = None
                    if length:
                        try:
                            body = json.loads(self.rfile.read(length))
                        except ValueError:
                            return self._send(400, {"error": "body is not JSON"})
                    status, out = standin.handle(self.command, path, body)
                self._send(status, out)

            do_GET = do_POST = do_PATCH = do_DELETE = _go

            def _send(self, status: int, out: Any) -> None:
                data = b"" if out is None else json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
