"""Nothing is rented that the image would refuse (issue 49, items 2, 4 and 5): `pods up`, `cluster up` and
`endpoint up` check the deploy config against the image and the shape, and the image against its registry,
before anything is created. Was: `pods up --gpu-count 5` rented a $2.20/h pod for a 2-GPU config; `cluster
up --nodes 3 --gpu H100` rented 24 GPUs for an NVFP4 config that needs compute capability 10.0 and 16 GPUs; a
second `cluster up` of another shape reported on the old cluster; a missing image still billed.

kiln_dev/runpod stands for RunPod's REST API v2 (its containers run nothing here: these tests are about what
is created, not what serves); kiln_dev/registry is a real registry (Debian's docker-registry) on loopback,
standing for ghcr.io."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from images import deployment
from images.runpod import precheck
from kiln_dev.registry import Registry, push_image
from kiln_dev.runpod import ClusterStandIn, RunPodStandIn, gpu_type

ROOT = Path(__file__).resolve().parents[2]
KEY = "rpa_before-renting-canary-31"
H100 = "NVIDIA H100 80GB HBM3"


def cli(standin: RunPodStandIn, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "KILN_", "HF_"))}
    env.update(RUNPOD_API_KEY=KEY, RUNPOD_API_URL=standin.url, RUNPOD_PROXY_URL=standin.proxy_url)
    return subprocess.run([sys.executable, str(ROOT / "build.py"), *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)


@pytest.fixture
def standin():
    with ClusterStandIn(KEY, catalog=[gpu_type("NVIDIA A40"), gpu_type(H100, memory=80),
                                      gpu_type("NVIDIA B200", memory=180)]) as s:
        yield s


def test_a_gpu_count_the_config_refuses_rents_nothing(standin):
    r = cli(standin, "pods", "up", "--target", "a40-llamacpp-upstream", "--gpu-count", "5", "--timeout", "5")
    assert r.returncode == 2
    assert "--gpu-count 5: the image's own deploy config (kimi-k3-2xa40.toml) has [hardware] gpu_count = 2" in r.stderr
    assert "nothing was rented" in r.stderr and "Fix: --gpu-count 2" in r.stderr
    assert standin.writes() == [] and standin.pods == {}


def test_a_cluster_shape_the_config_cannot_serve_rents_nothing(standin):
    r = cli(standin, "cluster", "up", "--target", "b200-vllm", "--nodes", "3", "--gpu", H100, "--timeout", "5")
    assert r.returncode == 2, r.stdout + r.stderr
    for said in ("compute capability 9.0, under [hardware] min_compute_capability = 10.0",
                 "the b200-vllm image is built for sm_100",
                 "tensor x pipeline parallel = 8 x 2 GPUs, the cluster has 3 nodes x 8 GPUs",
                 "80 GB a card, under the 120000 MiB [hardware] min_vram_mib"):
        assert said in r.stderr, (said, r.stderr)
    assert standin.writes() == [] and standin.clusters == {}


def test_a_second_cluster_up_of_another_shape_is_refused_unless_replace(standin, tmp_path):
    first = cli(standin, "cluster", "up", "--target", "b200-vllm", "--timeout", "1", "--poll", "0.2")
    assert first.returncode == 1, first.stdout + first.stderr      # created; rank 0 never answers here
    (old,) = standin.clusters.values()
    assert old["compute"] == {"gpuTypeId": "NVIDIA B200", "gpuCountPerPod": 8, "podCount": 2}
    # Another shape of the same deployment: 4 GPUs a node, 4 nodes (a config spanning 16 as -tp 4 -pp 4).
    cfg = (ROOT / "images" / "deploy" / "kimi-k3-nvfp4-b200-cluster.toml").read_text()
    cfg = cfg.replace('"-tp", "8", "-pp", "2"', '"-tp", "4", "-pp", "4"')
    assert cfg.count('"-tp", "4", "-pp", "4"') == 2
    other = tmp_path / "k3-4x4.toml"
    other.write_text(cfg.replace("gpu_count = 8", "gpu_count = 4"))
    again = cli(standin, "cluster", "up", "--target", "b200-vllm", "--config", str(other), "--gpus-per-node", "4",
                "--timeout", "1", "--poll", "0.2")
    assert again.returncode == 2, again.stdout + again.stderr
    assert "is live and differs from this `up`: shape 2 x 8 NVIDIA B200, asked 4 x 4 NVIDIA B200" in again.stderr
    assert "deploy config sha256" in again.stderr and "--replace" in again.stderr
    assert list(standin.clusters.values()) == [old] and standin.deleted_clusters == []
    replaced = cli(standin, "cluster", "up", "--target", "b200-vllm", "--config", str(other), "--gpus-per-node", "4",
                   "--replace", "--timeout", "1", "--poll", "0.2")
    assert "--replace deletes it" in replaced.stderr, replaced.stderr
    (new,) = standin.clusters.values()
    assert standin.deleted_clusters == [old["id"]] and new["compute"]["podCount"] == 4


def test_a_second_pods_up_with_another_config_is_refused_unless_replace(standin, tmp_path):
    first = cli(standin, "pods", "up", "--target", "a40-vllm", "--timeout", "1", "--poll", "0.2")
    (pod,) = standin.pods.values()
    kimi = ROOT / "images" / "deploy" / "kimi-linear-a40.toml"
    again = cli(standin, "pods", "up", "--target", "a40-vllm", "--config", str(kimi), "--timeout", "1", "--poll", "0.2")
    assert again.returncode == 2, again.stdout + again.stderr
    assert "serves the image's own deploy config, this `up` asks for deploy config sha256" in again.stderr
    assert list(standin.pods) == [pod["id"]], first.stderr
    replaced = cli(standin, "pods", "up", "--target", "a40-vllm", "--config", str(kimi), "--replace", "--timeout", "1",
                   "--poll", "0.2")
    assert "--replace terminates it" in replaced.stderr, replaced.stderr
    (new,) = standin.pods.values()
    assert new["id"] != pod["id"] and pod["id"] in standin.terminated
    assert deployment.carried_text(new["env"]) == kimi.read_text()


def test_an_image_missing_from_its_registry_rents_nothing_and_one_there_passes(standin, tmp_path):
    (tmp_path / "registry").mkdir()
    reg = Registry(tmp_path / "registry")
    try:
        missing = cli(standin, "pods", "up", "--target", "a40-vllm", "--image-ref", f"{reg.host}/kiln:nope",
                      "--timeout", "1")
        assert missing.returncode == 2
        assert f"image {reg.host}/kiln:nope: {reg.host} has no manifest for kiln:nope. Nothing was rented" in missing.stderr
        assert standin.writes() == []
        digest = push_image(reg.host, "kiln", "a40", "a40-vllm")
        found = cli(standin, "pods", "up", "--target", "a40-vllm", "--image-ref", f"{reg.host}/kiln:a40",
                    "--timeout", "1", "--poll", "0.2")
        assert f"image {reg.host}/kiln:a40: in its registry ({digest})" in found.stderr, found.stderr
        assert len(standin.pods) == 1
    finally:
        reg.close()


def test_the_field_notes_deployments_still_pass_the_checks():
    """Kimi-K3 on 2x A40, Qwen3-Coder and Kimi-Linear on one A40, Kimi-K3 NVFP4 on 2 x 8 B200."""
    cases = [("a40-llamacpp-upstream", None, "NVIDIA A40", 2, 1),
             ("a40-vllm", None, "NVIDIA A40", 1, 1),
             ("a40-vllm", str(ROOT / "images" / "deploy" / "kimi-linear-a40.toml"), "NVIDIA A40", 1, 1),
             ("b200-vllm", None, "NVIDIA B200", 8, 2)]
    for target, config, gpu, count, nodes in cases:
        dep = deployment.load(target, config)
        assert (dep.target.runpod.gpu_type, dep.target.runpod.gpu_count, dep.target.runpod.nodes) == (gpu, count, nodes)
        v = precheck.check(dep, precheck.PodShape(gpu, count, nodes))
        assert v.ok, (target, config, v.problems)
