"""A stand-in for RunPod Serverless load-balancing endpoints, on loopback, for tests. It is not
RunPod. It stands for two real APIs:

- RunPod's REST API v2 Serverless routes (https://api.runpod.io/v2/serverless...: list, create,
  get, PATCH, delete, /workers, /workers/{workerId}/logs, /releases), beside the v2 routes of the
  pods stand-in it extends (api.py: templates, catalog, pods, network volumes). Every request body
  is checked against RunPod's published schema (images/schemas/runpod-rest-v2.json, with the
  jsonschema library, not Kiln's code): 422 with each violation; the handler rules the document
  states are 400 (exactly one of gpu/cpu, a non-empty allowedCudaVersions beside minCudaVersion,
  an excludedTypes entry outside the pools, an unknown pool or network volume, a changed compute
  family); errors are RFC 9457 problem objects. Every response is checked against the document's
  response schema (a mismatch lands in `faults`).
- The load balancer of each endpoint (balancer.py): https://<id>.api.runpod.ai/<path> is
  http://127.0.0.1:<port>/<id>/<path> here (the endpoint's requestUrls.base says which).

Workers are real Kiln supervisors (workers.py) with PORT, PORT_HEALTH and HEALTH_CHECK_PATH from
the endpoint's env; without a WorkerRunner none ever starts (no capacity anywhere: a request
waits, then gets the load balancer's 400). Every `tick_s` the scaler reads each worker's health
path: 200 healthy (IDLE, or RUNNING with a request in flight), 204 initializing, anything else
UNHEALTHY (no answer counts as starting until the path first answered); a worker whose process
ended leaves the list (its log stays readable). It starts workers while ceil(in-flight requests /
requestCount) -- requests waiting for a worker count, as in RunPod's formula -- is above the
workers of the latest release, up to workers.max (old-release workers still draining their
requests hold no slot: the stand-in's choice); it keeps workers.min; a healthy worker idle for workers.idleTimeout
beyond the minimum is stopped. Each configuration change is a release (version + 1, a diff of
field/old/new); a change to what a container runs (image, args, env, ports, disk, registry,
gpu/cpu, networkVolumes, dataCenterIds) makes the running workers stale: an idle one is stopped
at once, a busy one after its requests (RunPod's rolling-releases page); other changes move the
workers to the new version in place (the stand-in's choice: RunPod does not say).

Where RunPod publishes nothing the stand-in chooses and says so: endpoint names unique, worker
ids `w<hex>`, prices the document's example figures, worker ids as RUNPOD_POD_ID.
"""

from __future__ import annotations

import copy
import math
import re
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from typing import Any, Callable

from .api import Problem, RunPodStandIn, gpu_type
from .balancer import Balancer
from .workers import Worker, WorkerRunner

CONTAINER_FIELDS = ("image", "args", "env", "ports", "disk", "registry", "gpu", "cpu", "networkVolumes",
                    "dataCenterIds")
DIFF_NAMES = {"image": "template.imageName", "env": "template.env", "args": "template.dockerArgs",
              "ports": "template.ports", "disk": "template.containerDiskInGb"}


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def serverless_gpu(gpu_id: str, pool: str, *, serverless: float = 1.1, **kw: Any) -> dict[str, Any]:
    """A catalog GpuType in a serverless pool. The default price is the document's own example
    figure for price.serverless (1.1), test data, not a claim about any GPU."""
    g = gpu_type(gpu_id, **kw)
    g["pool"] = pool
    g["price"]["serverless"] = serverless
    return g


