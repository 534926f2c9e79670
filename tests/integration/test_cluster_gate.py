"""A cluster's node refused before anything runs, and a rank that never arrives, with real
supervisors on loopback (issue 40). No engine starts in either case (the refusal comes at
PREFLIGHT, the missing rank holds the primary at its launch gate), so these boot no vLLM: the
config names the real CPU build only so that everything before the launch is what a cluster runs.
A FAILED group with [runpod] terminate_on_terminal_failure deletes its cluster from rank 0, against
kiln_dev/runpod's /v2/clusters (a stand-in for RunPod's v2 API, schema-checked; its nodes run nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from kiln_dev import vllm_cpu
from kiln_dev.loopback_cluster import node_env
from kiln_dev.runpod import ClusterStandIn
from kiln_dev.supervised import Supervised, free_port, http, wait_for
from tests.support.cluster import deploy

ACCOUNT_KEY = "rpa_cluster-gate-canary-5b1f"


@pytest.fixture(scope="module")
def engine() -> dict[str, Path]:
    return {"binary": vllm_cpu.require_vllm(), "model": vllm_cpu.require_model("tiny"),
            "snapshot": vllm_cpu.snapshot_file()}


def primary(tmp: Path, engine: dict[str, Path], *, more: str = "", **extra: str) -> Supervised:
    sport, group = free_port(), free_port()
    text = deploy(tmp, port=free_port(), sport=sport, **engine) + more
    env = node_env(0, nodes=2, master_port=free_port(), group_port=group, extra=extra)
    sup = Supervised(tmp, text, env=env)
    sup.group_port = group            # type: ignore[attr-defined]  (rank 0 takes beats there)
    return sup


def test_a_rank_that_never_arrives_fails_the_group_after_the_stated_timeout_naming_it(tmp_path, engine):
    with primary(tmp_path, engine, KILN_CLUSTER_ARRIVE_S="6", KILN_CLUSTER_MIN_SHM_GIB="0.01") as sup:
        st = sup.wait_state("FAILED", "SERVING", timeout=120)
        assert st["state"] == "FAILED" and st["last_failure"]["class"] == "node_missing", st["last_failure"]
        reason = st["last_failure"]["reason"]
        assert "rank 1 never arrived" in reason and "6 s (KILN_CLUSTER_ARRIVE_S)" in reason
        assert "(the group's port, KILN_CLUSTER_PORT)" in reason
        assert st["launches"] == 0 if "launches" in st else True      # nothing launched without the group
        assert not (st.get("engine") or {}).get("pid")
        assert sup.stop() == 3                                         # FAILED before anything served


def test_a_strangers_beat_is_never_taken_and_fails_nothing(tmp_path, engine):
    """Issue 50 item 2: one unauthenticated GET of /cluster?beat={rank 1 FAILED} on rank 0's status port (which
    RunPod's public proxy exposes) failed the group, and with terminate_on_terminal_failure rank 0 deleted the
    cluster. Now the status port takes no beat at all, and the group's own port (the cluster network) takes
    only beats sealed with the cluster's secret."""
    from urllib.parse import urlencode

    from supervisor.cluster.protocol import Beat, Seal

    failed = Beat(1, "FAILED", False, 0, failure="crashed")
    with primary(tmp_path, engine, KILN_CLUSTER_ARRIVE_S="600", KILN_CLUSTER_MIN_SHM_GIB="0.01") as sup:
        sup.wait_state("FETCH", "LAUNCHING", "LOADING", timeout=120)
        wait_for(lambda: http(f"http://127.0.0.1:{sup.group_port}/live")[0] == 404, 60, "the group's port")
        asks = {"unsealed, on the status port": sup.url("/cluster?" + urlencode({"beat": failed.encode().decode()})),
                "unsealed, on the group's port": f"http://127.0.0.1:{sup.group_port}/cluster?"
                                                 + urlencode({"beat": failed.encode().decode()}),
                "sealed with another secret": f"http://127.0.0.1:{sup.group_port}/cluster?" + urlencode(
                    {"beat": Seal("not-this-clusters-secret-000").seal(failed).decode()})}
        codes = {what: http(url)[0] for what, url in asks.items()}
        assert codes == {"unsealed, on the status port": 404, "unsealed, on the group's port": 403,
                         "sealed with another secret": 403}, codes
        st = sup.status()
        assert st["state"] != "FAILED" and not st.get("last_failure"), st.get("last_failure")
        assert "beat refused" in sup.log() or "a beat refused" in sup.log()
        sup.stop()


