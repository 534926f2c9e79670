"""The fleet reporter (supervisor/fleet/reporter.py) and reader (images/fleet/status.py) on their own:
the real huggingface_hub client writing and reading records against kiln_dev/hub/, the local
stand-in for huggingface.co (repo, branch, preupload, commit, tree and resolve routes of
huggingface_hub 2.4). The snapshot is a plain dict standing where the supervisor's /status is.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from supervisor.fleet import record as fleet
from supervisor.config import WatchSpec
from images.fleet.status import FleetReader
from supervisor.fleet.reporter import Reporter
from kiln_dev.hub import HubServer, RepoKey, client_env
from kiln_dev.supervised import wait_for

REPO = "kiln-test/deploy"
API_KEY = "sk-kiln-canary-api-key-7f3a9c"
RUNPOD_KEY = "rpa_CANARYRUNPODKEY0123456789"


@pytest.fixture
def hub(tmp_path):
    with HubServer(tmp_path / "hub") as server, client_env(server, tmp_path / "home"):
        server.seed(REPO, {"deploy.toml": b"# the published config\n"})
        yield server


class Pod:
    """Stands for the supervisor's side: a snapshot that changes, and the secrets it knows."""

    def __init__(self, hub: HubServer, **watch: float):
        self.hub = hub
        self.lock = threading.Lock()
        self.snap = {"version": "test", "state": "SERVING", "since": time.time(), "ready": True, "uptime_s": 3.0,
                     "config": {"hash": "a" * 64, "revision": hub.resolve(REPO), "from": "hub", "origin": "o"},
                     "reload": {"history": []}, "selftest": None, "last_failure": None}
        spec = WatchSpec(repo=REPO, **{"poll_s": 0.2, "report_s": 30.0, "max_backoff_s": 0.8, **watch})
        self.reporter = Reporter(spec, pod="pod-a", token=hub.token, snapshot=self.snapshot,
                                 secrets=lambda: [hub.token, API_KEY, RUNPOD_KEY])

    def snapshot(self) -> dict:
        with self.lock:
            return json.loads(json.dumps(self.snap))

    def set(self, **kv) -> None:
        with self.lock:
            self.snap.update(kv)
        self.reporter.poke()


def fleet_files(hub: HubServer) -> dict[str, bytes]:
    key = RepoKey("model", REPO)
    head = hub.resolve(REPO, fleet.FLEET_BRANCH)
    if head is None:
        return {}
    files = hub.store.commit(key, head)["files"]
    return {p: hub.store.blob_path(s).read_bytes() for p, s in files.items() if p.startswith("fleet/")}


def record(hub: HubServer) -> dict | None:
    body = fleet_files(hub).get("fleet/pod-a.json")
    return json.loads(body) if body else None


def test_a_record_lands_on_the_fleet_branch_and_config_commits_stay_clean(hub, tmp_path):
    main = hub.resolve(REPO)
    pod = Pod(hub)
    pod.reporter.start()
    try:
        rec = wait_for(lambda: record(hub), 10, "the first record")
        assert (rec["pod"], rec["state"], rec["config"]["revision"], rec["watch"]["branch"]) == \
            ("pod-a", "SERVING", main, "main")
        assert hub.resolve(REPO) == main               # main never moves: pods polling it see no report
        reader = FleetReader(hub_api(hub), REPO, tmp_path / "cache")
        assert [r["pod"] for r in reader.read()] == ["pod-a"]
        hub.reset_counts()
        reader.read()                                   # unchanged blob: listed, not downloaded again
        assert dict(hub.counts) == {"repo_info": 1}
        st = pod.reporter.status()
        assert st["writes"] >= 1 and st["consecutive_errors"] == 0 and st["where"].endswith("fleet/pod-a.json")
    finally:
        pod.reporter.stop()


def hub_api(hub: HubServer):
    from huggingface_hub import HfApi

    return HfApi(token=hub.token)


