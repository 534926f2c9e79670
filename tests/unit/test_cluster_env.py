"""A node's rank from RunPod's cluster variables (supervisor/cluster_env.py), its own checks
(supervisor/cluster/node.py) and the flags its engine gets (supervisor/cluster/engine.py)."""

from __future__ import annotations

import os

from supervisor import cluster_env
from supervisor.cluster import engine, node

# What RunPod sets on the second node of a 2 x 8 cluster (instant-clusters/configuration.mdx @0f215947)
RUNPOD = {"PRIMARY_ADDR": "10.65.0.2", "MASTER_ADDR": "10.65.0.2", "PRIMARY_PORT": "29501", "MASTER_PORT": "29501",
          "NODE_ADDR": "10.65.0.3", "NODE_RANK": "1", "NUM_NODES": "2", "NUM_TRAINERS": "8", "WORLD_SIZE": "16",
          "HOST_NODE_ADDR": "10.65.0.2:29501",
          "KILN_CLUSTER_SECRET": "cluster-secret-made-by-cluster-up"}     # Kiln's, beside RunPod's own variables


def read(env):
    problems = []
    return cluster_env.read(env, problems), [str(p) for p in problems]


def test_a_pod_outside_a_cluster_is_no_node():
    assert read({}) == (None, [])
    assert read({"NUM_NODES": "1"}) == (None, [])


def test_runpods_variables_make_the_node_and_the_default_interface_is_ens1():
    n, problems = read(RUNPOD)
    assert problems == []
    assert (n.rank, n.nodes, n.primary_addr, n.primary_port, n.node_addr, n.gpus_per_node) == \
        (1, 2, "10.65.0.2", 29501, "10.65.0.3", 8)
    assert n.ifname == "ens1" and not n.primary and n.group_port == 8091      # the default group port
    assert (n.lost_s, n.arrive_s, n.probe_s, n.probe_timeout_s, n.min_shm_gib) == (5.0, 600.0, 15.0, 60.0, 8.0)
    assert read({**RUNPOD, "NCCL_SOCKET_IFNAME": "ens2"})[0].ifname == "ens2"
    assert read({**RUNPOD, "NCCL_SOCKET_IFNAME": "ens2", "KILN_CLUSTER_IFNAME": "lo"})[0].ifname == "lo"
    only_legacy = {k: v for k, v in RUNPOD.items() if not k.startswith("PRIMARY_")}
    assert read(only_legacy)[0].primary_addr == "10.65.0.2"


def test_every_bad_variable_is_named_with_its_value_and_fix():
    env = {**RUNPOD, "NODE_RANK": "2", "MASTER_ADDR": "10.65.0.9", "WORLD_SIZE": "8", "PRIMARY_PORT": "70000",
           "MASTER_PORT": "70000", "KILN_CLUSTER_LOST_S": "-1", "KILN_CLUSTER_PROBE_TIMEOUT_S": "soon"}
    n, problems = read(env)
    assert n is None
    text = "\n".join(problems)
    assert "NODE_RANK (env)" in text and "'2'" in text and "0 .. 1" in text
    assert "PRIMARY_ADDR (env): differs from MASTER_ADDR" in text
    assert "WORLD_SIZE (env): is not NUM_NODES * NUM_TRAINERS (2 * 8)" in text and "allowed: 16" in text
    assert "PRIMARY_PORT (env)" in text and "'70000'" in text
    assert "KILN_CLUSTER_LOST_S (env)" in text and "KILN_CLUSTER_PROBE_TIMEOUT_S (env)" in text and "'soon'" in text
    missing = read({"NUM_NODES": "2"})[1]
    assert any(p.startswith("NODE_RANK (env): is not set") for p in missing)
    assert any(p.startswith("PRIMARY_ADDR (env): is not set") for p in missing)
    assert any(p.startswith("NODE_ADDR (env): is not set") for p in missing)


def test_rank_0_runs_the_api_server_and_the_others_run_headless():
    primary = read({**RUNPOD, "NODE_RANK": "0", "NODE_ADDR": "10.65.0.2"})[0]
    other = read(RUNPOD)[0]
    assert engine.argv(primary) == ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.65.0.2",
                                    "--master-port", "29501"]
    assert engine.argv(other)[-1] == "--headless" and engine.argv(other)[3] == "1"
    assert engine.env_defaults(other) == {"NCCL_SOCKET_IFNAME": "ens1", "GLOO_SOCKET_IFNAME": "ens1",
                                          "VLLM_HOST_IP": "10.65.0.3"}


def test_the_node_flags_are_vllm_0_33_0s_own():
    """Every flag Kiln adds per node is in vLLM 0.33.0's committed --help=all (the image's pin)."""
    from pathlib import Path

    from supervisor.engines.flags import load_argparse_snapshot

    snap = load_argparse_snapshot(Path(__file__).resolve().parents[1] / "fixtures" / "engine-logs"
                                  / "vllm-0.33.0-serve-help-all.txt")
    for flag in engine.argv(read(RUNPOD)[0]):
        if flag.startswith("-"):
            assert snap.get(flag) is not None, flag


def test_a_node_without_shm_or_its_interface_is_refused_with_the_fix(tmp_path):
    (tmp_path / "net" / "eth0").mkdir(parents=True)
    (tmp_path / "net" / "lo").mkdir()
    n = read(RUNPOD)[0]
    found = node.problems(n, "vllm", [("tp8", ["-tp", "8"])], shm_path=str(tmp_path), sys_net=str(tmp_path / "net"))
    text = "\n".join(found)
    st = os.statvfs(tmp_path)
    if st.f_blocks * st.f_frsize < 8 * 1024 ** 3:
        assert "below the 8 GiB" in text
    assert "network interface 'ens1'" in text and "it has: eth0, lo" in text and "KILN_CLUSTER_IFNAME" in text
    assert node.interface_problem("eth0", str(tmp_path / "net")).startswith("the cluster interface is eth0")
    assert node.interface_problem("lo", str(tmp_path / "net")) is None
    assert node.shm_problem(10 ** 9, str(tmp_path)) is not None and node.shm_problem(1e-9, str(tmp_path)) is None


def test_a_rung_that_sets_the_node_flags_and_an_engine_that_cannot_span_nodes_are_refused():
    assert "rung r sets --headless, --node-rank" in node.rung_problems([("r", ["--node-rank", "1", "--headless"])])[0]
    assert node.rung_problems([("r", ["-tp", "2"])]) == []
    assert "cannot span nodes" in node.engine_problem("llamacpp")
    assert node.engine_problem("vllm") is None


def test_a_node_without_the_clusters_secret_is_refused_and_the_secret_is_never_shown():
    """Issue 50: beats are sealed with KILN_CLUSTER_SECRET; a node without it cannot join (nor fake one)."""
    env = {k: v for k, v in RUNPOD.items() if k != "KILN_CLUSTER_SECRET"}
    node, problems = read(env)
    assert node is None and any("KILN_CLUSTER_SECRET (env): is not set" in p for p in problems)
    node, _ = read({**env, "KILN_CLUSTER_SECRET": "short"})
    assert node is None
    node, problems = read(RUNPOD)
    assert node is not None and problems == [] and node.secret == RUNPOD["KILN_CLUSTER_SECRET"]
    assert RUNPOD["KILN_CLUSTER_SECRET"] not in repr(node) and node.group_port == 8091
