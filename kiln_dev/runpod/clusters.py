"""RunPod Instant Clusters on loopback: the REST API v2 /clusters routes beside the pods stand-in.

# stand-in: RunPod's Instant Clusters API (https://api.runpod.io/v2/clusters, createCluster, listClusters,
# getCluster, deleteCluster, listClusterPods) and the environment RunPod gives each cluster node

Faithful where RunPod publishes (the vendored OpenAPI excerpt, runpod/docs @a900806e): the create
body against CreateClusterRequest (422 with each violation, read with the jsonschema library, not
Kiln's code), every answer against Cluster / ListClustersResponse / ListPodsResponse (a mismatch
lands in `faults`), 201 on create, 204 on delete (every member pod terminated with it), 404 for an
unknown id, a network mount's volume checked as for a pod (it must exist, and the cluster is placed
in its data center: NetworkMount), member pods with `cluster` {id, rank, ip} left out of GET /v2/pods
(the document: "excluded from GET /v2/pods by default"). Each member is a pod of the pods stand-in, so RunPod's
proxy and the log stream reach it; its container (SupervisorRunner: a real supervisor) gets the
variables RunPod's instant-clusters/configuration.mdx names (kiln_dev/loopback_cluster.node_env):
PRIMARY_/MASTER_ADDR and PORT, NODE_ADDR, NODE_RANK, NUM_NODES, NUM_TRAINERS, WORLD_SIZE, and what
several nodes on one host need (the interface `lo`, the primary's mapped status port). Nodes boot
in rank order, so rank 0's status port is known before rank 1 starts.

The stand-in's choices where RunPod publishes nothing: the catalog's cluster capacity is the pods
catalog's (a GPU type whose secure maxCount holds gpuCountPerPod), every node in the first data
center with capacity, cluster ids `cluster_<hex>`, a member pod's DELETE via /v2/pods is 400
(the document: member pods "cannot be modified or deleted via the pod endpoints"; no status given),
and a pod-scoped key (the RUNPOD_API_KEY a pod is given) reaches no /v2/clusters route (403): the
pods stand-in's scope for such a key (its own pod only); RunPod documents none.
"""

from __future__ import annotations

import copy
import secrets as _secrets
import threading
from typing import Any

from ..loopback_cluster import node_env
from ..supervised import free_port
from .api import Problem, RunPodStandIn, _now



