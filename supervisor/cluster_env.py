"""What RunPod's Instant Clusters tell each node, as Kiln reads it: this node's rank in the group, the
primary's address, and Kiln's own knobs for the group (the interface, the deadlines, /dev/shm).

A base module (stdlib and errors.Problem only): the shell reads it at start (run/cluster.py); the
group (supervisor/cluster/) and the engine's argv take the `Node` it answers with.

Facts (runpod/docs instant-clusters/configuration.mdx, read at 0f215947): every node gets
`PRIMARY_ADDR`/`MASTER_ADDR` (the primary's address, on ens1), `PRIMARY_PORT`/`MASTER_PORT` ("all
ports are available"), `NODE_ADDR` (this node's static IP on the cluster network), `NODE_RANK`
(0 = the primary), `NUM_NODES`, `NUM_TRAINERS` (GPUs per node), `WORLD_SIZE` (NUM_NODES *
NUM_TRAINERS). Inter-node traffic must use ens1..ens8: "Do not use eth0 ... will result in connection
timeouts"; `NCCL_SOCKET_IFNAME=ens1` is "required". Users report Gloo (vLLM's CPU-side group) falling
back to loopback unless GLOO_SOCKET_IFNAME is set as well, so Kiln sets both.

A node is in a cluster when NUM_NODES is set and more than 1. Kiln's own variables (all optional):

    KILN_CLUSTER_IFNAME       the interface NCCL and Gloo use (default: NCCL_SOCKET_IFNAME, else ens1;
                              `lo` when the "nodes" are processes on one host, as the tests run them)
    KILN_CLUSTER_SECRET       required: the key the group's beats are sealed with (cluster/protocol.py);
                              `build.py cluster up` makes one per cluster and gives it to every node
    KILN_CLUSTER_PORT         the group's port on the cluster network, where rank 0 takes the other
                              ranks' beats (cluster/listen.py; default 8091); never exposed by a template
    KILN_CLUSTER_ARRIVE_S     how long the group waits for a rank that never arrived (default 600)
    KILN_CLUSTER_LOST_S       silence after which a rank counts as dead or hung (default 5)
    KILN_CLUSTER_MIN_SHM_GIB  the /dev/shm a node must have (default 8: RunPod asks for 8-16 GB)
    KILN_CLUSTER_PROBE_S      how often the primary sends one real 1-token request through its API
                              while it serves (default 15)
    KILN_CLUSTER_PROBE_TIMEOUT_S  how long that request may take before the group counts as hung
                              (default 60: under load a request waits its turn)
    KILN_CLUSTER_NAME         the cluster's name, which `build.py cluster plan/up` puts into every
                              node's env (RunPod names no variable for a node's cluster): a FAILED
                              cluster looks for itself among the clusters of that name
                              (fleet/cluster_terminate.py)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .errors import Problem

__all__ = ["CLUSTER_NAME_ENV", "DEFAULT_IFNAME", "RUNPOD_VARS", "Node", "active", "read"]

RUNPOD_VARS = ("PRIMARY_ADDR", "MASTER_ADDR", "PRIMARY_PORT", "MASTER_PORT", "NODE_ADDR", "NODE_RANK",
               "NUM_NODES", "NUM_TRAINERS", "WORLD_SIZE")
CLUSTER_NAME_ENV = "KILN_CLUSTER_NAME"
DEFAULT_IFNAME = "ens1"          # configuration.mdx: PRIMARY_ADDR is on ens1; eth0 times out
DEFAULT_ARRIVE_S = 600.0
DEFAULT_LOST_S = 5.0
DEFAULT_MIN_SHM_GIB = 8.0
DEFAULT_PROBE_S = 15.0
DEFAULT_PROBE_TIMEOUT_S = 60.0
DEFAULT_GROUP_PORT = 8091        # no template exposes it: the beats stay on the cluster network
SECRET_ENV = "KILN_CLUSTER_SECRET"


@dataclass(frozen=True)
class Node:
    """This node's place in the group, and the group's deadlines."""
    rank: int
    nodes: int
    primary_addr: str
    primary_port: int              # vLLM's --master-port (torch's rendezvous on the primary)
    node_addr: str
    gpus_per_node: int | None
    ifname: str
    group_port: int = DEFAULT_GROUP_PORT    # rank 0's group port on the cluster network (KILN_CLUSTER_PORT)
    arrive_s: float = DEFAULT_ARRIVE_S
    lost_s: float = DEFAULT_LOST_S
    min_shm_gib: float = DEFAULT_MIN_SHM_GIB
    probe_s: float = DEFAULT_PROBE_S
    probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S
    secret: str = ""               # the beats' seal key (KILN_CLUSTER_SECRET): never logged or shown

    def __repr__(self) -> str:     # never print the secret, even by accident
        return f"Node({self.describe()}, group port {self.group_port})"

    @property
    def primary(self) -> bool:
        return self.rank == 0

    def describe(self) -> str:
        return f"rank {self.rank} of {self.nodes} (primary {self.primary_addr}:{self.primary_port})"


def active(env: Mapping[str, str]) -> bool:
    """Whether this node is one of a cluster's: NUM_NODES set and above 1."""
    raw = (env.get("NUM_NODES") or "").strip()
    return raw.isdigit() and int(raw) > 1


