"""rollout.wait_healthy's judgment of a worker that leaves the list (issue 37 item 4, held-out review):
a worker RunPod stops after it was ready (its idle timeout, fewer max workers) is no failure of the
release; one that leaves with a failure in its log is. The listings are scripted in the shape of
GET /v2/serverless/{id}/workers (the RunPod stand-in in kiln_dev/runpod serves the same shape; the
releases' end-to-end tests run there: tests/integration/test_endpoint_releases.py)."""

from __future__ import annotations

from typing import Any, Iterator

from images.runpod import rollout


class ScriptedListings:
    """One listing per poll (the last repeats), and each worker's log lines."""

    def __init__(self, listings: list[list[dict[str, Any]]], logs: dict[str, list[str]]):
        self.listings, self.logs, self.polls = listings, logs, 0

    def endpoint_workers(self, eid: str) -> dict[str, Any]:
        listing = self.listings[min(self.polls, len(self.listings) - 1)]
        self.polls += 1
        return {"endpointVersion": 2, "workers": listing}

    def worker_logs(self, eid: str, wid: str, *, tail: int, idle_s: float) -> Iterator[dict[str, Any]]:
        return iter({"line": line} for line in self.logs.get(wid, []))


def w(wid: str, status: str) -> dict[str, Any]:
    return {"id": wid, "status": status, "isStale": False}


def wait(api: ScriptedListings, settle_s: float) -> tuple[rollout.Outcome, list[str]]:
    said: list[str] = []
    out = rollout.wait_healthy(api, {"id": "e1"}, said.append, api_key="k", timeout_s=30, poll_s=0.01,
                               settle_s=settle_s, wake=False)
    return out, said


def test_workers_stopped_idle_after_turning_ready_do_not_fail_the_release() -> None:
    # a and b turn ready; RunPod stops both idle within the window; c turns ready and stays.
    ready_then_gone = [[w("a", "IDLE"), w("b", "IDLE")], [], [w("c", "INITIALIZING")]] + [[w("c", "IDLE")]] * 1
    api = ScriptedListings(ready_then_gone, {"a": ["state SERVING: main"], "b": ["state SERVING: main"]})
    out, said = wait(api, settle_s=0.2)
    assert out.healthy and out.worker == "c", (out, said)
    assert sum("left the list after it was ready" in line for line in said) == 2, said


def test_a_worker_that_leaves_with_a_failure_in_its_log_still_fails_it() -> None:
    crashed = [[w("a", "IDLE"), w("b", "IDLE")], []]
    lines = ["2026-12-05 kiln ERROR state FAILED: crashed: the engine exited with signal 11"]
    api = ScriptedListings(crashed, {"a": lines, "b": lines})
    out, said = wait(api, settle_s=60)
    assert not out.healthy and out.failed == 2, (out, said)


class Releasing(ScriptedListings):
    """The endpoint's version moves from 2 to 3 (someone else's release) after `at` polls: its workers
    carry their version, as GET /v2/serverless/{id}/workers lists them."""

    def __init__(self, listings, at: int):
        super().__init__(listings, {})
        self.at = at

    def endpoint_workers(self, eid: str) -> dict[str, Any]:
        out = super().endpoint_workers(eid)
        return {**out, "endpointVersion": 2 if self.polls <= self.at else 3}

    def endpoint_releases(self, eid: str) -> dict[str, Any]:
        diff = [{"field": "template.imageName", "old": "r/k:ours", "new": "r/k:theirs"}]
        return {"endpointVersion": 3, "rollout": {}, "releases": [
            {"id": "rel_3", "version": 3, "source": "GIT_BUILD", "buildId": "build_9", "createdByUserId": "user_ci",
             "workerCount": 1, "createdAt": "2026-12-05T10:00:00Z", "diff": diff},
            {"id": "rel_2", "version": 2, "source": "MANUAL", "createdByUserId": "user_me", "workerCount": 0,
             "createdAt": "2026-12-05T09:59:00Z", "diff": []}]}


def v(wid: str, status: str, version: int, stale: bool = False) -> dict[str, Any]:
    return {"id": wid, "status": status, "isStale": stale, "version": version}


def test_a_release_made_by_someone_else_during_the_wait_is_never_reported_as_ours() -> None:
    # issue 50 item 3: the wait followed the endpoint's latest release and called CI's worker ours.
    listings = [[v("a", "INITIALIZING", 2)], [v("a", "INITIALIZING", 2, stale=True), v("b", "INITIALIZING", 3)]] \
        + [[v("b", "IDLE", 3)]]
    api = Releasing(listings, at=1)
    out, said = wait(api, settle_s=0.05)
    assert not out.healthy and out.version == 2, (out, said)
    assert [r["version"] for r in out.replaced_by] == [3], out
    assert "v3 (GIT_BUILD build build_9 by user user_ci" in (out.cause or ""), out.cause
    assert not any("b of release" in line or "is healthy" in line for line in said), said


def test_workers_of_another_release_neither_settle_nor_fail_ours() -> None:
    # a worker of version 1 (an old release still draining) turning ready is not ours; ours (2) settles
    listings = [[v("old", "IDLE", 1, stale=True), v("a", "INITIALIZING", 2)]] + [[v("old", "IDLE", 1, stale=True),
                                                                                 v("a", "IDLE", 2)]]
    out, said = wait(ScriptedListings(listings, {}), settle_s=0.05)
    assert out.healthy and out.worker == "a" and out.version == 2, (out, said)
