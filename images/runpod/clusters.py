"""A target as one RunPod Instant Cluster (REST API v2 /clusters): plan, up, status, down.

    plan     the CreateClusterRequest: the target's template (image, args, env with secrets as
             RunPod secret references, ports, disk, mounts) spread into it, as the document says a
             cluster's container config "can be spread from a template response", plus name,
             type APPLICATION (a general multi-node application: vLLM's own executor, no managed
             Slurm or Ray topology), compute {gpuTypeId, gpuCountPerPod, podCount}, dataCenterIds.
             No `registry` (CreateClusterRequest has none: a cluster's image must be public) and
             no CUDA filter (the request has none either).
    up       the catalog first (GET /catalog/gpus?include=AVAILABILITY&product=CLUSTER): refuse,
             naming what is on offer, when the GPU type has no cluster capacity for that many per
             pod; then POST /clusters, then wait for rank 0's supervisor /ready through RunPod's
             proxy (rank 0 owns the group's /ready: supervisor/cluster/). One URL: rank 0's API.
    status   each node (GET /clusters/{id}/pods): rank (Pod.cluster.rank), RunPod's state, GPU use
             (Pod.runtime.gpus), and what its supervisor says.
    down     DELETE /clusters/{id}: every member pod is terminated with it.

With `--volume ID` every node mounts one existing network volume (mounts.network, in place of the
template's persistent mount: Mounts takes at most one) and the state_dir is on it, so the nodes
share one Hub cache and download the model once (supervisor/runpod_env.py "The volume": each node's
own state is workers/<pod id> there). `up` looks the volume up first and places the cluster in its
data center (NetworkMount: "an existing NetworkVolume in the same data center").

A cluster is Kiln's target's when its name is kiln-<target>-cluster (Cluster has no env to mark it);
every node gets that name as KILN_CLUSTER_NAME.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import requests

from supervisor.cluster_env import CLUSTER_NAME_ENV
from supervisor.errors import KilnError
from supervisor.runpod_env import SHARED_DIR_NAME

from .. import runpod_schema as schema
from ..deployment import carried_text
from ..fleet import probe
from ..target import Target
from .api import RunPodAPI
from .pods import TARGET_ENV, NoMatchingHost, proxy_url
from .template import RunPodTemplate
from .volumes import Volume, by_id

CLUSTER_TYPE = "APPLICATION"
MIN_NODES, MAX_NODES = 2, 250          # ClusterCompute.podCount's bounds in the document
# The container settings CreateClusterRequest takes from a template (BaseContainerConfig, Mounts).
FROM_TEMPLATE = ("image", "args", "env", "ports", "disk", "mounts")

Say = Callable[[str], None]


def cluster_name(target_name: str) -> str:
    return f"kiln-{target_name}-cluster"


@dataclass(frozen=True)
class Shape:
    gpu_id: str
    gpus_per_node: int
    nodes: int
    data_centers: tuple[str, ...] = ()

    @classmethod
    def of(cls, target: Target, *, nodes: int, gpu_id: str | None = None, gpus_per_node: int | None = None,
           data_centers: tuple[str, ...] = ()) -> "Shape":
        if not target.is_gpu:
            raise KilnError(f"--target {target.name}: a CPU target; RunPod's clusters are GPU nodes only")
        if not MIN_NODES <= nodes <= MAX_NODES:
            raise KilnError(f"--nodes {nodes}: a RunPod cluster has {MIN_NODES} to {MAX_NODES} nodes "
                            "(ClusterCompute.podCount); one node is `pods up`")
        count = target.runpod.gpu_count if gpus_per_node is None else gpus_per_node
        if count < 1:
            raise KilnError(f"--gpus-per-node {count}: at least 1")
        return cls(gpu_id or target.runpod.gpu_type, count, nodes, data_centers)


_PATH = re.compile(r"/[A-Za-z0-9._/-]*[A-Za-z0-9._-]")


@dataclass(frozen=True)
class NetworkMount:
    """One existing network volume mounted on every node at `path`, the state_dir on it."""
    volume_id: str
    path: str
    state_dir: str                 # the deploy config's, when on the volume; else <path>/kiln (KILN_STATE_DIR)

    @classmethod
    def of(cls, target: Target, volume_id: str, path: str | None = None) -> "NetworkMount":
        if not volume_id.strip() or any(c.isspace() or c == "/" for c in volume_id):
            raise KilnError(f"--volume {volume_id!r}: a network volume's id (GET /v2/network-volumes; "
                            "`pods volumes` lists Kiln's)")
        path = path or target.runpod.volume_mount
        if not _PATH.fullmatch(path) or ".." in path.split("/"):
            raise KilnError(f"--volume-path {path!r}: an absolute path other than / (e.g. /runpod-volume), "
                            "where every node mounts the volume")
        state_dir = target.deploy_config().state_dir
        if not state_dir.startswith(path.rstrip("/") + "/"):
            state_dir = f"{path.rstrip('/')}/{SHARED_DIR_NAME}"
        return cls(volume_id, path, state_dir)

    def env(self, target: Target) -> dict[str, str]:
        """KILN_STATE_DIR where the deploy config's state_dir is not on the volume."""
        return {} if self.state_dir == target.deploy_config().state_dir else {"KILN_STATE_DIR": self.state_dir}