def test_no_secret_reaches_the_fleet_in_any_record_written(hub):
    pod = Pod(hub)
    pod.snap["reload"] = {"history": [{
        "t": time.time(), "outcome": "rolled_back", "source": "hub", "revision": "f" * 40,
        "cause": f"selftest_failed: the engine printed --api-key {API_KEY} and {hub.token}",
        "stderr_tail": [f"main: key {API_KEY}", f"RUNPOD_API_KEY={RUNPOD_KEY}", "plain line"]}]}
    pod.snap["selftest"] = {"passed": False, "summary": f"auth {hub.token}", "rung": "cpu"}
    pod.snap["last_failure"] = {"class": "crashed", "reason": f"{RUNPOD_KEY} leaked"}
    pod.snap["config"]["origin"] = f"hf://{REPO}?token={hub.token}"
    pod.reporter.start()
    try:
        wait_for(lambda: record(hub), 10, "the record")
        pod.set(state="RELOADING")
        wait_for(lambda: (record(hub) or {}).get("state") == "RELOADING", 10, "a second record")
    finally:
        pod.reporter.stop()
    key = RepoKey("model", REPO)
    bodies = []
    cid = hub.resolve(REPO, fleet.FLEET_BRANCH)
    while cid:                                          # every version of the record ever committed
        commit = hub.store.commit(key, cid)
        if "fleet/pod-a.json" in commit["files"]:
            bodies.append(hub.store.blob_path(commit["files"]["fleet/pod-a.json"]).read_text())
        cid = commit["parent"]
    assert len(bodies) >= 2
    for body in bodies:
        for secret in (API_KEY, RUNPOD_KEY, hub.token):
            assert secret not in body
    rec = json.loads(bodies[0])
    assert rec["last_reload"]["stderr_tail"] == ["main: key ***", "RUNPOD_API_KEY=***", "plain line"]
    assert rec["last_reload"]["cause"].endswith("--api-key *** and ***")


def test_pokes_are_coalesced_into_at_most_one_write_per_poll_interval(hub):
    pod = Pod(hub, poll_s=0.5)
    pod.reporter.start()
    try:
        wait_for(lambda: pod.reporter.status()["writes"] == 1, 10, "the first record")
        written_at = [pod.reporter.status()["last_ok_at"]]
        states = ("RESTARTING", "LAUNCHING", "LOADING", "SERVING")
        for burst in range(3):                          # bursts of state changes, as a flapping engine makes
            for n in range(200):
                pod.set(state=states[n % 4])
            wait_for(lambda: pod.reporter.status()["writes"] == 2 + burst, 10, f"burst {burst} written")
            written_at.append(pod.reporter.status()["last_ok_at"])
        wait_for(lambda: (record(hub) or {}).get("state") == "SERVING", 10, "the last change written")
        st = pod.reporter.status()
        assert st["writes"] == 4, st                    # 600 changes, one write per burst
        gaps = [b - a for a, b in zip(written_at, written_at[1:])]
        assert all(g >= 0.5 * 0.9 for g in gaps), gaps   # never more than one write per poll interval
    finally:
        pod.reporter.stop()


def test_a_hub_outage_backs_off_never_blocks_a_poke_and_writes_resume(hub):
    pod = Pod(hub, poll_s=0.1, max_backoff_s=0.4)
    pod.reporter.start()
    try:
        wait_for(lambda: record(hub), 10, "the first record")
        hub.set_offline(True)
        pod.set(state="RELOADING")
        # huggingface_hub retries a failed preupload itself (5 times, 1-8 s apart) before it raises.
        wait_for(lambda: pod.reporter.status()["consecutive_errors"] >= 1, 60, "a failed write")
        st = pod.reporter.status()
        assert st["unreachable_since"] and st["last_error"].startswith("offline:") and st["interval_s"] == 0.2
        pod.set(state="SERVING")                        # the loop's side returns at once whatever the Hub does
        seq = st["seq"]
        hub.set_offline(False)
        wait_for(lambda: pod.reporter.status()["seq"] > seq, 60, "a write after the outage")
        assert pod.reporter.status()["unreachable_since"] is None
        assert wait_for(lambda: (record(hub) or {}).get("state") == "SERVING", 10, "the latest state")
    finally:
        pod.reporter.stop()


def test_a_silent_pod_keeps_a_heartbeat_and_its_last_record_says_it_stopped(hub):
    pod = Pod(hub, poll_s=0.2, report_s=1.0)
    pod.reporter.start()
    wait_for(lambda: (record(hub) or {}).get("seq", 0) >= 3, 15, "heartbeats with nothing changing")
    with pod.lock:
        pod.snap["state"] = "STOPPED"
    pod.reporter.stop()
    rec = record(hub)
    assert rec["state"] == "STOPPED" and not fleet.live(rec, time.time())


def test_a_missing_repo_is_an_error_and_a_fleet_with_no_records_is_empty(hub, tmp_path):
    from huggingface_hub import errors

    reader = FleetReader(hub_api(hub), REPO, tmp_path / "cache")
    assert reader.read() == []                          # no fleet branch yet
    with pytest.raises(errors.RepositoryNotFoundError):
        FleetReader(hub_api(hub), "kiln-test/nope", tmp_path / "c2").read()
