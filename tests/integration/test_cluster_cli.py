"""`python build.py cluster plan|up|status|logs|down` against kiln_dev/runpod's /v2/clusters stand-in
(issue 40 item 4): the body valid against RunPod's CreateClusterRequest, the catalog read before
anything is created, a real two-node group formed by the stand-in's nodes, no secret value anywhere.

What runs: each node is a real Kiln supervisor started by the stand-in with the variables RunPod sets
on a cluster node, serving the real vLLM CPU build as one `-tp 2 --nnodes 2` group (rank 1
`--headless`), the same engine and deploy config as tests/integration/test_cluster_real.py. Not a
small llama-server per node: Kiln's group runs vLLM's own multi-node executor only, so a
llama-server node would test a group Kiln never deploys. One group boot on this loaded machine is
minutes, so the test boots one and walks plan -> up -> status -> logs -> down through it. The target
is a40-vllm for its template (image, secrets, ports); the nodes' deploy config is the
tests' small one, given as `--config` (it spans the cluster: -tp 2 over 2 nodes x 1 GPU), and travels in
the nodes' environment as a user's own would. The image's baked config (one GPU) is refused for a
2-node cluster before anything is created.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import requests

from kiln_dev import vllm_cpu
from kiln_dev.runpod import ClusterStandIn, SupervisorRunner
from tests.support.cluster import BOOT_S, LOST_S, deploy

ROOT = Path(__file__).resolve().parents[2]
TARGET = "a40-vllm"
API_KEY = "rpk-cluster-cli-canary-0001"
SECRETS = {"hf_token": "hf_cluster_canary_0002", "kiln_api_key": "kiln-cluster-canary-0003"}
SCHEMA = json.loads((ROOT / "images" / "schemas" / "runpod-rest-v2.json").read_text())


def cli(standin: ClusterStandIn, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "KILN_", "HF_"))}
    env.update(RUNPOD_API_KEY=API_KEY, RUNPOD_API_URL=standin.url, RUNPOD_PROXY_URL=standin.proxy_url)
    return subprocess.run([sys.executable, str(ROOT / "build.py"), "cluster", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=timeout, check=False)


def no_secret(*texts: str) -> None:
    for text in texts:
        for value in (API_KEY, *SECRETS.values()):
            assert value not in text


def group_config(tmp_path: Path) -> str:
    """The deploy config every node serves, written where `--config` reads it."""
    engine = {"binary": vllm_cpu.require_vllm(), "model": vllm_cpu.require_model("tiny"),
              "snapshot": vllm_cpu.snapshot_file()}
    path = tmp_path / "group.toml"
    path.write_text(deploy(tmp_path / "nodes", port=8080, sport=8081, **engine))
    return str(path)


@pytest.fixture
def standin(tmp_path):
    engine = {"binary": vllm_cpu.require_vllm(), "model": vllm_cpu.require_model("tiny"),
              "snapshot": vllm_cpu.snapshot_file()}
    runner = SupervisorRunner(tmp_path, lambda pod, _vol: deploy(tmp_path / pod["id"], port=8080, sport=8081, **engine))
    with ClusterStandIn(API_KEY, runner=runner, secrets=SECRETS,
                        node_extra={"KILN_CLUSTER_MIN_SHM_GIB": "1", "KILN_CLUSTER_LOST_S": str(LOST_S)}) as s:
        yield s


def test_plan_prints_a_body_valid_against_runpods_schema_with_secret_references_only(standin, tmp_path):
    config = group_config(tmp_path)
    r = cli(standin, "plan", "--target", TARGET, "--config", config, "--allow-floating")    # 2 nodes: its rungs say
    assert "give --nodes N" in cli(standin, "plan", "--target", TARGET, "--allow-floating").stderr
    # The image's own config serves one GPU: a 2-node cluster of it is refused, naming the rung and the fix.
    one_gpu = cli(standin, "plan", "--target", TARGET, "--nodes", "2", "--allow-floating")
    assert one_gpu.returncode == 2 and "tensor x pipeline parallel = 1 x 1 GPUs, the cluster has 2 nodes" in one_gpu.stderr
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    root = {"$ref": "#/components/schemas/CreateClusterRequest", "components": SCHEMA["components"]}
    assert list(jsonschema.Draft202012Validator(root).iter_errors(body)) == []
    assert body["compute"] == {"gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 1, "podCount": 2}
    assert body["type"] == "APPLICATION" and "registry" not in body
    assert body["env"]["KILN_API_KEY"] == "{{ RUNPOD_SECRET_kiln_api_key }}"
    assert base64.b64decode(body["env"]["KILN_DEPLOY_CONFIG"]).decode() == Path(config).read_text()
    # Every node learns its cluster's name: a FAILED group finds its cluster by it (fleet/cluster_terminate.py).
    assert body["env"]["KILN_CLUSTER_NAME"] == body["name"] == f"kiln-{TARGET}-cluster"
    assert standin.requests == []                                 # plan sends nothing
    no_secret(r.stdout, r.stderr)
    bad = cli(standin, "plan", "--target", TARGET, "--config", config, "--nodes", "1", "--allow-floating")
    assert bad.returncode == 2 and "--nodes 1" in bad.stderr and "2 to 250" in bad.stderr


def test_up_status_logs_down_through_a_real_two_node_group(standin, tmp_path):
    standin.catalog[0]["maxCount"]["secure"] = 0             # no cluster capacity: nothing is created
    config = group_config(tmp_path)
    refused = cli(standin, "up", "--target", TARGET, "--config", config, "--allow-floating", "--timeout", "5",
                  "--poll", "0.5")
    assert refused.returncode == 2 and "no cluster capacity for 1x NVIDIA A40" in refused.stderr
    assert standin.writes() == []
    assert ("GET", "/v2/catalog/gpus") in [(q["method"], q["path"]) for q in standin.requests]
    (catalog,) = [q["query"] for q in standin.requests if q["path"] == "/v2/catalog/gpus"]
    assert "product=CLUSTER" in catalog and "include=AVAILABILITY" in catalog
    standin.catalog[0]["maxCount"]["secure"] = 8

    up = cli(standin, "up", "--target", TARGET, "--config", config, "--allow-floating", "--timeout", str(BOOT_S),
             "--poll", "1", timeout=BOOT_S + 120)
    assert up.returncode == 0, up.stdout + up.stderr + standin.log_text()[-3000:]
    assert standin.writes() == [("POST", "/v2/clusters")]
    (cluster,) = standin.clusters.values()
    head, other = (standin.pods[p] for p in cluster["_pods"])
    assert standin.proxy_url.format(pod_id=head["id"], port=8080) + "/v1" in up.stdout
    assert "ready" in up.stdout and other["id"] not in up.stdout      # the one URL is rank 0's

    # RunPod leaves member pods out of GET /v2/pods (includeClusterPods=true adds them): `pods` never sees them
    listed = requests.get(standin.url + "/pods", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
    assert listed.status_code == 200 and listed.json() == {"pods": []}

    st = cli(standin, "status", "--target", TARGET)
    assert st.returncode == 0, st.stderr
    lines = [ln.strip() for ln in st.stdout.splitlines() if ln.strip().startswith("rank")]
    assert lines[0].startswith(f"rank 0  {head['id']}  RUNNING  GPU use:") and "supervisor: SERVING" in lines[0]
    assert lines[1].startswith(f"rank 1  {other['id']}  RUNNING  GPU use:")

    logs = cli(standin, "logs", "--target", TARGET, "--rank", "1", "--idle", "1")
    assert logs.returncode == 0 and logs.stdout.strip(), logs.stderr

    down = cli(standin, "down", "--target", TARGET)
    assert down.returncode == 0 and "deleted, with every node" in down.stdout
    assert standin.clusters == {} and set(standin.terminated) == {head["id"], other["id"]}
    assert cli(standin, "status", "--target", TARGET).returncode == 2
    assert standin.faults == []
    node_logs = [p.read_text(errors="replace") for p in tmp_path.glob("*/container.log")]
    assert len(node_logs) == 2
    no_secret(up.stdout, up.stderr, st.stdout, st.stderr, logs.stdout, down.stdout, standin.log_text(), *node_logs)