def cluster_body(target: Target, template: RunPodTemplate, shape: Shape,
                 mount: NetworkMount | None = None, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """The CreateClusterRequest, checked against the vendored schema (nothing of a secret's value:
    the template's env holds RunPod secret references)."""
    tpl = template.body
    body: dict[str, Any] = {"name": cluster_name(target.name), "type": CLUSTER_TYPE,
                            "compute": {"gpuTypeId": shape.gpu_id, "gpuCountPerPod": shape.gpus_per_node,
                                        "podCount": shape.nodes}}
    body.update({k: tpl[k] for k in FROM_TEMPLATE if k in tpl})
    # Its own name, which RunPod gives no node: a FAILED group finds its cluster by it (fleet/cluster_terminate.py).
    env = {**tpl.get("env", {}), **(extra_env or {}), TARGET_ENV: target.name, CLUSTER_NAME_ENV: body["name"]}
    if mount is not None:       # the one mount (Mounts: at most one of persistent and network)
        body["mounts"] = {"network": [{"volumeId": mount.volume_id, "path": mount.path}]}
        env.update(mount.env(target))
    body["env"] = dict(sorted(env.items()))
    if shape.data_centers:
        body["dataCenterIds"] = list(shape.data_centers)
    body.update(startJupyter=False, startSsh=False)
    schema.check(body, "CreateClusterRequest")
    return body


def place_on_volume(api: RunPodAPI, body: dict[str, Any], shape: Shape) -> tuple[Volume, dict[str, Any], Shape]:
    """The body's network volume looked up (it must exist, in --data-center when given), and the body
    and shape placed in its data center: a cluster is within one, and mounts a volume only there."""
    vid = body["mounts"]["network"][0]["volumeId"]
    vol = by_id(api, vid, shape.data_centers)
    placed = {**body, "dataCenterIds": [vol.data_center]}
    schema.check(placed, "CreateClusterRequest")
    return vol, placed, replace(shape, data_centers=(vol.data_center,))


def check_catalog(api: RunPodAPI, shape: Shape) -> dict[str, Any]:
    """The catalog's entry for the GPU type, or NoMatchingHost naming what clusters are offered."""
    gpus = api.gpu_types(count=shape.gpus_per_node, product="CLUSTER")
    entry = next((g for g in gpus if g.get("id") == shape.gpu_id), None)
    offered = ", ".join(str(g.get("id")) for g in gpus if g.get("availability") not in (None, "NONE")) or "none"
    if entry is None or entry.get("availability") in (None, "NONE"):
        raise NoMatchingHost(f"RunPod's catalog has no cluster capacity for {shape.gpus_per_node}x {shape.gpu_id} "
                             f"per node now (GET /catalog/gpus?product=CLUSTER); offered for clusters: {offered}. "
                             "Nothing was created")
    centres = [d.get("id") for d in entry.get("dataCenters") or [] if d.get("availability") != "NONE"]
    if shape.data_centers and not set(shape.data_centers) & set(centres):
        raise NoMatchingHost(f"--data-center {', '.join(shape.data_centers)}: {shape.gpu_id} clusters have "
                             f"capacity only in {', '.join(map(str, centres)) or 'none'}. Nothing was created")
    return entry


def find(api: RunPodAPI, target_name: str) -> dict[str, Any] | None:
    named = [c for c in api.clusters() if c.get("name") == cluster_name(target_name)]
    if len(named) > 1:
        raise KilnError(f"{len(named)} clusters are named {cluster_name(target_name)!r} "
                        f"({', '.join(str(c.get('id')) for c in named)}): delete the extra ones by id")
    return named[0] if named else None


def rank_of(pod: dict[str, Any]) -> int | None:
    cluster = pod.get("cluster") if isinstance(pod.get("cluster"), dict) else {}
    rank = cluster.get("rank")
    return rank if isinstance(rank, int) else None


def primary(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((p for p in pods if rank_of(p) == 0), None)


@dataclass
class UpResult:
    cluster: dict[str, Any]
    created: bool
    ready: bool
    line: str
    primary: dict[str, Any] | None


def differences(api: RunPodAPI, found: dict[str, Any], body: dict[str, Any], shape: Shape) -> list[str]:
    """How the live cluster differs from what this `up` asks for: its shape, its nodes' image and the
    deploy config they carry (KILN_DEPLOY_CONFIG; none: the image's own)."""
    out = []
    compute = found.get("compute") or {}
    have = (compute.get("gpuTypeId"), compute.get("gpuCountPerPod"), compute.get("podCount"))
    want = (shape.gpu_id, shape.gpus_per_node, shape.nodes)
    if have != want:
        out.append(f"shape {have[2]} x {have[1]} {have[0]}, asked {want[2]} x {want[1]} {want[0]}")
    members = api.cluster_pods(str(found["id"]))
    images = sorted({str(p.get("image")) for p in members if p.get("image")})
    if images and images != [body["image"]]:
        out.append(f"image {', '.join(images)}, asked {body['image']}")
    asked = carried_text(body.get("env"))
    carried = {carried_text(p.get("env") if isinstance(p.get("env"), dict) else {}) for p in members}
    if members and carried != {asked}:
        def name(text: str | None) -> str:
            return "the image's own deploy config" if text is None else \
                f"deploy config sha256 {hashlib.sha256(text.encode()).hexdigest()[:12]}"
        out.append(f"{' / '.join(sorted(name(t) for t in carried))}, asked {name(asked)}")
    return out


def up(api: RunPodAPI, target: Target, body: dict[str, Any], shape: Shape, say: Say, *, timeout_s: float,
       poll_s: float, proxy: str | None = None, session: requests.Session | None = None,
       replace: bool = False) -> UpResult:
    """Create the cluster (or find the live one of the same name: refused when it differs from this `up`,
    unless `replace`, which deletes it first), then wait for rank 0's /ready."""
    found = find(api, target.name)
    if found is not None:
        diff = differences(api, found, body, shape)
        if diff and not replace:
            raise KilnError(f"cluster {found.get('name')} ({found.get('id')}) is live and differs from this `up`: "
                            + "; ".join(diff) + ". Nothing was created or deleted. Fix: `cluster up ... --replace` "
                            f"deletes it and creates the one asked for, or `cluster down --target {target.name}` first")
        if diff:
            say(f"cluster {found.get('name')} ({found.get('id')}) differs ({'; '.join(diff)}): --replace deletes it")
            api.delete_cluster(str(found["id"]))
            _wait_gone(api, target.name, timeout_s, poll_s)
            found = None
    created = found is None
    if found is None:
        entry = check_catalog(api, shape)
        price = (entry.get("price") or {}).get("secure")
        say(f"catalog: {shape.gpu_id} has cluster capacity for {shape.gpus_per_node} per node"
            + (f", list price ${price:.2f}/GPU/h x {shape.gpus_per_node * shape.nodes} GPUs"
               if isinstance(price, (int, float)) else ""))
        found = api.create_cluster(body)
        say(f"cluster {found.get('name')}: created ({found.get('id')}, {shape.nodes} x {shape.gpus_per_node} "
            f"{shape.gpu_id}); every node bills until `cluster down`")
    else:
        say(f"cluster {found.get('name')}: already there ({found.get('id')}); waiting for it")
    cid = str(found["id"])
    status_port = target.deploy_config().status.port
    session = session or requests.Session()
    deadline = time.monotonic() + timeout_s
    line, head = "", None
    while True:
        members = api.cluster_pods(cid)
        head = primary(members)
        now = _primary_line(head, status_port, proxy, session)
        if now[0] != line:
            line = now[0]
            say(f"rank 0: {line}")
        if now[1] is not None:
            return UpResult(found, created, now[1], line, head)
        if time.monotonic() >= deadline:
            return UpResult(found, created, False, f"not ready within {timeout_s:.0f} s (last: {line})", head)
        time.sleep(poll_s)       # the polling interval of a condition wait with a deadline


def _wait_gone(api: RunPodAPI, target_name: str, timeout_s: float, poll_s: float) -> None:
    """Until no cluster of the name is listed: a new one of the same name before would be a second."""
    deadline = time.monotonic() + timeout_s
    while find(api, target_name) is not None:
        if time.monotonic() >= deadline:
            raise KilnError(f"cluster {cluster_name(target_name)} was deleted but is still listed after "
                            f"{timeout_s:.0f} s: nothing new was created; `cluster status` shows it")
        time.sleep(poll_s)       # the polling interval of a condition wait with a deadline


def _primary_line(head: dict[str, Any] | None, status_port: int, proxy: str | None,
                  session: requests.Session) -> tuple[str, bool | None]:
    """What rank 0 is doing, and True (ready) / False (failed) / None (not yet)."""
    if head is None:
        return "not placed yet", None
    status = str(head.get("status"))
    if status in ("EXITED", "ERROR", "TERMINATED"):
        return f"the pod is {status}", False
    if status != "RUNNING":
        return status, None
    url = proxy_url(str(head["id"]), status_port, proxy)
    snap = probe.read_status(url, session, timeout=10)
    if snap is None:
        return "RUNNING, the supervisor does not answer yet", None
    line = probe.progress_line(snap)
    if snap.get("state") == "FAILED":
        return line, False
    if snap.get("ready") is True and probe.is_ready(url, session, timeout=10):
        return line, True
    return line, None


def gpu_use(pod: dict[str, Any]) -> str:
    runtime = pod.get("runtime") if isinstance(pod.get("runtime"), dict) else {}
    gpus = runtime.get("gpus") or []
    if not gpus:
        return "GPU use: not reported"
    return "GPU use: " + ", ".join(f"{g.get('util', '?')}% ({g.get('memoryUtil', '?')}% mem)" for g in gpus)


def node_lines(pods: list[dict[str, Any]], status_port: int | None, proxy: str | None,
               session: requests.Session) -> list[str]:
    """One line per node, by rank: rank, RunPod's state, GPU use, the supervisor's word."""
    out = []
    for p in sorted(pods, key=lambda p: (rank_of(p) is None, rank_of(p) or 0)):
        rank = rank_of(p)
        line = f"rank {rank if rank is not None else '?'}  {p.get('id')}  {p.get('status')}  {gpu_use(p)}"
        if status_port and p.get("status") == "RUNNING":
            snap = probe.read_status(proxy_url(str(p["id"]), status_port, proxy), session, timeout=10)
            line += "  supervisor: " + (probe.progress_line(snap) if snap else "no answer")
        out.append(line)
    return out