class ServerlessStandIn(RunPodStandIn):
    """RunPod's REST API v2 with its Serverless routes, and the load balancer. A context manager."""

    def __init__(self, api_key: str, *, workers: WorkerRunner | None = None,
                 catalog: list[dict[str, Any]] | None = None, secrets: dict[str, str] | None = None,
                 no_worker_limit_s: float = 120.0, tick_s: float = 0.2, worker_stop_grace_s: float = 20.0):
        default = [serverless_gpu("NVIDIA A40", "AMPERE_48")]
        super().__init__(api_key, catalog=catalog if catalog is not None else default, secrets=secrets)
        self.worker_runner = workers
        self.endpoints: dict[str, dict[str, Any]] = {}
        self.releases: dict[str, list[dict[str, Any]]] = {}           # endpoint id -> releases, newest first
        self.workers: dict[str, dict[str, Worker]] = {}               # endpoint id -> live workers
        self.gone: dict[str, Worker] = {}                             # workers that ended (logs kept)
        self.waiting: dict[str, int] = {}                             # endpoint id -> requests with no worker yet
        self.started_workers: list[Worker] = []
        self.tick_s = tick_s
        self.worker_stop_grace_s = worker_stop_grace_s
        self.changed = threading.Condition(self.lock)
        self.balancer = Balancer(self, no_worker_limit_s=no_worker_limit_s)
        self.scaler = threading.Thread(target=self._scale_loop, name="standin-scaler", daemon=True)

    def __enter__(self) -> "ServerlessStandIn":
        super().__enter__()
        self.balancer.start()
        self.scaler.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.closing.set()
        self.scaler.join(10)
        with self.lock:
            live = [w for ws in self.workers.values() for w in ws.values()]
        stops = [threading.Thread(target=w.container.stop, args=(self.worker_stop_grace_s,)) for w in live]
        for t in stops:
            t.start()
        for t in stops:
            t.join()
        self.balancer.stop()
        super().__exit__(*exc)

    def log_text(self) -> str:
        import json

        return super().log_text() + json.dumps({"endpoints": self.endpoints, "releases": self.releases,
                                                "routed": self.balancer.routed}, default=str)

    # -- routes --------------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any, auth: str) -> tuple[int, Any]:
        m = re.fullmatch(r"/v2/serverless(?:/([^/]+))?(?:/(workers|releases))?", path)
        if not m:
            return super().handle(method, path, query, body, auth)
        if auth != "account":
            raise Problem(403, "access denied")
        eid, sub = m.group(1), m.group(2)
        if eid is None:
            if method == "GET":
                return 200, self._answer({"endpoints": [self._public(e) for e in self.endpoints.values()]},
                                         "ListEndpointsResponse")
            if method == "POST":
                return 201, self._answer(self._public(self._create(body)), "Endpoint")
            raise Problem(405, "method not allowed")
        if eid not in self.endpoints:
            raise Problem(404, "endpoint not found")
        if sub == "workers" and method == "GET":
            return 200, self._answer(self._worker_list(eid), "ListEndpointWorkersResponse")
        if sub == "releases" and method == "GET":
            return 200, self._answer(self._release_list(eid), "ListEndpointReleasesResponse")
        if sub is None and method == "GET":
            return 200, self._answer(self._public(self.endpoints[eid]), "Endpoint")
        if sub is None and method == "PATCH":
            return 200, self._answer(self._public(self._update(eid, body)), "Endpoint")
        if sub is None and method == "DELETE":
            self._delete(eid)
            return 204, None
        raise Problem(405, "method not allowed")

    def log_source(self, path: str) -> Callable[[], tuple[list[tuple[str, str, str]], bool]] | None:
        m = re.fullmatch(r"/v2/serverless/([^/]+)/workers/([^/]+)/logs", path)
        if not m:
            return super().log_source(path)
        eid, wid = m.groups()
        if eid not in self.endpoints:
            raise Problem(404, "endpoint not found")
        worker = self.workers.get(eid, {}).get(wid) or self.gone.get(wid)
        if worker is None or worker.endpoint_id != eid:
            raise Problem(404, "worker not found")
        return lambda: (self._worker_log(worker), wid not in self.workers.get(eid, {}))

    # -- endpoints -------------------------------------------------------------------------------
    def _rules(self, e: dict[str, Any]) -> None:
        """The handler's 400s the document states, on the endpoint as it would be."""
        if ("gpu" in e and e["gpu"]) == ("cpu" in e and e["cpu"]):
            raise Problem(400, "exactly one of gpu or cpu must be set")
        gpu = e.get("gpu") or {}
        if gpu.get("allowedCudaVersions") and gpu.get("minCudaVersion"):
            raise Problem(400, "allowedCudaVersions and minCudaVersion are mutually exclusive")
        pools = {g.get("pool") for g in self.catalog if g.get("pool")}
        unknown = [p for p in gpu.get("pools") or [] if p not in pools]
        if unknown:
            raise Problem(400, f"unknown GPU pool(s): {', '.join(unknown)}")
        members = {g["id"] for g in self.catalog if g.get("pool") in (gpu.get("pools") or [])}
        outside = [t for t in gpu.get("excludedTypes") or [] if t.strip() not in members]
        if outside:
            raise Problem(400, f"excludedTypes not in the selected pools: {', '.join(outside)}")
        for vid in e.get("networkVolumes") or []:
            if vid not in self.volumes:
                raise Problem(400, f"network volume {vid!r} does not exist")

    def _create(self, body: Any) -> dict[str, Any]:
        self._check_request(body, "CreateEndpointRequest")
        if any(e["name"] == body["name"] for e in self.endpoints.values()):
            raise Problem(400, f"an endpoint named {body['name']!r} already exists (the stand-in keeps names unique)")
        eid = next(self._ids)
        e: dict[str, Any] = {"id": eid, "args": "", "disk": 20, "ports": [], "env": {}, "registry": None,
                             "dataCenterIds": [], "networkVolumes": [], "timeout": 300000, "flashboot": "OFF",
                             **copy.deepcopy(body), "createdAt": _now()}
        e["workers"] = {"min": 0, "max": 3, "idleTimeout": 10, **(body.get("workers") or {})}
        if "gpu" in e:
            e["gpu"] = {"count": 1, "allowedCudaVersions": [], "minCudaVersion": None, **e["gpu"]}
        self._rules(e)
        e["requestUrls"] = self._urls(e)
        with self.lock:
            self.endpoints[eid] = e
            self.releases[eid] = [self._release(1, [{"field": "endpoint", "old": None, "new": e["name"]}])]
            e["_version"] = 1
            self.workers[eid] = {}
            self.waiting[eid] = 0
        return e

    def _urls(self, e: dict[str, Any]) -> dict[str, str]:
        base = f"{self.balancer.base}/{e['id']}"
        if e.get("type") == "QUEUE":
            api = f"{self.balancer.base}/v2/{e['id']}"
            return {k: f"{api}/{p}" for k, p in (("run", "run"), ("runSync", "runsync"), ("status", "status/{job_id}"),
                                                  ("stream", "stream/{job_id}"), ("cancel", "cancel/{job_id}"),
                                                  ("retry", "retry/{job_id}"), ("purgeQueue", "purge-queue"),
                                                  ("health", "health"))}
        return {"base": base, "health": base + (e.get("env") or {}).get("HEALTH_CHECK_PATH", "/ping")}

    def _release(self, version: int, diff: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": f"rel_{next(self._ids)}", "version": version, "source": "MANUAL", "buildId": None,
                "createdByUserId": "user_standin", "workerCount": 0, "createdAt": _now(), "diff": diff}

    def _update(self, eid: str, body: Any) -> dict[str, Any]:
        self._check_request(body, "UpdateEndpointRequest")
        with self.lock:
            e = self.endpoints[eid]
            new = copy.deepcopy(e)
            for key, value in body.items():
                if key == "gpu":
                    if not e.get("gpu"):
                        raise Problem(400, "the endpoint's compute family (CPU) cannot change")
                    gpu = dict(new["gpu"])
                    if "pools" in value:
                        gpu.pop("excludedTypes", None)          # pools without excludedTypes clears them
                    gpu.update(copy.deepcopy(value))
                    if gpu.get("minCudaVersion") == "":
                        gpu["minCudaVersion"] = None
                    new["gpu"] = gpu
                elif key == "cpu" and e.get("gpu"):
                    raise Problem(400, "the endpoint's compute family (GPU) cannot change")
                elif key == "workers":
                    new["workers"] = {**new["workers"], **value}
                elif key == "name" and any(o["name"] == value and k != eid for k, o in self.endpoints.items()):
                    raise Problem(400, f"an endpoint named {value!r} already exists")
                else:
                    new[key] = copy.deepcopy(value)
            self._rules(new)
            diff = [{"field": DIFF_NAMES.get(k, k), "old": e.get(k), "new": new.get(k)}
                    for k in body if e.get(k) != new.get(k)]
            if not diff:
                return e
            version = e["_version"] + 1
            new["_version"] = version
            new["requestUrls"] = self._urls(new)
            self.endpoints[eid] = new
            self.releases[eid].insert(0, self._release(version, diff))
            rolls = any(e.get(k) != new.get(k) for k in CONTAINER_FIELDS)
            for w in self.workers[eid].values():
                if rolls:
                    w.stale = True
                else:
                    w.version = version
            self.changed.notify_all()
            return new

    def _delete(self, eid: str) -> None:
        with self.lock:
            self.endpoints.pop(eid)
            workers = list(self.workers.pop(eid, {}).values())
            self.changed.notify_all()
        for w in workers:
            threading.Thread(target=self._end, args=(w, "endpoint deleted"), daemon=True).start()

    # -- workers and releases as the API lists them ----------------------------------------------
    def _worker_public(self, w: Worker, e: dict[str, Any]) -> dict[str, Any]:
        gpu = e.get("gpu") or {}
        types = [g["id"] for g in self.catalog if g.get("pool") in (gpu.get("pools") or [])]
        up = int(time.monotonic() - w.t0)
        return {"id": w.id, "status": w.status, "isStale": w.stale, "version": w.version,
                "gpuCount": gpu.get("count", 0) if gpu else 0, "image": w.image, "uptimeSeconds": up,
                "gpuTypeId": types[0] if types else None, "dataCenterId": "EU-RO-1", "startedAt": w.started_at}

    def _worker_list(self, eid: str) -> dict[str, Any]:
        with self.lock:
            e = self.endpoints[eid]
            workers = [self._worker_public(w, e) for w in self.workers[eid].values()]
        summary = {k: sum(1 for w in workers if w["status"] == k.upper())
                   for k in ("running", "idle", "initializing", "throttled", "unhealthy")}
        summary["total"] = len(workers)
        return {"workers": workers, "summary": summary, "endpointVersion": e["_version"]}

    def _release_list(self, eid: str) -> dict[str, Any]:
        with self.lock:
            e = self.endpoints[eid]
            workers = list(self.workers[eid].values())
            releases = copy.deepcopy(self.releases[eid])
        for r in releases:
            r["workerCount"] = sum(1 for w in workers if w.version == r["version"] and not w.stale)
        on_latest = sum(1 for w in workers if not w.stale)
        total = len(workers)
        rollout = {"inProgress": on_latest < total, "workersOnLatest": on_latest, "workersTotal": total,
                   "percentOnLatest": (100 * on_latest // total) if total else 0}
        return {"endpointVersion": e["_version"], "rollout": rollout, "releases": releases}

    def _worker_log(self, w: Worker) -> list[tuple[str, str, str]]:
        out = [(ts, "system", line) for ts, line in w.system]
        return out + [(ts, "container", line) for ts, line in w.container.lines()]

    # -- the load balancer's side ---------------------------------------------------------------------
    def claim_worker(self, eid: str, limit_s: float) -> Worker | None:
        """A healthy worker for a request (the least busy, the latest release first), waiting up to
        `limit_s`; the request counts as in flight meanwhile (the scaler starts workers for it)."""
        deadline = time.monotonic() + limit_s
        with self.lock:
            self.waiting[eid] = self.waiting.get(eid, 0) + 1
            self.changed.notify_all()
            try:
                while True:
                    if eid not in self.endpoints:
                        return None
                    healthy = [w for w in self.workers[eid].values()
                               if w.status in ("IDLE", "RUNNING") and not w.stopping]
                    if healthy:
                        w = min(healthy, key=lambda x: (x.stale, x.inflight, x.served))
                        w.inflight += 1
                        w.served += 1
                        w.status = "RUNNING"
                        w.idle_since = None
                        return w
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    self.changed.wait(min(left, 0.5))
            finally:
                self.waiting[eid] -= 1

    def release_worker(self, w: Worker) -> None:
        with self.lock:
            w.inflight -= 1
            if w.inflight == 0 and w.status == "RUNNING":
                w.status = "IDLE"
                w.idle_since = time.monotonic()
            self.changed.notify_all()

    # -- the scaler ---------------------------------------------------------------------------------
    def _scale_loop(self) -> None:
        while not self.closing.is_set():
            for eid in list(self.endpoints):
                try:
                    self._tick(eid)
                except KeyError:
                    continue                  # deleted meanwhile
            self.closing.wait(self.tick_s)    # the scaler's period

    def _health(self, w: Worker) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{w.health_port}{w.health_path}", timeout=0.5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return 0

    def _tick(self, eid: str) -> None:
        with self.lock:
            workers = list(self.workers[eid].values())
        codes = {w.id: self._health(w) for w in workers if not w.stopping}
        ended: list[Worker] = []
        to_stop: list[tuple[Worker, str]] = []
        with self.lock:
            e = self.endpoints[eid]
            for w in workers:
                if w.container.exited():
                    ended.append(w)
                    continue
                if w.stopping or w.id not in codes:
                    continue
                code = codes[w.id]
                before = w.status
                if code:
                    w.ever_answered = True
                if code == 200:
                    if w.status not in ("IDLE", "RUNNING"):
                        w.status = "RUNNING" if w.inflight else "IDLE"
                        w.idle_since = None if w.inflight else time.monotonic()
                elif code == 204 or (code == 0 and not w.ever_answered):
                    w.status = "INITIALIZING"
                else:
                    w.status = "UNHEALTHY"
                if w.status != before:
                    w.system.append((_now(), f"worker {w.id}: {before} -> {w.status} (health {code or 'no answer'})"))
                    self.changed.notify_all()
                if w.stale and w.inflight == 0:
                    to_stop.append((w, "replaced by the latest release"))
            for w in ended:
                self.workers[eid].pop(w.id, None)
                w.system.append((_now(), f"worker {w.id}: exited ({w.container.proc.returncode})"))
                self.gone[w.id] = w
                self.changed.notify_all()
            leaving = {w.id for w, _ in to_stop}
            live = [w for w in self.workers[eid].values() if not w.stopping and w.id not in leaving]
            latest = [w for w in live if not w.stale]
            demand = self.waiting.get(eid, 0) + sum(w.inflight for w in live)
            want = math.ceil(demand / max(1, e["scaling"].get("requestCount", 1)))
            want = max(e["workers"]["min"], min(want, e["workers"]["max"]))
            # Old-release workers draining their requests do not hold a slot of the new release
            # (else a busy one at max would block its own replacement): the stand-in's choice.
            n_start = max(0, want - len(latest))
            idle_s = e["workers"].get("idleTimeout", 10)
            spare = len(latest) - max(e["workers"]["min"], want)
            for w in sorted(latest, key=lambda x: x.idle_since or 0):
                if spare <= 0:
                    break
                if w.status == "IDLE" and w.inflight == 0 and w.idle_since is not None \
                        and time.monotonic() - w.idle_since >= idle_s:
                    to_stop.append((w, f"idle for {idle_s} s"))
                    spare -= 1
            for w, _ in to_stop:
                w.stopping = True
        for w, why in to_stop:
            threading.Thread(target=self._end, args=(w, why), daemon=True).start()
        for _ in range(n_start):
            self._start_worker(eid)

    def _start_worker(self, eid: str) -> None:
        if self.worker_runner is None:        # no capacity: requests wait, then the load balancer's 400
            return
        with self.lock:
            e = self._public(self.endpoints[eid])
            version = self.endpoints[eid]["_version"]
        wid = f"w{next(self._ids)}"
        env = dict(self.worker_runner.resolve(e.get("env") or {}, self.secrets))
        env.update(RUNPOD_ENDPOINT_ID=eid, RUNPOD_POD_ID=wid)
        container, api_port, health_port = self.worker_runner.start(e, wid, env)
        w = Worker(id=wid, endpoint_id=eid, version=version, image=str(e.get("image")), container=container,
                   api_port=api_port, health_port=health_port,
                   health_path=(e.get("env") or {}).get("HEALTH_CHECK_PATH", "/ping"), started_at=_now(),
                   t0=time.monotonic())
        w.system.append((_now(), f"worker {wid}: created for release v{version} ({e.get('image')})"))
        with self.lock:
            if eid not in self.endpoints:
                container.stop(self.worker_stop_grace_s)
                return
            self.workers[eid][wid] = w
            self.started_workers.append(w)
            self.changed.notify_all()

    def _end(self, w: Worker, why: str) -> None:
        w.system.append((_now(), f"worker {w.id}: stopping ({why})"))
        w.container.stop(self.worker_stop_grace_s)
        with self.lock:
            ws = self.workers.get(w.endpoint_id, {})
            if ws.get(w.id) is w:
                ws.pop(w.id)
            w.system.append((_now(), f"worker {w.id}: stopped"))
            self.gone[w.id] = w
            self.changed.notify_all()
