"""A cluster's nodes on one state_dir (one network volume mounted on every node, issue 40: "the model
is downloaded once per node (or once per shared volume when mounted)"): each node keeps its own
state in a directory of its own, named by its pod id, and shares the Hub cache and the compile
caches (supervisor/run/runtime.py own_state_dir, supervisor/runpod_env.py "The volume")."""

from __future__ import annotations

from pathlib import Path

from kiln_dev.loopback_cluster import node_deploy, node_env
from supervisor.config import parse_config
from supervisor.engines import vllm
from supervisor.model.fetch.layout import cache_dir
from supervisor.run import loop
from supervisor.run.launch import engine_environment


def node(tmp: Path, rank: int, **env: str) -> loop.Supervisor:
    """Node `rank` of a 2-node loopback cluster whose state_dir is tmp/state (the shared volume)."""
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    text = node_deploy(tmp, model=model, binary=Path("/usr/bin/true"), snapshot=tmp / "help.txt", port=8000,
                       sport=8081, boot_s=60)
    cfg = parse_config(text, env={})
    return loop.Supervisor(cfg, loop.Options(env={**node_env(rank, nodes=2, master_port=29501, primary_status=8081),
                                                  **env}, status=False))


def test_a_cluster_node_keeps_its_own_state_in_a_directory_named_by_its_pod_id(tmp_path):
    shared = tmp_path / "state"
    sup = node(tmp_path, 1, RUNPOD_POD_ID="pod-b7x")
    own = shared / "workers/pod-b7x"
    assert sup.state_dir == own and sup.rt.state_dir == own
    assert sup.rt.run_dir == own / "run"                         # engine.log, the children journal, the key file
    assert sup.memory.path == own / "ladder-memory.json"
    assert sup.reloads.book.root == own / "reload"
    assert sup.rt.shared == shared                               # the generated API key: one for every node


def test_two_nodes_on_one_host_get_two_directories():
    # The loopback cluster's nodes share a host (one hostname): each is given a pod id of its own.
    ids = {node_env(r, nodes=2, master_port=1, primary_status=2)["RUNPOD_POD_ID"] for r in (0, 1)}
    assert len(ids) == 2


def test_a_cluster_node_shares_the_hub_cache_and_the_compile_caches_but_not_the_driver_jit_cache(tmp_path):
    shared = tmp_path / "state"
    sup = node(tmp_path, 0, RUNPOD_POD_ID="pod-a1")
    cfg = sup.boot_cfg
    assert cache_dir(cfg) == shared / "hf"                       # fetched once, under the volume's lock
    env = engine_environment(vllm, cfg, cfg.ladder.rungs[0], {}, None, own_dir=sup.rt.state_dir)
    assert env["VLLM_CACHE_ROOT"] == str(shared / "cache/vllm")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(shared / "cache/torchinductor")
    assert env["CUDA_CACHE_PATH"] == str(shared / "workers/pod-a1/cache/cuda-jit")


def test_a_pod_outside_a_cluster_keeps_its_state_in_state_dir_itself(tmp_path):
    sup = node(tmp_path, 0, NUM_NODES="1", RUNPOD_POD_ID="pod-solo")
    assert sup.state_dir == tmp_path / "state"