class ClusterStandIn(RunPodStandIn):
    """The pods stand-in plus /v2/clusters. `node_extra` is added to every node's env (the tests'
    knobs, e.g. KILN_CLUSTER_MIN_SHM_GIB: a test host's /dev/shm is small)."""

    def __init__(self, api_key: str, *, node_extra: dict[str, str] | None = None, **kw: Any):
        super().__init__(api_key, **kw)
        self.clusters: dict[str, dict[str, Any]] = {}
        self.node_extra = dict(node_extra or {})
        self.deleted_clusters: list[str] = []

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any, auth: str) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if parts[:2] == ["v2", "clusters"] and len(parts) <= 4:
            if auth.startswith("pod:"):
                raise Problem(403, "access denied")
            return self._clusters(method, parts[2:], body)
        if parts[:2] == ["v2", "pods"] and len(parts) == 2 and method == "GET":
            listed = [self._public(p) for p in self.pods.values() if "cluster" not in p]
            return 200, self._answer({"pods": listed}, "ListPodsResponse")
        if parts[:2] == ["v2", "pods"] and len(parts) >= 3 and "cluster" in self.pods.get(parts[2], {}) \
                and method != "GET":
            raise Problem(400, "a cluster's member pod is managed through /v2/clusters/{id}")
        return super().handle(method, path, query, body, auth)

    def _clusters(self, method: str, rest: list[str], body: Any) -> tuple[int, Any]:
        if not rest and method == "GET":
            return 200, self._answer({"clusters": [self._summary(c) for c in self.clusters.values()]},
                                     "ListClustersResponse")
        if not rest and method == "POST":
            return 201, self._answer(self._summary(self._create(body)), "Cluster")
        cid = rest[0]
        if cid not in self.clusters:
            raise Problem(404, "cluster not found")
        if len(rest) == 2 and rest[1] == "pods" and method == "GET":
            members = [self._public(self.pods[p]) for p in self.clusters[cid]["_pods"] if p in self.pods]
            return 200, self._answer({"pods": members}, "ListPodsResponse")
        if len(rest) == 1 and method == "GET":
            return 200, self._answer(self._summary(self.clusters[cid]), "Cluster")
        if len(rest) == 1 and method == "DELETE":
            cluster = self.clusters.pop(cid)
            for pid in cluster["_pods"]:
                if pid in self.pods:
                    self._terminate(pid)
            self.deleted_clusters.append(cid)
            return 204, None
        raise Problem(405, "method not allowed")

    def _summary(self, cluster: dict[str, Any]) -> dict[str, Any]:
        members = [self.pods[p] for p in cluster["_pods"] if p in self.pods]
        by: dict[str, int] = {}
        for p in members:
            by[p["status"]] = by.get(p["status"], 0) + 1
        out = {k: copy.deepcopy(v) for k, v in cluster.items() if not k.startswith("_")}
        out["pods"] = {"total": len(members), "byStatus": by}
        head = next((p for p in members if p["cluster"]["rank"] == 0), None)
        if head is not None:
            out["primary"] = {"podId": head["id"], "status": head["status"]}
        return out

    def _create(self, body: Any) -> dict[str, Any]:
        self._check_request(body, "CreateClusterRequest")
        compute = body["compute"]
        mounts = body.get("mounts") or {}
        if mounts.get("persistent") and mounts.get("network"):
            raise Problem(400, "at most one of mounts.persistent and mounts.network")
        entry = next((g for g in self.catalog if g["id"] == compute["gpuTypeId"]), None)
        if entry is None or compute["gpuCountPerPod"] > entry["maxCount"]["secure"]:
            raise Problem(400, f"no cluster capacity for {compute['podCount']} x {compute['gpuCountPerPod']} "
                          f"{compute['gpuTypeId']}")
        volume = self._network_volume(mounts)
        centres = [d["id"] for d in entry.get("dataCenters", []) if d["availability"] != "NONE"]
        wanted = body.get("dataCenterIds") or ([volume["dataCenter"]] if volume else centres)
        placed = [c for c in centres if c in wanted]
        if not placed:
            raise Problem(400, f"no capacity for {compute['gpuTypeId']} in {', '.join(wanted)}")
        if volume and volume["dataCenter"] != placed[0]:
            raise Problem(400, f"network volume {volume['id']} is in {volume['dataCenter']}, the cluster in "
                          f"{placed[0]}")
        cid = "cluster_" + next(self._ids)
        master = free_port()
        cluster = {"id": cid, "name": body["name"], "type": body["type"], "compute": copy.deepcopy(compute),
                   "dataCenterId": placed[0], "network": {"cidr": "10.65.0.0/16"}, "createdAt": _now(),
                   "_pods": [], "_master": master, "_group_port": free_port()}
        price = round(entry["price"]["secure"] * compute["gpuCountPerPod"], 4)
        with self.lock:
            for rank in range(compute["podCount"]):
                pid = next(self._ids)
                key = "rpk_pod_" + _secrets.token_hex(12)
                self.pods[pid] = {
                    "id": pid, "name": f"{body['name']}-node-{rank}", "status": "PROVISIONING",
                    "actions": ["stop", "terminate"], "image": body.get("image"), "args": body.get("args", ""),
                    "disk": body.get("disk", 50), "ports": list(body.get("ports") or []),
                    "env": dict(body.get("env") or {}), "registry": None, "mounts": copy.deepcopy(mounts),
                    "cloud": "SECURE", "dataCenterId": placed[0], "cudaVersion": None,
                    "ssh": {"proxy": None, "direct": None}, "template": None, "cost": price, "locked": False,
                    "runtime": None, "createdAt": _now(), "startedAt": None,
                    "globalNetworking": {"enabled": False},
                    "gpu": {"id": compute["gpuTypeId"], "count": compute["gpuCountPerPod"]},
                    "cluster": {"id": cid, "rank": rank, "ip": f"10.65.0.{rank + 2}"}, "_key": key,
                }
                self.pod_keys[key] = pid
                self.history[pid] = ["PROVISIONING"]
                self._system(pid, "pod created (cluster member)")
                cluster["_pods"].append(pid)
            self.clusters[cid] = cluster
        threading.Thread(target=self._boot_group, args=(cid,), daemon=True).start()
        return cluster

    def _container_env(self, pod: dict[str, Any]) -> dict[str, str]:
        env = super()._container_env(pod)
        member = pod.get("cluster")
        if member is None:
            return env
        cluster = self.clusters[member["id"]]
        compute = cluster["compute"]
        # The cluster network: every node of one cluster reaches rank 0's group port (its own, on loopback).
        # KILN_CLUSTER_SECRET comes with the cluster's env, as `cluster up` put it there (none: none here).
        env.update(node_env(member["rank"], nodes=compute["podCount"], master_port=cluster["_master"],
                            group_port=cluster["_group_port"], gpus_per_node=compute["gpuCountPerPod"],
                            pod_id=pod["id"], extra=self.node_extra))
        secret = (pod.get("env") or {}).get("KILN_CLUSTER_SECRET")
        if secret is not None:
            env["KILN_CLUSTER_SECRET"] = secret
        else:
            env.pop("KILN_CLUSTER_SECRET")
        return env

    def _boot_group(self, cid: str) -> None:
        """Rank order: rank 0's container (and its mapped status port) exists before rank 1 starts."""
        for pid in list(self.clusters.get(cid, {}).get("_pods", [])):
            t = threading.Thread(target=self._boot, args=(pid,), daemon=True)
            t.start()
            while pid not in self.containers and t.is_alive() and not self.closing.is_set():
                self.closing.wait(0.05)           # polling interval of a condition wait
