"""The stand-in's REST API v2: the routes Kiln calls, on loopback. See the package docstring.

Faithful where RunPod publishes (the vendored OpenAPI excerpt): request bodies against their
schemas (422, `errors` listing each violation), the handler rules the document states (400),
unknown ids (404), a missing or wrong key (401), wrapped list responses, 201 on create, 204 on
delete, the catalog's cudaVersions, the pod lifecycle. Every response body is itself checked
against the document's response schema, and a mismatch is recorded in `faults` (a test fails on
it): the stand-in cannot drift into answering what RunPod never would. Where RunPod publishes
nothing it chooses, and says so: template-name uniqueness (v1's rule), default disk, the
pod-scoped key's scope (its own pod only), prices (the document's example figures).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import secrets as _secrets
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

import jsonschema

from .containers import Container, NullRunner
from .proxy import ProxyRouter

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "images" / "schemas" / "runpod-rest-v2.json"
REASONS = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 409: "Conflict",
           422: "Unprocessable Entity", 500: "Internal Server Error"}


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def gpu_type(gpu_id: str, *, cuda: tuple[tuple[str, bool], ...] = (("12.8", True), ("13.0", True)),
             data_centers: tuple[tuple[str, str], ...] = (("EU-RO-1", "HIGH"),), memory: int = 48,
             price: tuple[float, float] = (0.44, 0.31), max_count: tuple[int, int] = (8, 4)) -> dict[str, Any]:
    """One catalog GpuType. The default prices are the document's own GpuType example figures
    (secure 0.44, community 0.31), test data, not a claim about any GPU's price."""
    return {"id": gpu_id, "name": gpu_id.replace("NVIDIA ", ""), "pool": None, "manufacturer": "NVIDIA",
            "memory": memory, "secure": True, "community": True,
            "price": {"secure": price[0], "community": price[1]},
            "maxCount": {"secure": max_count[0], "community": max_count[1]},
            "availability": "HIGH" if any(a for _, a in cuda) else "NONE",
            "dataCenters": [{"id": i, "name": i, "availability": a} for i, a in data_centers],
            "cudaVersions": [{"version": v, "available": a} for v, a in cuda]}


class Problem(Exception):
    def __init__(self, status: int, detail: str, errors: list[str] | None = None):
        super().__init__(detail)
        self.status, self.detail, self.errors = status, detail, errors


