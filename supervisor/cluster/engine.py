"""What a rank adds to its engine: vLLM's multi-node flags and the interface variables.

Flags (read in vLLM 0.33.0's `serve --help=all`, images/engine-flags/vllm-0.33.0.txt,
and the same in the CPU build 0.32.0 the tests run): `--nnodes`, `--node-rank`, `--master-addr`,
`--master-port`, `--headless`. Rank 0 runs the API server; every other rank runs `--headless` (its
engine joins the group and serves no HTTP)."""

from __future__ import annotations

from ..cluster_env import Node

__all__ = ["argv", "env_defaults"]


def argv(node: Node) -> list[str]:
    out = ["--nnodes", str(node.nodes), "--node-rank", str(node.rank), "--master-addr", node.primary_addr,
           "--master-port", str(node.primary_port)]
    return out if node.primary else out + ["--headless"]


def env_defaults(node: Node) -> dict[str, str]:
    """Defaults under the pod's own environment (which wins): NCCL and Gloo on the cluster interface
    (RunPod: NCCL_SOCKET_IFNAME=ens1 is required; Gloo falls back to loopback unless told), and vLLM
    told this node's address instead of guessing it."""
    env = {"NCCL_SOCKET_IFNAME": node.ifname, "GLOO_SOCKET_IFNAME": node.ifname}
    if node.node_addr:
        env["VLLM_HOST_IP"] = node.node_addr
    return env
