"""N Kiln supervisors as the N nodes of one RunPod Instant Cluster on one host: each node gets the
variables RunPod documents for a cluster (PRIMARY_/MASTER_ADDR and PORT, NODE_ADDR, NODE_RANK,
NUM_NODES, NUM_TRAINERS, WORLD_SIZE, HOST_NODE_ADDR; instant-clusters/configuration.mdx @0f215947)
with every address 127.0.0.1 and RUNPOD_POD_ID (RunPod gives each pod its own; a node's own state
directory is named by it: supervisor/runpod_env.py), plus what one host needs to hold several nodes:
the interface `lo` (KILN_CLUSTER_IFNAME), the group's port and secret (KILN_CLUSTER_PORT, KILN_CLUSTER_SECRET), an
engine port of its own (KILN_SERVER_PORT) and `CUDA_VISIBLE_DEVICES` — one GPU per node by default,
so the same group runs on a multi-GPU machine (issue 41) as on this CPU one. Used by the cluster tests and
bench/cluster.py; a GPU run drives it the same way with its own deploy config."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .supervised import Supervised, free_port, http, wait_for

__all__ = ["LoopbackCluster", "node_env"]


# The seal key every node of a loopback group shares (supervisor/cluster/protocol.py Seal): test data,
# as `cluster up` makes one per cluster. A stranger's beat is sealed with another one, or none.
GROUP_SECRET = "loopback-group-secret-7f3c9a1e"


def node_env(rank: int, *, nodes: int, master_port: int, group_port: int, gpus_per_node: int = 1,
             pod_id: str | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """What RunPod sets on node `rank` (its pod id: `pod_id`, else loopback-node<rank>), plus Kiln's
    knobs for nodes that share one host: the group's port (rank 0 listens there) and its secret."""
    first = rank * gpus_per_node
    return {"PRIMARY_ADDR": "127.0.0.1", "MASTER_ADDR": "127.0.0.1", "PRIMARY_PORT": str(master_port),
            "MASTER_PORT": str(master_port), "NODE_ADDR": "127.0.0.1", "NODE_RANK": str(rank),
            "NUM_NODES": str(nodes), "NUM_TRAINERS": str(gpus_per_node), "WORLD_SIZE": str(nodes * gpus_per_node),
            "HOST_NODE_ADDR": f"127.0.0.1:{master_port}", "RUNPOD_POD_ID": pod_id or f"loopback-node{rank}",
            "CUDA_VISIBLE_DEVICES": ",".join(str(first + i) for i in range(gpus_per_node)),
            "KILN_CLUSTER_IFNAME": "lo", "KILN_CLUSTER_PORT": str(group_port), "KILN_CLUSTER_SECRET": GROUP_SECRET,
            **(extra or {})}


def node_deploy(tmp: Path, *, model: Path, binary: Path, snapshot: Path, port: int, sport: int, boot_s: float,
                stall_s: float = 300, restart: str = "max_restarts = 8\n",
                selftest: str = "[selftest]\nenabled = false\n", tp: int = 2, family: str = "generic") -> str:
    """The one deploy config every node of a loopback vLLM group runs (tests and bench/cluster.py):
    -tp `tp` (one rank a node) of a small model on CPU, the ports moved per node by the env. The selftest
    is off by default: the tiny random llama's answers are noise and its fatal code probe fails on it."""
    return f"""
engine = "vllm"
state_dir = "{tmp / 'state'}"
[model]
source = "{model}"
entry = "config.json"
family = "{family}"
[server]
host = "127.0.0.1"
port = {port}
binary = "{binary}"
flag_snapshot = "{snapshot}"
[[ladder.rungs]]
name = "tp{tp}"
args = ["-tp", "{tp}", "--max-model-len", "512", "--enforce-eager"]
[ladder.rungs.env]
VLLM_CPU_KVCACHE_SPACE = "1"
NCCL_P2P_DISABLE = "1"
[health]
stall_s = {stall_s:g}
max_s = {boot_s:g}
stop_grace_s = 10
[restart]
backoff_initial_s = 1
{restart}{selftest}
[status]
host = "127.0.0.1"
port = {sport}
"""


class LoopbackCluster:
    """`config(node_dir, engine_port, status_port)` is the deploy config's text for one node (every
    node runs the same config; the ports differ only because the nodes share a host). `env` is
    added to every node's environment (the API key, KILN_CLUSTER_LOST_S, ...)."""

    def __init__(self, tmp: Path, config: Callable[[Path, int, int], str], *, nodes: int = 2,
                 gpus_per_node: int = 1, env: dict[str, str] | None = None, key: str | None = None):
        self.tmp, self.config, self.count, self.gpus = tmp, config, nodes, gpus_per_node
        self.env, self.key = dict(env or {}), key
        self.port, self.master, self.group_port = free_port(), free_port(), free_port()
        self.sports = [free_port() for _ in range(nodes)]
        self.nodes: list[Supervised] = []

    def start(self, rank: int) -> Supervised:
        d = self.tmp / f"node{rank}"
        d.mkdir(exist_ok=True)
        port = self.port if rank == 0 else free_port()
        env = node_env(rank, nodes=self.count, master_port=self.master, group_port=self.group_port,
                       gpus_per_node=self.gpus, extra={**self.env, "KILN_SERVER_PORT": str(port)})
        sup = Supervised(d, self.config(d, port, self.sports[rank]), env=env, status_port=self.sports[rank])
        self.nodes.append(sup)
        return sup

    def start_all(self) -> list[Supervised]:
        return [self.start(r) for r in range(len(self.nodes), self.count)]

    def ready(self) -> bool:
        """Rank 0's /ready: the group's (supervisor/cluster/group.py ready_gate)."""
        return http(self.nodes[0].url("/ready"), timeout=3)[0] == 200

    def chat(self, model: str, *, max_tokens: int = 4, timeout: float = 120) -> int:
        """One chat request through rank 0's API: its HTTP status (0: no answer)."""
        body = json.dumps({"model": model, "max_tokens": max_tokens,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {self.key}"} if self.key else {})}
        return http(f"http://127.0.0.1:{self.port}/v1/chat/completions", data=body, timeout=timeout,
                    headers=headers)[0]

    def status(self, rank: int = 0) -> dict[str, Any]:
        return self.nodes[rank].status() or {}

    def epoch(self) -> int:
        """Rank 0's engine launch count: the group's epoch."""
        return (self.status(0).get("cluster") or {}).get("epoch", 0)

    def wait(self, cond: Callable[[], Any], timeout: float, what: str) -> Any:
        """wait_for, with every node's log as it is when it gives up."""
        try:
            return wait_for(cond, timeout, what, interval=0.2)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.tails()}") from None

    def tails(self, chars: int = 2500) -> str:
        return "\n".join(f"--- node {i}:\n{n.log()[-chars:]}" for i, n in enumerate(self.nodes))

    def close(self) -> None:
        for n in self.nodes:
            n.__exit__()
