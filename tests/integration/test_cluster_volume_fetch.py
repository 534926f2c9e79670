"""Two nodes of one cluster on one shared state_dir (a network volume mounted on every node, issue 40:
"the model is downloaded once per node (or once per shared volume when mounted)"): two real
supervisors with the variables RunPod gives a cluster's nodes (kiln_dev/loopback_cluster.node_env),
the model fetched from the Hub stand-in (kiln_dev/hub) by the real huggingface_hub client. The Hub
serves the model's bytes once (one node downloads under the volume's lock, the other waits for it and
reuses its files), and each node's own state is in a directory of its own.

No engine boots: the fetch comes before the group's launch gate, and the cluster has a third node
that never arrives, so both nodes wait at the gate (the machine this runs on is small).

`cluster up --volume` against kiln_dev/runpod's /v2/clusters stand-in: the volume looked up first, the
cluster placed in its data center, every node mounting it; a missing one or one elsewhere refused
before anything is created, by Kiln and by the stand-in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from kiln_dev import vllm_cpu
from kiln_dev.hub import HubServer, client_env
from kiln_dev.loopback_cluster import node_deploy, node_env
from kiln_dev.runpod import ClusterStandIn
from kiln_dev.runpod.api import gpu_type
from kiln_dev.supervised import Supervised, free_port, wait_for
from kiln_dev.throttle import Throttle

REPO = "kiln-test/tiny-llama"
BODY_ROUTES = ("resolve_get", "cdn_get", "xorb_get")       # what a download costs the Hub (test_fetch.py)
KEY = "cluster-volume-canary-key"


@pytest.fixture
def hub(tmp_path):
    with HubServer(tmp_path / "hub") as server, client_env(server, tmp_path / "home") as ce:
        server.env = ce.env
        yield server


def fetch_event(sup: Supervised) -> dict:
    return (((sup.status() or {}).get("model") or {}).get("fetch")) or {}


def fetched(sup: Supervised) -> dict | None:
    model = (sup.status() or {}).get("model") or {}
    return model if model.get("path") and model.get("total_bytes") else None


def test_two_nodes_on_one_volume_download_the_model_once_and_keep_their_own_state(tmp_path, hub):
    checkpoint = vllm_cpu.require_model("tiny")
    files = {p.name: p.read_bytes() for p in sorted(checkpoint.iterdir()) if p.is_file()}
    hub.seed(REPO, files, storage="lfs")
    volume = tmp_path / "volume"
    volume.mkdir()
    master, sports, group = free_port(), [free_port(), free_port()], free_port()
    # One connection at 1 MB/s (~28 s for the model) holds rank 0's download open while rank 1 starts.
    with Throttle(int(hub.url.rsplit(":", 1)[1]), bytes_per_s=1_000_000) as slow:
        common = {**hub.env, "HF_ENDPOINT": slow.url, "KILN_MODEL_FETCH_CONNECTIONS": "1", "KILN_API_KEY": KEY,
                  "KILN_CLUSTER_MIN_SHM_GIB": "0.01"}

        def start(rank: int) -> Supervised:
            home = tmp_path / f"node{rank}"
            home.mkdir()
            text = node_deploy(volume, model=f"hf://{REPO}", binary=vllm_cpu.require_vllm(),
                               snapshot=vllm_cpu.snapshot_file(), port=free_port(), sport=sports[rank], boot_s=60)
            env = node_env(rank, nodes=3, master_port=master, group_port=group, extra=common)
            return Supervised(home, text, env=env, status_port=sports[rank])

        with start(0) as rank0:
            wait_for(lambda: fetch_event(rank0).get("event") == "progress" and fetch_event(rank0).get("done", 0) > 0,
                     120, "rank 0 to be downloading")
            with start(1) as rank1:
                waiting = wait_for(lambda: (ev := fetch_event(rank1)).get("event") == "waiting" and ev, 120,
                                   "rank 1 to say it waits for rank 0's download")
                assert waiting["for"].startswith("worker loopback-node0 ")
                m0 = wait_for(lambda: fetched(rank0), 120, "rank 0 to have the model")
                m1 = wait_for(lambda: fetched(rank1), 120, "rank 1 to have the model")
                assert m0["path"] == m1["path"] and m0["path"].startswith(str(volume / "state/hf/"))
                served = sum(hub.bytes_served[r] for r in BODY_ROUTES)
                assert served == m0["total_bytes"] >= sum(len(b) for b in files.values())   # once, by one node
                for sup in (rank0, rank1):                                   # at the launch gate, nothing ran
                    assert (sup.status() or {}).get("state") not in ("SERVING", "FAILED")
                rank1.stop()
            rank0.stop()
    workers = volume / "state/workers"
    assert sorted(p.name for p in workers.iterdir()) == ["loopback-node0", "loopback-node1"]
    for rank in (0, 1):                  # the children journal and the engine's key file: each node's own
        own = workers / f"loopback-node{rank}"
        assert (own / "run/children.json").is_file() and (own / "run/engine-api-key").is_file(), \
            sorted(str(p.relative_to(own)) for p in own.rglob("*"))
    assert sorted(p.name for p in (volume / "state").iterdir()) == ["hf", "workers"]    # nothing else shared


# -- `cluster up --volume` against the RunPod stand-in (its nodes run nothing: no runner) -----------------
ROOT = Path(__file__).resolve().parents[2]
TARGET = "a40-vllm"
API_KEY = "rpk-cluster-volume-canary-0001"


# The deploy config the cluster's nodes serve: one vLLM group across the 2 nodes (-tp 2, one A40 each), so
# the check before renting passes (a40-vllm's own config serves one GPU: refused for a 2-node cluster).
GROUP = """engine = "vllm"
state_dir = "/workspace/kiln"
[model]
source = "hf://kiln-test/tiny-llama"
entry = "config.json"
[[ladder.rungs]]
name = "tp2"
args = ["-tp", "2", "--max-model-len", "512"]
[ladder.rungs.env]
NCCL_P2P_DISABLE = "1"
"""


def cli(standin: ClusterStandIn, config: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "KILN_", "HF_"))}
    env.update(RUNPOD_API_KEY=API_KEY, RUNPOD_API_URL=standin.url, RUNPOD_PROXY_URL=standin.proxy_url)
    return subprocess.run([sys.executable, str(ROOT / "build.py"), "cluster", *args, "--target", TARGET,
                           "--config", str(config), "--nodes", "2", "--allow-floating"], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120, check=False)


def test_up_with_a_volume_places_the_cluster_in_its_data_center_and_refuses_one_missing_or_elsewhere(tmp_path):
    two = (("EU-RO-1", "HIGH"), ("US-TX-3", "HIGH"))
    config = tmp_path / "group.toml"
    config.write_text(GROUP)
    with ClusterStandIn(API_KEY, catalog=[gpu_type("NVIDIA A40", data_centers=two)]) as standin:
        auth = {"Authorization": f"Bearer {API_KEY}"}
        vol = requests.post(standin.url + "/network-volumes", json={"name": "weights", "size": 20,
                                                                    "dataCenter": "US-TX-3"},
                            headers=auth, timeout=30).json()
        missing = cli(standin, config, "up", "--volume", "vol-nope")
        assert missing.returncode == 2 and "--volume vol-nope: no network volume with that id" in missing.stderr
        assert f"{vol['id']} (weights, US-TX-3)" in missing.stderr
        elsewhere = cli(standin, config, "up", "--volume", vol["id"], "--data-center", "EU-RO-1")
        assert elsewhere.returncode == 2, elsewhere.stderr
        assert "is in US-TX-3, not in --data-center EU-RO-1" in elsewhere.stderr and "--data-center US-TX-3" \
            in elsewhere.stderr
        assert not [r for r in standin.requests if r["method"] == "POST" and r["path"] == "/v2/clusters"]
        up = cli(standin, config, "up", "--volume", vol["id"], "--volume-path", "/runpod-volume", "--timeout", "1",
                 "--poll", "0.2")
        assert up.returncode == 1 and "NOT READY" in up.stdout, up.stderr            # its nodes run nothing
        assert "has 20 GB, less than the 60 GB the target's [runpod] volume_gb asks for" in up.stderr
        (cluster,) = standin.clusters.values()
        assert cluster["dataCenterId"] == "US-TX-3"
        for pid in cluster["_pods"]:                                                  # every node mounts it
            pod = standin.pods[pid]
            assert pod["mounts"] == {"network": [{"volumeId": vol["id"], "path": "/runpod-volume"}]}
            assert pod["env"]["KILN_STATE_DIR"] == "/runpod-volume/kiln" and pod["dataCenterId"] == "US-TX-3"
        assert standin.faults == [] and API_KEY not in up.stdout + up.stderr
        # The stand-in itself refuses what RunPod documents as invalid: a volume that does not exist,
        # and one outside the cluster's data center.
        body = {"name": "x", "type": "APPLICATION", "compute": {"gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 1,
                                                                 "podCount": 2}}
        for mount, dcs, said in (("vol-nope", [], "does not exist"), (vol["id"], ["EU-RO-1"], "is in US-TX-3")):
            r = requests.post(standin.url + "/clusters", headers=auth, timeout=30, json={
                **body, "dataCenterIds": dcs, "mounts": {"network": [{"volumeId": mount, "path": "/v"}]}})
            assert r.status_code == 400 and said in r.text, r.text