def _int(env: Mapping[str, str], name: str, problems: list[Problem], *, low: int, high: int | None = None,
         required: bool = True) -> int | None:
    raw = (env.get(name) or "").strip()
    if not raw:
        if required:
            problems.append(Problem(f"{name} (env)", "is not set; RunPod sets it on every node of a cluster",
                                    allowed="run this image as an Instant Cluster, or set it yourself"))
        return None
    if not raw.isdigit() or int(raw) < low or (high is not None and int(raw) > high):
        problems.append(Problem(f"{name} (env)", "must be a whole number", raw,
                                f"{low} .. {high}" if high is not None else f">= {low}"))
        return None
    return int(raw)


def _float(env: Mapping[str, str], name: str, default: float, problems: list[Problem]) -> float:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        problems.append(Problem(f"{name} (env)", "must be a positive number", raw, f"e.g. {default:g}"))
        return default
    return value


def _either(env: Mapping[str, str], a: str, b: str, problems: list[Problem]) -> str | None:
    """PRIMARY_x and its legacy twin MASTER_x: the same value, or one of them."""
    va, vb = (env.get(a) or "").strip(), (env.get(b) or "").strip()
    if va and vb and va != vb:
        problems.append(Problem(f"{a} (env)", f"differs from {b} ({vb!r}); RunPod sets both to the same value",
                                va, f"unset {b}, or set both to the primary's"))
    return va or vb or None


def read(env: Mapping[str, str], problems: list[Problem]) -> Node | None:
    """This node's `Node`, or None when it is not in a cluster. Every problem is appended (field,
    value, fix); a node with problems answers None as well."""
    if not active(env):
        raw = (env.get("NUM_NODES") or "").strip()
        if raw and not raw.isdigit():
            problems.append(Problem("NUM_NODES (env)", "must be a whole number", raw, ">= 2 for a cluster"))
        return None
    bad = len(problems)
    nodes = _int(env, "NUM_NODES", problems, low=2)
    rank = _int(env, "NODE_RANK", problems, low=0, high=(nodes - 1) if nodes else None)
    gpus = _int(env, "NUM_TRAINERS", problems, low=1, required=False)
    world = _int(env, "WORLD_SIZE", problems, low=1, required=False)
    if nodes and gpus and world and world != nodes * gpus:
        problems.append(Problem("WORLD_SIZE (env)", f"is not NUM_NODES * NUM_TRAINERS ({nodes} * {gpus})", world,
                                str(nodes * gpus)))
    addr = _either(env, "PRIMARY_ADDR", "MASTER_ADDR", problems)
    if addr is None:
        problems.append(Problem("PRIMARY_ADDR (env)", "is not set (nor MASTER_ADDR): the other nodes cannot find "
                                "the primary", allowed="run this image as an Instant Cluster, or set it"))
    port_raw = _either(env, "PRIMARY_PORT", "MASTER_PORT", problems)
    port = None
    if port_raw is None:
        problems.append(Problem("PRIMARY_PORT (env)", "is not set (nor MASTER_PORT)",
                                allowed="run this image as an Instant Cluster, or set it (vLLM's default is 29501)"))
    else:
        port = _int({"PRIMARY_PORT": port_raw}, "PRIMARY_PORT", problems, low=1, high=65535)
    node_addr = (env.get("NODE_ADDR") or "").strip()
    if not node_addr:
        problems.append(Problem("NODE_ADDR (env)", "is not set: vLLM would guess this node's address, possibly "
                                "eth0's, which RunPod says times out", allowed="this node's address on ens1"))
    group_port = _int(env, "KILN_CLUSTER_PORT", problems, low=1, high=65535, required=False)
    secret = (env.get(SECRET_ENV) or "").strip()
    if len(secret) < 16:
        problems.append(Problem(f"{SECRET_ENV} (env)", "is not set (or shorter than 16 characters): the group's "
                                "beats are sealed with it, so no one outside the cluster can fail or fake a rank",
                                "not shown", "`python build.py cluster up` makes one per cluster; on your own, "
                                "the same random value of 16+ characters on every node"))
    ifname = (env.get("KILN_CLUSTER_IFNAME") or env.get("NCCL_SOCKET_IFNAME") or DEFAULT_IFNAME).strip()
    arrive = _float(env, "KILN_CLUSTER_ARRIVE_S", DEFAULT_ARRIVE_S, problems)
    lost = _float(env, "KILN_CLUSTER_LOST_S", DEFAULT_LOST_S, problems)
    shm = _float(env, "KILN_CLUSTER_MIN_SHM_GIB", DEFAULT_MIN_SHM_GIB, problems)
    probe = _float(env, "KILN_CLUSTER_PROBE_S", DEFAULT_PROBE_S, problems)
    probe_timeout = _float(env, "KILN_CLUSTER_PROBE_TIMEOUT_S", DEFAULT_PROBE_TIMEOUT_S, problems)
    if len(problems) > bad:
        return None
    assert nodes is not None and rank is not None and addr is not None and port is not None
    return Node(rank=rank, nodes=nodes, primary_addr=addr, primary_port=port, node_addr=node_addr,
                gpus_per_node=gpus, ifname=ifname, group_port=group_port or DEFAULT_GROUP_PORT, arrive_s=arrive,
                lost_s=lost, min_shm_gib=shm, probe_s=probe, probe_timeout_s=probe_timeout, secret=secret)
