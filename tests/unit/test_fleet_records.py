"""The fleet's records and canary assignments (supervisor/fleet/record.py): what a record carries from a
pod's /status, when a pod counts as stale, which pods a canary goes to, who takes an assignment."""

from __future__ import annotations

import time

import pytest

from supervisor.fleet import record as fleet
from supervisor.config import WatchSpec
from images.fleet.status import table

NOW = 1_800_000_000.0
WATCH = WatchSpec(repo="kiln-test/deploy", poll_s=0.5, report_s=2.0)


def snap(**kv):
    base = {"version": "0.1", "state": "SERVING", "since": NOW - 5, "ready": True, "uptime_s": 60.0,
            "config": {"hash": "c" * 64, "revision": "r" * 40, "from": "hub", "origin": "o", "since": NOW - 5,
                       "source": "/etc/kiln/deploy.toml"},
            "engine": {"pid": 42, "argv": ["llama-server", "--api-key-file", "/x"]},
            "reload": {"history": [{"t": NOW - i, "outcome": "applied", "source": "hub", "revision": f"{i}" * 40,
                                    "stderr_tail": [f"line {n}" for n in range(30)]} for i in range(8, 0, -1)]},
            "selftest": {"passed": True, "summary": "ok", "decode_tok_s": 57.0, "rung": "cpu", "probes": [1, 2]}}
    base.update(kv)
    return base


def rec(pod="pod-1", **kv):
    r = fleet.build_record(snap(), pod=pod, watch=WATCH, seq=1, now=NOW)
    r.update(kv)
    return r


def test_a_record_carries_what_the_fleet_needs_and_nothing_of_the_engines_command_line():
    r = fleet.build_record(snap(), pod="pod-1", watch=WATCH, seq=3, now=NOW)
    assert (r["pod"], r["state"], r["config"]["revision"], r["seq"], r["reported_at"]) == \
        ("pod-1", "SERVING", "r" * 40, 3, NOW)
    assert r["booted_at"] == NOW - 60 and r["watch"]["report_s"] == 2.0
    assert len(r["reloads"]) == fleet.VERDICTS_KEPT and r["last_reload"]["revision"] == "1" * 40
    assert r["last_reload"]["stderr_tail"] == [f"line {n}" for n in range(18, 30)]      # the last 12
    assert r["selftest"] == {"passed": True, "summary": "ok", "decode_tok_s": 57.0, "rung": "cpu"}
    assert "engine" not in r and "argv" not in str(r) and "source" not in r["config"]


def test_a_pod_is_stale_after_three_of_its_heartbeats_and_a_stopped_one_is_not_live():
    r = rec()
    assert not fleet.is_stale(r, NOW + 5.9) and fleet.is_stale(r, NOW + 6.1)
    assert fleet.live(r, NOW + 1) and not fleet.live(rec(state="STOPPED"), NOW + 1)
    assert fleet.is_stale({"pod": "x"}, NOW)                        # never reported a time


def test_canaries_are_the_first_live_serving_pods_by_id():
    records = [rec("pod-3"), rec("pod-1", state="RELOADING"), rec("pod-2"), rec("pod-0", reported_at=NOW - 100)]
    assert fleet.choose_canaries(records, 1, NOW + 1) == ["pod-2"]
    assert fleet.choose_canaries(records, 5, NOW + 1) == ["pod-2", "pod-3"]


def test_a_verdict_is_found_by_revision_and_source():
    r = rec()
    r["reloads"].append({"revision": "x" * 40, "source": "hub-canary", "outcome": "rolled_back"})
    assert fleet.verdict_for(r, "x" * 40, "hub-canary")["outcome"] == "rolled_back"
    assert fleet.verdict_for(r, "x" * 40, "hub") is None and fleet.verdict_for(r, "y" * 40) is None


@pytest.mark.parametrize("change,why", [
    ({}, None),
    ({"pods": ["pod-2"]}, "not this pod"),
    ({"state": "closed", "outcome": "promoted"}, "the rollout is over (promoted)"),
    ({"expires_at": NOW - 1}, "expired"),
    ({"path": "other.toml"}, "this pod watches 'deploy.toml'"),
    ({"kiln_canary": 99}, "is not a Kiln canary assignment"),
])
def test_only_a_named_pod_takes_an_open_unexpired_assignment_for_its_path(change, why):
    doc = {**fleet.assignment(pods=["pod-1"], branch="main", path="deploy.toml", config_hash="c", now=NOW,
                              expires_at=NOW + 60), **change}
    got = fleet.assigned(doc, pod="pod-1", path="deploy.toml", now=NOW + 1)
    assert got is None if why is None else why in got


@pytest.mark.parametrize("raw,want", [("abc123", "abc123"), ("my host/../x", "my-host-..-x"), ("", None),
                                      ("-lead", "lead"), ("_x", "p_x")])
def test_the_pod_id_is_runpods_or_the_hostnames_made_safe_for_a_file_name(raw, want):
    got = fleet.pod_id({"RUNPOD_POD_ID": raw})
    assert fleet.POD_ID.fullmatch(got) and "/" not in got
    if want is not None:
        assert got == want


def test_the_table_lists_every_pod_and_marks_the_silent_one_stale():
    now = time.time()
    records = [rec("pod-2", reported_at=now - 1), rec("pod-1", reported_at=now - 30)]
    out = table(records, now).splitlines()
    assert out[0].split()[:4] == ["POD", "STATE", "REVISION", "CONFIG"]
    assert out[1].startswith("pod-1") and "STALE (SERVING)" in out[1] and "30s ago" in out[1]
    assert out[2].startswith("pod-2") and "STALE" not in out[2] and ("r" * 12) in out[2]


def test_heartbeats_that_outrun_the_hubs_commit_limit_are_named_with_the_report_s_that_fits():
    """128 commits an hour (the Hub's 429): heartbeats may take half. 10 pods at the default 600 s
    commit 60 an hour; 11 commit 66, and 3600 * 11 / 64 = 618.75 s would bring them back."""
    w600 = {"repo": "kiln-test/deploy", "branch": "main", "path": "deploy.toml", "poll_s": 30.0, "report_s": 600.0}
    ten = [rec(pod=f"pod-{i}", watch=w600) for i in range(10)]
    assert fleet.heartbeat_commits_per_hour(ten, NOW) == pytest.approx(60.0)
    assert fleet.commit_budget_warning(ten, NOW) is None
    eleven = ten + [rec(pod="pod-10", watch=w600)]
    line = fleet.commit_budget_warning(eleven, NOW)
    assert line and "11 live pod(s)" in line and "~66" in line and "report_s >= 619" in line
    # stale and stopped pods commit nothing
    gone = eleven[:10] + [rec(pod="pod-10", watch=w600, reported_at=NOW - 10_000)]
    assert fleet.commit_budget_warning(gone, NOW) is None
    stopped = eleven[:10] + [rec(pod="pod-10", watch=w600, state="STOPPED")]
    assert fleet.commit_budget_warning(stopped, NOW) is None
    # one pod with a fast heartbeat is enough
    fast = [rec(pod="solo", watch={**w600, "report_s": 30.0})]
    assert "report_s >= 57" in fleet.commit_budget_warning(fast, NOW)
