"""The flags Kiln itself puts on an engine's command line, read from the supervisor's real argv builders.

A deploy config's lint sees the user's flags only (`[server] extra_args` and each rung's `args`). The
supervisor adds its own to every launch (llama.cpp `--api-key-file`, `--metrics`, the [sampler] flags;
vLLM `--served-model-name`; [startup]'s levers; smg's health and start-up flags): an engine release
that removed one of those fails every rung of every config although no config names it. So `upgrade`
builds the argv each rung would get (`build_argv` of supervisor/engines/, with a key file and a vCPU
quota so that the flags those bring are there too) and checks what Kiln added against the new parser.

A config that runs as a cluster (its target's [runpod] nodes > 1, or rungs that span more GPUs than a
node has) gets more on every node: the multi-node flags supervisor/cluster/engine.py `argv` appends
(`--nnodes --node-rank --master-addr --master-port`, and `--headless` off rank 0). `node_flags` reads
them from that builder for rank 0 and a headless rank, so they are linted as Kiln's own as well.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Iterator

from supervisor.cluster import engine as cluster_engine
from supervisor.cluster.node import SPANS_NODES
from supervisor.cluster_env import Node
from supervisor.config import DeployConfig, Rung

__all__ = ["NODE_BUILDER", "kiln_flags", "builder", "node_flags"]

NODE_BUILDER = "supervisor/cluster/engine.py argv"       # where a cluster node's own flags come from

# Stand-ins for what only a running supervisor knows: the argv's shape, never its values, is linted.
_MODEL = "/kiln/model/model.gguf"
_KEY_FILE = "/kiln/run/api-key"
_VCPUS = 2.0
_FLAG = re.compile(r"^--?[A-Za-z]")


def _names(tokens: list[str]) -> Iterator[tuple[int, str]]:
    for i, tok in enumerate(tokens):
        if _FLAG.match(tok):
            yield i, tok.split("=", 1)[0]


def kiln_flags(engine: ModuleType, cfg: DeployConfig, rung: Rung) -> list[str]:
    """The flags the supervisor adds to this rung's argv, each once, in argv order: the engine's own
    command line (after the launcher's `--` where there is a launcher, as for the router), less every
    flag the config itself gives."""
    argv = engine.build_argv(cfg, rung, model_path=_MODEL, api_key_file=_KEY_FILE, vcpus=_VCPUS)
    tail = argv[argv.index("--") + 1:] if "--" in argv else argv[1:]
    if "--" in argv:                                  # a launcher: what it adds to the engine's own argv
        tail += list(getattr(engine, "LAUNCHER_FLAGS", ()))
    user = {name for _, name in _names(list(cfg.server.extra_args) + list(rung.args) + list(_extra(engine, cfg)))}
    return list(dict.fromkeys(name for _, name in _names(tail) if name not in user))


def _extra(engine: ModuleType, cfg: DeployConfig) -> tuple[str, ...]:
    """The config's own flags outside the rungs: the router's [router] extra_args."""
    return tuple(cfg.router.extra_args) if engine.__name__.endswith(".router") else ()


def builder(engine: ModuleType) -> str:
    """Where the flags come from, for a person to change: `supervisor/engines/<name>.py build_argv`."""
    return f"supervisor/engines/{engine.__name__.rsplit('.', 1)[-1]}.py build_argv"


def node_flags(engine: ModuleType, cfg: DeployConfig, nodes: int) -> list[str]:
    """The flags the supervisor appends to every rung's argv on a node of a cluster of `nodes` (rank 0's,
    then a headless rank's), each once; none for one pod or an engine that cannot span nodes."""
    name = engine.__name__.rsplit(".", 1)[-1]
    if nodes < 2 or name not in SPANS_NODES:
        return []
    flags: list[str] = []
    for rank in (0, nodes - 1):
        node = Node(rank=rank, nodes=nodes, primary_addr="10.65.0.2", primary_port=29501,
                    node_addr=f"10.65.0.{2 + rank}", gpus_per_node=cfg.hardware.gpu_count, ifname="ens1")
        flags += [flag for _, flag in _names(cluster_engine.argv(node))]
    return list(dict.fromkeys(flags))
