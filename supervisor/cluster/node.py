"""A node's own fitness for a cluster, checked before anything is fetched: each check answers the
problem and its fix, or None. I/O only to read the host (statvfs, /sys/class/net)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..cluster_env import Node

__all__ = ["engine_problem", "interface_problem", "problems", "rung_problems", "shm_problem"]

GIB = 1024 ** 3
SPANS_NODES = ("vllm",)        # engines with a multi-node executor Kiln drives
# What Kiln sets per node (engine.py): a rung that sets one would give every node the same rank.
OWNED = ("--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port", "--headless")


def shm_problem(min_gib: float, path: str = "/dev/shm") -> str | None:
    try:
        st = os.statvfs(path)
    except OSError as e:
        return f"{path} cannot be read ({e.strerror or e}): NCCL and vLLM's shared-memory broadcast need it; " \
               "run the pod with shared memory mounted there"
    size = st.f_blocks * st.f_frsize
    if size >= min_gib * GIB:
        return None
    return (f"{path} is {size / GIB:.2f} GiB, below the {min_gib:g} GiB a cluster node needs (NCCL and vLLM's "
            "shared-memory broadcast live there; RunPod asks for 8-16 GB): give the pod more shared memory, "
            "or lower KILN_CLUSTER_MIN_SHM_GIB if you know the model needs less")


def interface_problem(ifname: str, sys_net: str = "/sys/class/net") -> str | None:
    have = sorted(p.name for p in Path(sys_net).iterdir()) if Path(sys_net).is_dir() else []
    if ifname == "eth0":
        return ("the cluster interface is eth0, which RunPod reserves for internet traffic (\"will result in "
                "connection timeouts\" between nodes): set KILN_CLUSTER_IFNAME (or NCCL_SOCKET_IFNAME) to ens1")
    if ifname in have:
        return None
    return (f"network interface {ifname!r} (KILN_CLUSTER_IFNAME, else NCCL_SOCKET_IFNAME, else ens1) is not on "
            f"this node (it has: {', '.join(have) or 'none'}); NCCL and Gloo would fall back to another one: set "
            "KILN_CLUSTER_IFNAME to the cluster network's (ens1 on RunPod, lo when the nodes share one host)")


def engine_problem(engine: str) -> str | None:
    if engine in SPANS_NODES:
        return None
    return (f"engine {engine!r} cannot span nodes (NUM_NODES > 1): a cluster runs vLLM's multi-node executor; "
            "use a cluster target (engine = \"vllm\"), or run this image as a single pod")


def rung_problems(rungs: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    out = []
    for name, args in rungs:
        hit = sorted({a.split("=", 1)[0] for a in args if a.split("=", 1)[0] in OWNED})
        if hit:
            out.append(f"rung {name} sets {', '.join(hit)}: on a cluster Kiln sets them per node from RunPod's "
                       "NODE_RANK, NUM_NODES and PRIMARY_ADDR/PORT; remove them from the rung")
    return out


def problems(node: Node, engine: str, rungs: Sequence[tuple[str, Sequence[str]]],
             shm_path: str = "/dev/shm", sys_net: str = "/sys/class/net") -> list[str]:
    """Everything that stops this node from joining, each with its fix."""
    found = [engine_problem(engine), shm_problem(node.min_shm_gib, shm_path), interface_problem(node.ifname, sys_net)]
    return [p for p in found if p] + rung_problems(rungs)
