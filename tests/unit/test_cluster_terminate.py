"""A FAILED cluster ends itself (issue 40): supervisor/fleet/cluster_terminate.py finds the cluster whose
member pods include this pod and deletes it, from rank 0 only, against kiln_dev/runpod's /v2/clusters
(a stand-in for RunPod's v2 API, not RunPod: every answer checked against the vendored schema; its
nodes run nothing here)."""

from __future__ import annotations

import logging

import pytest
import requests

from kiln_dev.loopback_cluster import node_env
from kiln_dev.runpod import ClusterStandIn
from supervisor.config import SelfTerminateSpec
from supervisor.fleet import cluster_terminate, self_terminate

ACCOUNT_KEY = "rpa_cluster-terminate-canary-7c2e"
FAILURE = "node_missing: rank 1 never arrived"


@pytest.fixture
def standin():
    with ClusterStandIn(ACCOUNT_KEY) as s:
        yield s
    assert s.faults == []


def a_cluster(standin: ClusterStandIn, name: str) -> tuple[str, list[str]]:
    """A two-node cluster as `build.py cluster up` creates it: its id and its member pods' ids, rank order."""
    body = {"name": name, "type": "APPLICATION", "image": "ghcr.io/kiln-llm/kiln:x",
            "compute": {"gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 1, "podCount": 2}}
    r = requests.post(standin.url + "/clusters", json=body, headers={"Authorization": f"Bearer {ACCOUNT_KEY}"},
                      timeout=30)
    assert r.status_code == 201, r.text
    cid = r.json()["id"]
    return cid, list(standin.clusters[cid]["_pods"])


def node(standin: ClusterStandIn, rank: int, pod_id: str, key: str = ACCOUNT_KEY, **extra: str) -> dict[str, str]:
    """A cluster node's environment: RunPod's cluster variables, its pod id, a key, the stand-in's URL."""
    return {**node_env(rank, nodes=2, master_port=29501, group_port=8091), "RUNPOD_POD_ID": pod_id,
            "RUNPOD_API_KEY": key, "KILN_RUNPOD_API_URL": standin.url, **extra}


def spec(standin: ClusterStandIn, grace: float = 0.2) -> SelfTerminateSpec:
    return SelfTerminateSpec(terminate_on_terminal_failure=True, terminate_grace_s=grace, api_url=standin.url)


def arm(standin, env, grace=0.2):
    events: list[tuple[str, str]] = []
    handle = cluster_terminate.arm(spec(standin, grace), env, failure=FAILURE,
                                   on_event=lambda e, d: events.append((e, d)))
    return handle, events


def deletes(standin):
    return [r["path"] for r in standin.requests if r["method"] == "DELETE"]


@pytest.mark.parametrize("named", [False, True])
def test_rank_0_deletes_the_cluster_whose_members_include_its_pod_and_not_the_other(standin, caplog, named):
    # Two clusters; with KILN_CLUSTER_NAME both carry that name, so only the membership tells them apart.
    other, _ = a_cluster(standin, "kiln-t-cluster" if named else "someone-elses")
    mine, (head, _) = a_cluster(standin, "kiln-t-cluster")
    caplog.set_level(logging.INFO, logger="kiln")
    extra = {"KILN_CLUSTER_NAME": "kiln-t-cluster"} if named else {}
    handle, events = arm(standin, node(standin, 0, head, **extra))
    assert handle is not None and handle.wait(30) == "terminated", handle.outcome
    assert standin.deleted_clusters == [mine] and other in standin.clusters
    assert deletes(standin) == [f"/v2/clusters/{mine}"]               # the cluster, never a pod
    assert head in standin.terminated                                  # every member pod with it
    assert handle.to_dict()["cluster"] == mine and handle.to_dict()["rank"] == 0
    assert [e for e, _ in events] == ["runpod_terminate_armed", "runpod_terminated"]
    assert "deleting this pod's cluster" in events[0][1] and FAILURE in events[0][1]
    assert ACCOUNT_KEY not in caplog.text + repr(events) + repr(handle.to_dict())


@pytest.mark.parametrize("name", [None, "kiln-t-cluster"])
def test_no_cluster_with_this_pod_among_its_members_deletes_nothing_and_says_so_once(standin, caplog, name):
    a_cluster(standin, "kiln-t-cluster")
    _, (not_in_that_name, _) = a_cluster(standin, "someone-elses")
    pod = "notamember01" if name is None else not_in_that_name     # no cluster at all; none of that name
    handle, events = arm(standin, node(standin, 0, pod, **({"KILN_CLUSTER_NAME": name} if name else {})))
    outcome = handle.wait(30)
    assert outcome.startswith("failed: no cluster") and deletes(standin) == [] and standin.deleted_clusters == []
    warned = [d for e, d in events if e == "runpod_terminate_failed"]
    assert len(warned) == 1 and f"lists pod {pod} among its member pods" in warned[0]
    assert "nothing deleted" in warned[0] and (name is None or f"named {name!r}" in warned[0])
    assert caplog.text.count("this pod's cluster was not deleted") == 1


def test_rank_1_never_deletes_anything_and_says_rank_0_owns_it(standin):
    _, (_, rank1) = a_cluster(standin, "kiln-t-cluster")
    before = len(standin.requests)
    handle, events = arm(standin, node(standin, 1, rank1), grace=0)
    assert handle.wait(5) == "left to rank 0" and handle.to_dict()["rank"] == 1
    assert len(standin.requests) == before                            # not even a look-up
    assert [e for e, _ in events] == ["runpod_terminate_left_to_rank0"] and "rank 0's" in events[0][1]
    assert standin.deleted_clusters == [] and not standin.terminated


def test_a_key_that_may_not_list_clusters_says_what_to_do_once_and_deletes_nothing(standin, caplog):
    _, (head, _) = a_cluster(standin, "kiln-t-cluster")
    pod_key = standin.pods[head]["_key"]                   # the pod-scoped key RunPod puts in the pod
    handle, events = arm(standin, node(standin, 0, head, key=pod_key), grace=0)
    assert handle.wait(30).startswith("failed: GET /v2/clusters: HTTP 403")
    assert [r["path"] for r in standin.requests if r["method"] == "GET"] == ["/v2/clusters"]     # not retried
    assert "[runpod.secrets] RUNPOD_API_KEY" in caplog.text and deletes(standin) == []
    assert [e for e, _ in events] == ["runpod_terminate_armed", "runpod_terminate_failed"]
    assert pod_key not in caplog.text + repr(events)


def test_api_errors_are_retried_and_the_key_is_in_no_log_line(standin, caplog, monkeypatch):
    monkeypatch.setattr(self_terminate, "BACKOFF_S", 0.05)
    cid, (head, _) = a_cluster(standin, "kiln-t-cluster")
    caplog.set_level(logging.DEBUG)
    # Each answer echoes the Authorization header, as a careless proxy might.
    standin.fail_on[("GET", "/v2/clusters")] = (500, "upstream failed while handling $AUTH")
    standin.fail_on[("DELETE", f"/v2/clusters/{cid}")] = (502, "bad gateway $AUTH")
    handle, events = arm(standin, node(standin, 0, head), grace=0)
    assert handle.wait(30) == "terminated"
    assert "attempt 1 of 5 failed: GET /v2/clusters: HTTP 500" in caplog.text
    assert "terminate attempt 1 of 5 failed: HTTP 502" in caplog.text and "***" in caplog.text
    assert ACCOUNT_KEY not in caplog.text + repr(events) + repr(handle.to_dict())


def test_a_recovery_before_the_grace_ends_keeps_the_cluster(standin):
    cid, (head, _) = a_cluster(standin, "kiln-t-cluster")
    handle, events = arm(standin, node(standin, 0, head), grace=60)
    assert handle.cancel() is True and handle.wait(30) == "cancelled"
    assert deletes(standin) == [] and cid in standin.clusters
    assert events[-1][0] == "runpod_terminate_cancelled"


def test_off_a_cluster_the_pod_itself_is_terminated_as_before(standin):
    from images.runpod.api import RunPodAPI

    pod = RunPodAPI(ACCOUNT_KEY, standin.url).create_pod({"name": "kiln-one", "image": "ghcr.io/kiln-llm/kiln:x",
                                                          "gpu": {"id": "NVIDIA A40"}})
    env = {"RUNPOD_POD_ID": pod["id"], "RUNPOD_API_KEY": ACCOUNT_KEY, "KILN_RUNPOD_API_URL": standin.url}
    handle, _ = arm(standin, env, grace=0)
    assert handle.wait(30) == "terminated" and deletes(standin) == [f"/v2/pods/{pod['id']}"]
