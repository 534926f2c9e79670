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