class RunPodStandIn:
    """RunPod's REST API v2 and HTTP proxy on loopback. Use as a context manager."""

    def __init__(self, api_key: str, *, catalog: list[dict[str, Any]] | None = None,
                 runner: Any = None, secrets: dict[str, str] | None = None):
        self.api_key = api_key
        self.catalog = catalog if catalog is not None else [gpu_type("NVIDIA A40")]
        self.runner = runner or NullRunner()
        self.secrets = dict(secrets or {})                 # RunPod secrets: name -> value
        self.templates: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.volumes: dict[str, dict[str, Any]] = {}
        self.containers: dict[str, Container] = {}
        self.history: dict[str, list[str]] = {}            # pod id -> statuses it went through
        self.system_log: dict[str, list[tuple[str, str]]] = {}
        self.terminated: dict[str, dict[str, Any]] = {}
        self.stopped: list[str] = []                       # pods something asked to stop (Kiln never must)
        self.pod_keys: dict[str, str] = {}                 # pod-scoped RUNPOD_API_KEY -> pod id
        self.requests: list[dict[str, Any]] = []           # method, path, query, body, auth: never headers
        self.faults: list[str] = []                        # responses that broke the document's schema
        self.fail_next: tuple[int, str] | None = None      # (status, detail) for the next call
        # (method, path) -> (status, detail): the next such call only is answered with that problem
        self.fail_on: dict[tuple[str, str], tuple[int, str]] = {}
        self._ids = (f"{n:010x}" for n in itertools.count(0x5a17c0))
        self.lock = threading.RLock()
        self.closing = threading.Event()
        doc = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
        self._components = doc["components"]
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.proxy = ProxyRouter(self)

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v2"

    @property
    def proxy_url(self) -> str:
        """The proxy pattern for Kiln's RUNPOD_PROXY_URL ({pod_id} and {port} filled in by Kiln)."""
        return self.proxy.pattern

    def __enter__(self) -> "RunPodStandIn":
        self.thread.start()
        self.proxy.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.closing.set()
        for c in list(self.containers.values()):
            c.stop()
        self.proxy.stop()
        self.server.shutdown()
        self.server.server_close()

    def writes(self) -> list[tuple[str, str]]:
        return [(r["method"], r["path"]) for r in self.requests if r["method"] != "GET"]

    def log_text(self) -> str:
        """Everything the stand-in recorded, for canary checks."""
        return json.dumps({"requests": self.requests, "templates": self.templates, "pods": self.pods,
                           "terminated": self.terminated, "system": self.system_log}, default=str)

    # -- schema ----------------------------------------------------------------------------------
    def validator(self, name: str) -> jsonschema.Draft202012Validator:
        return jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{name}",
                                                "components": self._components})

    def _check_request(self, body: Any, name: str) -> None:
        errors = sorted(self.validator(name).iter_errors(body), key=lambda e: list(map(str, e.absolute_path)))
        if errors:
            raise Problem(422, "Request validation failed.",
                          [f"$.{'.'.join(map(str, e.absolute_path))}: {e.message}".replace("$.:", "$:") for e in errors])

    def _answer(self, data: Any, name: str) -> Any:
        errors = list(self.validator(name).iter_errors(data))
        if errors:
            self.faults.append(f"{name}: " + "; ".join(e.message for e in errors[:5]))
        return data

    # -- routes ------------------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any, auth: str) -> tuple[int, Any]:
        m = re.fullmatch(r"/v2/templates(?:/([^/]+))?", path)
        if m:
            return self._templates(method, m.group(1), body)
        m = re.fullmatch(r"/v2/pods(?:/([^/]+))?(/action)?", path)
        if m:
            pid = m.group(1)
            if auth.startswith("pod:") and auth != f"pod:{pid}":
                raise Problem(403, "access denied")
            return self._pods(method, pid, bool(m.group(2)), body)
        if path == "/v2/catalog/gpus" and method == "GET":
            return 200, self._answer({"gpus": self._catalog(query)}, "ListGpuTypesResponse")
        m = re.fullmatch(r"/v2/network-volumes(?:/([^/]+))?", path)
        if m:
            return self._volumes(method, m.group(1), body)
        raise Problem(404, f"no route {method} {path}")

    def _templates(self, method: str, tid: str | None, body: Any) -> tuple[int, Any]:
        if tid is None and method == "GET":
            return 200, self._answer({"templates": list(self.templates.values())}, "ListTemplatesResponse")
        if tid is None and method == "POST":
            self._check_request(body, "CreateTemplateRequest")
            self._unique_name(body["name"], None)
            t = {"id": next(self._ids), "args": "", "disk": 50, "mounts": {}, "ports": [], "env": {},
                 "registry": None, "serverless": False, "public": False, "category": "NVIDIA",
                 "startSsh": True, "startJupyter": True, "allowedCudaVersions": [], **copy.deepcopy(body)}
            self.templates[t["id"]] = t
            return 201, self._answer(t, "Template")
        if tid not in self.templates:
            raise Problem(404, "template not found")
        if method == "GET":
            return 200, self._answer(self.templates[tid], "Template")
        if method == "PATCH":
            self._check_request(body, "UpdateTemplateRequest")
            if "name" in body:
                self._unique_name(body["name"], tid)
            update = copy.deepcopy(body)
            if update.get("mounts") == {}:
                update.pop("mounts")            # "{} leaves the existing mount unchanged"
            self.templates[tid].update(update)
            return 200, self._answer(self.templates[tid], "Template")
        if method == "DELETE":
            del self.templates[tid]
            return 204, None
        raise Problem(405, "method not allowed")

    def _unique_name(self, name: str, tid: str | None) -> None:
        if any(t["name"] == name and k != tid for k, t in self.templates.items()):
            raise Problem(400, f"a template named {name!r} already exists (the stand-in keeps names unique)")

    def _catalog(self, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        include = query.get("include", [""])[0]
        product = query.get("product", [""])[0]
        if bool(include) != bool(product):
            raise Problem(400, "product is required with include=AVAILABILITY, and valid only with it")
        count = int(query.get("count", ["1"])[0])
        cloud = query.get("cloud", ["SECURE"])[0].lower()
        out = []
        for g in self.catalog:
            entry = copy.deepcopy(g)
            if not include:
                for k in ("availability", "dataCenters", "cudaVersions"):
                    entry.pop(k, None)
            elif count > entry["maxCount"][cloud] or not entry[cloud]:
                entry["availability"] = "NONE"
                entry.pop("dataCenters", None)
                for v in entry.get("cudaVersions", []):
                    v["available"] = False
            out.append(entry)
        return out

    # -- pods ----------------------------------------------------------------------------------
    def _pods(self, method: str, pid: str | None, action: bool, body: Any) -> tuple[int, Any]:
        if pid is None and method == "GET":
            return 200, self._answer({"pods": [self._public(p) for p in self.pods.values()]}, "ListPodsResponse")
        if pid is None and method == "POST":
            return 201, self._answer(self._public(self._create_pod(body)), "Pod")
        if pid not in self.pods:
            raise Problem(404, "pod not found")
        if action and method == "POST":
            self._check_request(body, "PodActionRequest")
            if body["action"] == "terminate":
                self._terminate(pid)
                return 204, None
            if body["action"] == "stop":
                self.stopped.append(pid)
                self._set_status(pid, "EXITED")
                self.containers[pid].stop()
            return 200, self._answer(self._public(self.pods[pid]), "Pod")
        if method == "GET":
            return 200, self._answer(self._public(self.pods[pid]), "Pod")
        if method == "DELETE":
            self._terminate(pid)
            return 204, None
        raise Problem(405, "method not allowed")

    def _public(self, pod: dict[str, Any]) -> dict[str, Any]:
        return {k: copy.deepcopy(v) for k, v in pod.items() if not k.startswith("_")}

    def _create_pod(self, body: Any) -> dict[str, Any]:
        self._check_request(body, "CreatePodRequest")
        if ("gpu" in body) == ("cpu" in body):
            raise Problem(400, "exactly one of gpu or cpu must be set")
        gpu = body.get("gpu") or {}
        if gpu.get("allowedCudaVersions") and "minCudaVersion" in gpu:
            raise Problem(400, "allowedCudaVersions and minCudaVersion are mutually exclusive")
        mounts = body.get("mounts")
        if mounts and mounts.get("persistent") and mounts.get("network"):
            raise Problem(400, "at most one of mounts.persistent and mounts.network")
        tpl: dict[str, Any] = {}
        if "templateId" in body:
            if body["templateId"] not in self.templates:
                raise Problem(404, "template not found")
            tpl = self.templates[body["templateId"]]
            if tpl.get("serverless"):
                raise Problem(422, "a serverless template cannot deploy a pod")
        # Without a template, unset settings take the stand-in's defaults (RunPod's are not published).
        defaults = {"args": "", "disk": 50, "ports": [], "registry": None}
        settings = {k: copy.deepcopy(body.get(k, tpl.get(k, defaults.get(k))))
                    for k in ("image", "args", "disk", "ports", "registry")}
        settings["env"] = {**tpl.get("env", {}), **body.get("env", {})}
        if mounts is None:
            mounts = {} if "cpu" in body else copy.deepcopy(tpl.get("mounts") or {})
        if "cpu" in body and mounts.get("persistent"):
            raise Problem(400, "mounts.persistent is invalid on a CPU pod")
        cuda_exact = tpl.get("allowedCudaVersions") or []
        cuda_min = None
        if "allowedCudaVersions" in gpu or "minCudaVersion" in gpu:     # replaces the template's entirely
            cuda_exact, cuda_min = gpu.get("allowedCudaVersions") or [], gpu.get("minCudaVersion")
        cloud = body.get("cloud", "SECURE")
        dc, host_cuda, cost = self._place(body, gpu, cloud, cuda_exact, cuda_min, mounts)
        pid = next(self._ids)
        key = "rpk_pod_" + _secrets.token_hex(12)
        pod: dict[str, Any] = {
            "id": pid, "name": body["name"], "status": "PROVISIONING", "actions": ["stop", "terminate"],
            **settings, "mounts": mounts, "cloud": cloud, "dataCenterId": dc, "cudaVersion": host_cuda,
            "ssh": {"proxy": None, "direct": None}, "template": None, "cost": cost, "locked": False,
            "runtime": None, "createdAt": _now(), "startedAt": None, "globalNetworking": {"enabled": False},
            "_key": key,
        }
        if gpu:
            pod["gpu"] = {"id": gpu["id"], "count": gpu.get("count", 1)}
        else:
            pod["cpu"] = {**body["cpu"], "memory": 2 * body["cpu"]["vcpuCount"]}
        self.pods[pid] = pod
        self.pod_keys[key] = pid
        self.history[pid] = ["PROVISIONING"]
        self.system_log[pid] = []
        self._system(pid, "pod created")
        threading.Thread(target=self._boot, args=(pid,), daemon=True).start()
        return pod

    def _place(self, body: dict[str, Any], gpu: dict[str, Any], cloud: str, exact: list[str], floor: str | None,
               mounts: dict[str, Any]) -> tuple[str, str | None, float]:
        """A data center, host CUDA version and hourly cost, or 400 as RunPod answers for no capacity."""
        volume = self._network_volume(mounts)
        wanted = body.get("dataCenterIds") or ([volume["dataCenter"]] if volume else [])
        if not gpu:
            dc = wanted[0] if wanted else "EU-RO-1"
            if volume and volume["dataCenter"] != dc:
                raise Problem(400, f"network volume {volume['id']} is in {volume['dataCenter']}, the pod in {dc}")
            return dc, None, 0.0
        entry = next((g for g in self.catalog if g["id"] == gpu["id"]), None)
        count = gpu.get("count", 1)
        if entry is None or not entry[cloud.lower()] or count > entry["maxCount"][cloud.lower()]:
            raise Problem(400, f"no capacity for {count}x {gpu['id']} in {cloud} cloud")
        hosts = [v["version"] for v in entry.get("cudaVersions", []) if v["available"]]
        if exact:
            hosts = [v for v in hosts if v in exact]
        if floor:
            hosts = [v for v in hosts if _version_key(v) >= _version_key(floor)]
        if not hosts:
            raise Problem(400, f"no {gpu['id']} host with a matching CUDA version has capacity")
        centres = [d["id"] for d in entry.get("dataCenters", []) if d["availability"] != "NONE"]
        if wanted:
            centres = [c for c in centres if c in wanted]
        if not centres:
            raise Problem(400, f"no capacity for {gpu['id']} in {', '.join(wanted)}")
        if volume and volume["dataCenter"] != centres[0]:
            raise Problem(400, f"network volume {volume['id']} is in {volume['dataCenter']}, the pod in {centres[0]}")
        return centres[0], max(hosts, key=_version_key), round(entry["price"][cloud.lower()] * count, 4)

    def _network_volume(self, mounts: dict[str, Any]) -> dict[str, Any] | None:
        """The network volume `mounts` names (a pod's or a cluster's), or 400 for one that does not exist."""
        volume = None
        for m in mounts.get("network") or []:
            volume = self.volumes.get(m["volumeId"])
            if volume is None:
                raise Problem(400, f"network volume {m['volumeId']!r} does not exist")
        return volume

    def _system(self, pid: str, line: str) -> None:
        self.system_log.setdefault(pid, []).append((_now(), line))

    def _set_status(self, pid: str, status: str) -> None:
        with self.lock:
            pod = self.pods.get(pid)
            if pod is None or pod["status"] == status:
                return
            pod["status"] = status
            pod["actions"] = {"RUNNING": ["stop", "restart", "terminate"], "EXITED": ["start", "terminate"],
                              "ERROR": ["start", "terminate"]}.get(status, ["stop", "terminate"])
            self.history[pid].append(status)
            self._system(pid, f"status {status}")

    def _boot(self, pid: str) -> None:
        """PROVISIONING -> STARTING (the container starts) -> RUNNING (it listens)."""
        with self.lock:
            pod = self._public(self.pods[pid])
            env = self._container_env(self.pods[pid])
        container = self.runner.start(pod, env)
        with self.lock:
            if pid not in self.pods:          # terminated while provisioning
                container.stop()
                return
            self.containers[pid] = container
        self._set_status(pid, "STARTING")
        while not self.closing.is_set():
            if container.exited():
                self._set_status(pid, "EXITED")
                return
            if container.listening():
                break
            self.closing.wait(0.05)           # polling interval of a condition wait
        with self.lock:
            pod = self.pods.get(pid)
            if pod is None:
                return
            pod["startedAt"] = _now()
            pod["runtime"] = {"uptime": 0, "ports": container.runtime_ports(pod.get("ports") or [])}
        self._set_status(pid, "RUNNING")

    def _container_env(self, pod: dict[str, Any]) -> dict[str, str]:
        """The env RunPod gives a container: secret references resolved, RunPod's own variables set."""
        env = {}
        for k, v in (pod.get("env") or {}).items():
            m = re.fullmatch(r"\{\{ RUNPOD_SECRET_(\w+) \}\}", v)
            env[k] = self.secrets.get(m.group(1), v) if m else v
        env.update(RUNPOD_POD_ID=pod["id"], RUNPOD_API_KEY=pod["_key"], RUNPOD_DC_ID=str(pod["dataCenterId"]),
                   RUNPOD_GPU_COUNT=str((pod.get("gpu") or {}).get("count", 0)), RUNPOD_PUBLIC_IP="127.0.0.1")
        return env

    def _terminate(self, pid: str) -> None:
        with self.lock:
            pod = self.pods.pop(pid)
            container = self.containers.pop(pid, None)
            self.pod_keys.pop(pod["_key"], None)
        if container:
            container.stop()
        pod["status"] = "TERMINATED"
        self.history[pid].append("TERMINATED")
        self._system(pid, "pod terminated")
        self.terminated[pid] = pod

    # -- network volumes -----------------------------------------------------------------------
    def _volumes(self, method: str, vid: str | None, body: Any) -> tuple[int, Any]:
        if vid is None and method == "GET":
            return 200, self._answer({"networkVolumes": list(self.volumes.values())}, "ListNetworkVolumesResponse")
        if vid is None and method == "POST":
            self._check_request(body, "CreateNetworkVolumeRequest")
            v = {"id": next(self._ids), "type": "STANDARD", **copy.deepcopy(body)}
            self.volumes[v["id"]] = v
            return 201, self._answer(v, "NetworkVolume")
        if vid not in self.volumes:
            raise Problem(404, "network volume not found")
        if method == "GET":
            return 200, self._answer(self.volumes[vid], "NetworkVolume")
        if method == "DELETE":
            del self.volumes[vid]
            return 204, None
        raise Problem(405, "method not allowed")

    # -- logs (Server-Sent Events) ------------------------------------------------------------
    def log_source(self, path: str) -> Callable[[], tuple[list[tuple[str, str, str]], bool]] | None:
        """For a log route, what its stream reads: () -> ((ts, source, line) so far, whether the
        pod is gone); None for any other route. An unknown pod is a 404."""
        m = re.fullmatch(r"/v2/pods/([^/]+)/logs", path)
        if not m:
            return None
        pid = m.group(1)
        if pid not in self.pods:
            raise Problem(404, "pod not found")
        return lambda: (self.log_lines(pid), pid not in self.pods)

    def log_lines(self, pid: str) -> list[tuple[str, str, str]]:
        """(ts, source, line) for the pod, system lines first, then the container's output."""
        out = [(ts, "system", line) for ts, line in self.system_log.get(pid, [])]
        container = self.containers.get(pid)
        if container is not None:
            out += [(ts, "container", line) for ts, line in container.lines()]
        return out

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _go(self) -> None:
                split = urlsplit(self.path)
                path, query = split.path, parse_qs(split.query)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body: Any = None
                entry: dict[str, Any] = {"method": self.command, "path": path, "query": split.query, "auth": "none"}
                with standin.lock:
                    standin.requests.append(entry)
                    token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                    if token == standin.api_key:
                        entry["auth"] = "account"
                    elif token in standin.pod_keys:
                        entry["auth"] = f"pod:{standin.pod_keys[token]}"
                    else:
                        return self._problem(Problem(401, "missing or invalid bearer token"))
                    if raw:
                        try:
                            body = json.loads(raw)
                        except ValueError:
                            return self._problem(Problem(400, "the body is not JSON"))
                        entry["body"] = body
                    injected = standin.fail_on.pop((self.command, path), None)
                    if injected is None and standin.fail_next:
                        injected, standin.fail_next = standin.fail_next, None
                    if injected:
                        status, text = injected
                        return self._problem(Problem(status, text.replace("$AUTH", self.headers["Authorization"])))
                    try:
                        source = standin.log_source(path) if self.command == "GET" else None
                        if source is None:
                            status, out = standin.handle(self.command, path, query, body, entry["auth"])
                            entry["status"] = status
                            return self._send(status, out)
                    except Problem as p:
                        return self._problem(p)
                self._stream_logs(source, query)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _go

            def _problem(self, p: Problem) -> None:
                out = {"title": REASONS.get(p.status, "Error"), "status": p.status, "detail": p.detail}
                if p.errors:
                    out["errors"] = p.errors
                standin._answer(out, "ErrorResponse")
                self._send(p.status, out, "application/problem+json")

            def _send(self, status: int, out: Any, ctype: str = "application/json") -> None:
                data = b"" if out is None else json.dumps(out).encode()
                self.send_response(status)
                if data:
                    self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream_logs(self, source_of: Callable[[], tuple[list[tuple[str, str, str]], bool]],
                             query: dict[str, list[str]]) -> None:
                tail = int(query.get("tail", ["100"])[0])
                source = query.get("source", [None])[0]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "keep-alive")
                self.send_header("X-Accel-Buffering", "no")
                self.end_headers()
                self.close_connection = True
                sent = 0
                first = True
                try:
                    while not standin.closing.is_set():
                        with standin.lock:
                            lines, gone = source_of()
                            lines = [x for x in lines if source in (None, x[1])]
                        if first:
                            sent = max(0, len(lines) - tail)
                            first = False
                        for n, (ts, src, line) in enumerate(lines[sent:], start=sent):
                            event = json.dumps({"ts": ts, "source": src, "line": line})
                            self.wfile.write(f"id: {ts}/{n:012d}\ndata: {event}\n\n".encode())
                        self.wfile.flush()
                        sent = len(lines)
                        if gone:
                            return
                        standin.closing.wait(0.1)      # follow: polling interval for new lines
                except OSError:
                    return                             # the client went away

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
