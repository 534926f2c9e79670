"""A cluster target kind (issue 40 item 3): [runpod] nodes > 1 makes a target one RunPod Instant
Cluster, served by vLLM with every rung spanning nodes x gpu_count GPUs; the field notes' multi-node
Kimi-K3 checkpoint is such a target, its unresolved model commit marked as such."""

from __future__ import annotations

from pathlib import Path

import pytest

from images.target import load_target, parse_target
from supervisor.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
K3 = "b200-vllm"


def test_the_kimi_k3_target_is_a_two_node_b200_cluster_tp_within_pp_across():
    t = load_target(K3)
    assert t.runpod.is_cluster and t.runpod.nodes == 2 and t.runpod.gpu_count == 8
    assert t.runpod.gpu_type == "NVIDIA B200" and t.engine == "vllm"
    cfg = t.deploy_config()
    assert cfg.model.source == "hf://nvidia/Kimi-K3-NVFP4"
    assert all(list(r.args)[:4] == ["-tp", "8", "-pp", "2"] for r in cfg.ladder.rungs)
    assert cfg.hardware.min_compute_capability == "10.0"
    text = (ROOT / "images" / "deploy" / "kimi-k3-nvfp4-b200-cluster.toml").read_text()
    assert "UNRESOLVED" in text and 'revision = "main"' in text       # the commit is not claimed
    assert not load_target("a40-vllm").runpod.is_cluster


def _variant(tmp_path: Path, old: str, new: str) -> None:
    src = (ROOT / "images" / "targets" / f"{K3}.toml").read_text()
    assert old in src
    path = tmp_path / f"{K3}.toml"
    path.write_text(src.replace(old, new).replace('config = "deploy/',
                                                  f'config = "{ROOT}/images/deploy/'))
    parse_target(path.read_text(), path)


def test_a_cluster_whose_rungs_do_not_span_every_gpu_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ConfigError) as e:
        _variant(tmp_path, "nodes = 2", "nodes = 3")
    text = str(e.value)
    assert "runpod.nodes" in text and "8 x 2 GPUs, the cluster has 3 nodes x 8 GPUs" in text
    assert "-tp 8 -pp 3" in text


@pytest.mark.parametrize("command", [("pods", "up"), ("endpoint", "plan"), ("endpoint", "up")])
def test_one_machine_commands_refuse_a_cluster_target_and_name_the_command_that_deploys_it(command):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD_")}
    r = subprocess.run([sys.executable, str(ROOT / "build.py"), *command, "--target", K3], capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=120, check=False)
    assert r.returncode == 2 and "a cluster target ([runpod] nodes = 2)" in r.stderr, r.stderr
    assert f"cluster up --target {K3}" in r.stderr
