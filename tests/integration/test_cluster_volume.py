"""Two nodes of one cluster on one shared state_dir (a network volume mounted on every node, issue 40:
"the model is downloaded once per node (or once per shared volume when mounted)"): two real
supervisors with the variables RunPod gives a cluster's nodes (kiln_dev/loopback_cluster.node_env),
the model fetched from the Hub stand-in (kiln_dev/hub) by the real huggingface_hub client. The Hub
serves the model's bytes once (one node downloads under the volume's lock, the other waits for it and
reuses its files), and each node's own state is in a directory of its own.

No engine boots: the fetch comes before the group's launch gate, and the cluster has a third node
that never arrives, so both nodes wait at the gate (the machine this runs on is small)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln_dev import vllm_cpu
from kiln_dev.hub import HubServer, client_env
from kiln_dev.loopback_cluster import node_deploy, node_env
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
    master, sports = free_port(), [free_port(), free_port()]
    # One connection at 4 MB/s (~7 s for the model) holds rank 0's download open while rank 1 starts.
    with Throttle(int(hub.url.rsplit(":", 1)[1]), bytes_per_s=4_000_000) as slow:
        common = {**hub.env, "HF_ENDPOINT": slow.url, "KILN_MODEL_FETCH_CONNECTIONS": "1", "KILN_API_KEY": KEY,
                  "KILN_CLUSTER_MIN_SHM_GIB": "0.01"}

        def start(rank: int) -> Supervised:
            home = tmp_path / f"node{rank}"
            home.mkdir()
            text = node_deploy(volume, model=f"hf://{REPO}", binary=vllm_cpu.require_vllm(),
                               snapshot=vllm_cpu.snapshot_file(), port=free_port(), sport=sports[rank], boot_s=60)
            env = node_env(rank, nodes=3, master_port=master, primary_status=sports[0], extra=common)
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