def test_a_node_with_the_wrong_interface_or_too_little_shm_is_refused_with_the_fix(tmp_path, engine):
    with primary(tmp_path, engine, KILN_CLUSTER_IFNAME="nosuch0", KILN_CLUSTER_MIN_SHM_GIB="100000") as sup:
        st = sup.wait_state("FAILED", "SERVING", timeout=120)
        assert st["state"] == "FAILED" and st["last_failure"]["class"] == "config_rejected"
        reason = st["last_failure"]["reason"]
        assert "network interface 'nosuch0'" in reason and "set KILN_CLUSTER_IFNAME" in reason
        assert "below the 100000 GiB" in reason and "give the pod more shared memory" in reason
        assert "cluster" in st and st["cluster"]["rank"] == 0
        sup.stop()


def test_a_group_failed_for_good_deletes_its_cluster_from_rank_0(tmp_path, engine):
    # Rank 0 is the primary of a cluster the stand-in holds (its RUNPOD_POD_ID that cluster's rank 0
    # pod); rank 1 never arrives, so the group is FAILED node_missing and rank 0 deletes the cluster
    # (not its pod: member pods cannot be deleted through /v2/pods), found by name and membership.
    with ClusterStandIn(ACCOUNT_KEY) as standin:
        body = {"name": "kiln-t-cluster", "type": "APPLICATION", "image": "ghcr.io/kiln-llm/kiln:x",
                "compute": {"gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 1, "podCount": 2}}
        auth = {"Authorization": f"Bearer {ACCOUNT_KEY}"}
        other = requests.post(standin.url + "/clusters", json=body, headers=auth, timeout=30).json()["id"]
        mine = requests.post(standin.url + "/clusters", json=body, headers=auth, timeout=30).json()["id"]
        head = standin.clusters[mine]["_pods"][0]
        runpod = "[runpod]\nterminate_on_terminal_failure = true\nterminate_grace_s = 1\n"
        with primary(tmp_path, engine, more=runpod, KILN_CLUSTER_ARRIVE_S="6", KILN_CLUSTER_MIN_SHM_GIB="0.01",
                     RUNPOD_POD_ID=head, RUNPOD_API_KEY=ACCOUNT_KEY, KILN_RUNPOD_API_URL=standin.url,
                     KILN_CLUSTER_NAME="kiln-t-cluster") as sup:
            st = sup.wait_state("FAILED", "SERVING", timeout=120)
            assert st["state"] == "FAILED" and st["last_failure"]["class"] == "node_missing", st["last_failure"]
            wait_for(lambda: mine in standin.deleted_clusters, 60, "rank 0 to delete its cluster")
            wait_for(lambda: ((sup.status() or {}).get("runpod_terminate") or {}).get("outcome") == "terminated",
                     10, "/status to say the cluster is terminated")
            st = sup.status()
            assert st["runpod_terminate"]["cluster"] == mine and st["runpod_terminate"]["rank"] == 0
            assert http(sup.url("/live"))[0] == 200                       # the supervisor still answers
            assert ACCOUNT_KEY not in sup.log() and ACCOUNT_KEY not in json.dumps(st)
            assert sup.stop() == 3
        assert standin.deleted_clusters == [mine] and other in standin.clusters
        assert [r["path"] for r in standin.requests if r["method"] == "DELETE"] == [f"/v2/clusters/{mine}"]
        assert head in standin.terminated and standin.faults == []
