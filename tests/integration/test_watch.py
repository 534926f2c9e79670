"""The config watcher (supervisor/reload/watch.py) on its own: it reports candidates, it decides nothing.

The Hub side runs the real huggingface_hub client against kiln_dev/hub/, a local
stand-in for huggingface.co speaking the routes huggingface_hub 2.4 uses (repo info, paths-info,
resolve). The local side is a real directory watched with watchdog (inotify).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from supervisor.reload.candidate import MAX_BYTES
from supervisor.config import WatchSpec
from supervisor.reload.watch import Watcher
from kiln_dev.hub import HubServer, client_env
from kiln_dev.supervised import wait_for

REPO = "kiln-test/deploy"


class Inbox:
    """Takes what the watcher reports, as the lifecycle loop does, and counts wake-ups."""

    def __init__(self) -> None:
        self.woken = threading.Event()
        self.got: list = []
        self.watcher: Watcher | None = None

    def wake(self) -> None:
        self.woken.set()

    def drain(self) -> list:
        assert self.watcher is not None
        while (c := self.watcher.take()) is not None:
            self.got.append(c)
        return self.got


@pytest.fixture
def hub(tmp_path):
    with HubServer(tmp_path / "hub") as server, client_env(server, tmp_path / "home"):
        yield server


# An editor that saves a file in pieces, this far apart: the burst the debounce must absorb.
WRITER_PACE_S = 0.02


def start(spec: WatchSpec, tmp_path: Path, seen: dict | None = None, token: str | None = None) -> tuple[Watcher, Inbox]:
    inbox = Inbox()
    w = Watcher(spec, cache=tmp_path / "cache", token=token, seen=seen or {}, wake=inbox.wake)
    inbox.watcher = w
    w.start()
    return w, inbox


def test_one_small_request_per_interval_and_a_change_is_read_at_its_commit(hub, tmp_path):
    first = hub.seed(REPO, {"deploy.toml": b"# v1\n"})
    w, inbox = start(WatchSpec(repo=REPO, poll_s=0.2), tmp_path, token=hub.token)
    try:
        wait_for(lambda: inbox.drain(), 10, "the first candidate")
        assert inbox.got[0].revision == first and inbox.got[0].data == b"# v1\n"
        hub.reset_counts()
        wait_for(lambda: hub.counts["repo_info"] >= 6, 10, "six polls")
        assert set(hub.counts) == {"repo_info"}               # nothing else while nothing changes
        second = hub.seed(REPO, {"deploy.toml": b"# v2\n"})
        wait_for(lambda: len(inbox.drain()) == 2, 10, "the change")
        c = inbox.got[1]
        assert (c.revision, c.data, c.source, c.origin) == (second, b"# v2\n", "hub", f"hf://{REPO}@main:deploy.toml")
        assert inbox.woken.is_set()
        st = w.status()["hub"]
        assert st["revision"] == second and st["consecutive_errors"] == 0
    finally:
        w.stop()


def test_errors_back_off_and_the_first_success_resets_the_interval(hub, tmp_path):
    hub.seed(REPO, {"deploy.toml": b"# v1\n"})
    hub.fail_next(4, 503, path_prefix="/api/")
    w, inbox = start(WatchSpec(repo=REPO, poll_s=0.1, max_backoff_s=0.4), tmp_path)
    try:
        wait_for(lambda: w.status()["hub"]["interval_s"] == 0.4, 10, "backoff up to max_backoff_s")
        assert w.status()["hub"]["last_error"].startswith("unavailable: HfHubHTTPError") and "503" in w.status()["hub"]["last_error"]
        wait_for(lambda: inbox.drain(), 10, "the candidate once the Hub answers")
        st = w.status()["hub"]
        assert st["interval_s"] == 0.1 and st["consecutive_errors"] == 0 and st["errors"] == 4
    finally:
        w.stop()


def test_an_outage_is_ridden_out_and_a_change_made_during_it_arrives_after(hub, tmp_path):
    hub.seed(REPO, {"deploy.toml": b"# v1\n"})
    w, inbox = start(WatchSpec(repo=REPO, poll_s=0.1, max_backoff_s=0.3), tmp_path)
    try:
        wait_for(lambda: inbox.drain(), 10, "the first candidate")
        hub.set_offline(True)
        wait_for(lambda: w.status()["hub"]["consecutive_errors"] >= 3, 10, "failed polls")
        st = w.status()["hub"]
        assert st["unreachable_since"] and st["last_error"].startswith("offline:")
        later = hub.seed(REPO, {"deploy.toml": b"# during the outage\n"})
        hub.set_offline(False)
        wait_for(lambda: len(inbox.drain()) == 2, 10, "the change after the outage")
        assert inbox.got[1].revision == later and w.status()["hub"]["unreachable_since"] is None
    finally:
        w.stop()


def test_an_oversized_or_missing_file_is_reported_as_an_error_without_downloading_it(hub, tmp_path):
    hub.seed(REPO, {"deploy.toml": b"#" * (MAX_BYTES + 10)})
    w, inbox = start(WatchSpec(repo=REPO, poll_s=0.1), tmp_path)
    try:
        wait_for(lambda: inbox.drain(), 10, "a report")
        assert "at most" in inbox.got[0].error and hub.counts["resolve_get"] == 0
        hub.seed(REPO, {"other.toml": b"x = 1\n"}, branch="empty")
        w2, inbox2 = start(WatchSpec(repo=REPO, branch="empty", path="nope.toml", poll_s=0.1), tmp_path / "2")
        wait_for(lambda: inbox2.drain(), 10, "a report")
        assert "nope.toml is not in" in inbox2.got[0].error
        w2.stop()
    finally:
        w.stop()


def test_a_revision_already_decided_before_a_restart_is_not_reported_again(hub, tmp_path):
    sha = hub.seed(REPO, {"deploy.toml": b"# v1\n"})
    seen = {"hub": {"origin": f"hf://{REPO}@main:deploy.toml", "key": sha}}
    w, inbox = start(WatchSpec(repo=REPO, poll_s=0.1), tmp_path, seen=seen)
    try:
        wait_for(lambda: w.status()["hub"]["polls"] >= 3, 10, "three polls")
        assert inbox.drain() == []
    finally:
        w.stop()


def test_a_canary_commit_is_taken_only_by_the_pod_its_assignment_names(hub, tmp_path):
    import json

    from supervisor.fleet import record as fleet

    main = hub.seed(REPO, {"deploy.toml": b"# v1\n"})
    seen = {"hub": {"origin": f"hf://{REPO}@main:deploy.toml", "key": main}}
    spec = WatchSpec(repo=REPO, poll_s=0.1)
    inboxes = {}
    watchers = []
    for pod in ("pod-1", "pod-2"):
        inbox = Inbox()
        w = Watcher(spec, cache=tmp_path / pod, token=hub.token, seen=seen, wake=inbox.wake, pod=pod)
        inbox.watcher, inboxes[pod] = w, inbox
        watchers.append(w)
        w.start()
    try:
        def assign(pods: list[str], **kv) -> str:
            doc = {**fleet.assignment(pods=pods, branch="main", path="deploy.toml", config_hash="c",
                                      now=time.time(), expires_at=time.time() + 60), **kv}
            return hub.seed(REPO, {"deploy.toml": b"# canary\n", fleet.CANARY_FILE: json.dumps(doc).encode()},
                            branch=fleet.canary_branch("main"))

        sha = assign(["pod-1"])
        got = wait_for(lambda: inboxes["pod-1"].drain(), 10, "the canary candidate")
        assert (got[0].source, got[0].revision, got[0].data) == ("hub-canary", sha, b"# canary\n")
        assert got[0].origin == f"hf://{REPO}@kiln-canary/main:deploy.toml"
        wait_for(lambda: (watchers[1].status()["hub"]["canary"] or {}).get("revision") == sha, 10, "pod-2 looked")
        st = watchers[1].status()["hub"]["canary"]
        assert st["taken"] is False and "not this pod" in st["note"] and inboxes["pod-2"].drain() == []
        # Closed or expired, it is nobody's; main never saw any of it.
        closed = assign(["pod-1"], state="closed", outcome="promoted")
        wait_for(lambda: watchers[0].status()["hub"]["canary"]["revision"] == closed, 10, "the closed one read")
        expired = assign(["pod-1"], expires_at=time.time() - 1)
        wait_for(lambda: watchers[0].status()["hub"]["canary"]["revision"] == expired, 10, "the expired one read")
        assert inboxes["pod-1"].drain() == got and "expired" in watchers[0].status()["hub"]["canary"]["note"]
        assert hub.resolve(REPO) == main
    finally:
        for w in watchers:
            w.stop()


def test_no_canary_branch_is_the_normal_case_and_no_error(hub, tmp_path):
    hub.seed(REPO, {"deploy.toml": b"# v1\n"})
    inbox = Inbox()
    w = Watcher(WatchSpec(repo=REPO, poll_s=0.1), cache=tmp_path / "c", token=hub.token, seen={}, wake=inbox.wake,
                pod="pod-1")
    inbox.watcher = w
    w.start()
    try:
        wait_for(lambda: w.status()["hub"]["polls"] >= 3, 10, "three polls")
        st = w.status()["hub"]
        assert st["errors"] == 0 and st["canary"]["revision"] is None and len(inbox.drain()) == 1
    finally:
        w.stop()


# -- the local directory -------------------------------------------------------------------


def test_a_burst_of_writes_is_debounced_into_one_candidate_with_the_final_content(tmp_path):
    d = tmp_path / "cfg"
    d.mkdir()
    w, inbox = start(WatchSpec(dir=str(d), debounce_s=0.3), tmp_path)
    try:
        wait_for(lambda: w.status()["local"]["checks"] >= 1, 5, "the first look")
        target = d / "deploy.toml"
        with open(target, "w") as f:              # an editor saving in pieces
            for i in range(5):
                f.write(f"# part {i}\n")
                f.flush()
                time.sleep(WRITER_PACE_S)         # the writer's pace, not a wait for the watcher
        wait_for(lambda: inbox.drain(), 5, "the burst's candidate")
        target.write_text("# sentinel\n")      # a later, separate change: anything the burst still
        wait_for(lambda: any(c.data == b"# sentinel\n" for c in inbox.drain()), 5, "the sentinel")
        # ...reported would have come before the sentinel. Exactly one did: the burst's final content.
        assert [c.data for c in inbox.got] == [b"".join(f"# part {i}\n".encode() for i in range(5)),
                                               b"# sentinel\n"]
    finally:
        w.stop()


def test_the_directory_is_watched_when_start_returns(tmp_path):
    # Was: the observer started in the watcher's thread, after the pod's /status already said
    # SERVING; a config published in that gap was read only by the stat check, seconds later.
    d = tmp_path / "cfg"
    d.mkdir()
    w, inbox = start(WatchSpec(dir=str(d), debounce_s=0.05), tmp_path)
    try:
        assert w.status()["local"]["checks"] == 1 and w.status()["local"]["present"] is False
        (d / ".deploy.toml.tmp").write_text("# one\n")
        os.replace(d / ".deploy.toml.tmp", d / "deploy.toml")
        wait_for(lambda: inbox.drain(), 10, "the published file")
        assert [c.data for c in inbox.got] == [b"# one\n"] and w.status()["local"]["events"] >= 1
    finally:
        w.stop()


def test_a_directory_that_cannot_be_watched_is_an_error_on_status_not_a_crash(tmp_path):
    (tmp_path / "a-file").write_text("")
    w, inbox = start(WatchSpec(dir=str(tmp_path / "a-file" / "cfg")), tmp_path)    # its parent is a file
    try:
        err = w.status()["local"]["last_error"]
        assert err.startswith("not watching: NotADirectoryError") and "a-file" in err
        assert inbox.drain() == []
    finally:
        w.stop()


def test_a_file_a_writer_began_before_the_watch_is_read_once_it_is_complete(tmp_path):
    # Was (CI, a loaded machine): the watcher's first look read the first half of a config written
    # in place while the observer was still starting, and the pod rejected it as broken TOML.
    d = tmp_path / "cfg"
    d.mkdir()
    text = '[server]\nport = 8080\nhost = "127.0.0.1"\n'
    half = len(text) // 2                                  # inside the quoted host: not valid TOML
    f = open(d / "deploy.toml", "w")                       # in place, its writer not done
    f.write(text[:half])
    f.flush()
    w, inbox = start(WatchSpec(dir=str(d), debounce_s=0.05), tmp_path)
    try:
        wait_for(lambda: (st := w.status()["local"])["checks"] or st.get("waiting"), 5, "the first look")
        f.write(text[half:])
        f.close()
        wait_for(lambda: inbox.drain(), 10, "the complete file")
        assert [c.data for c in inbox.got] == [text.encode()]
        assert w.status()["local"]["checks"] == 1 and w.status()["local"].get("waiting") is None
    finally:
        f.close()
        w.stop()


def test_atomic_replacements_and_symlink_swaps_are_seen_and_same_content_is_not(tmp_path):
    d = tmp_path / "cfg"
    d.mkdir()
    w, inbox = start(WatchSpec(dir=str(d), path="deploy.toml", debounce_s=0.05), tmp_path)
    try:
        target = d / "deploy.toml"
        (d / ".deploy.toml.tmp").write_text("# one\n")
        os.replace(d / ".deploy.toml.tmp", target)                    # publisher's atomic rename
        wait_for(lambda: len(inbox.drain()) == 1, 5, "the renamed file")
        (d / ".deploy.toml.tmp").write_text("# one\n")
        os.replace(d / ".deploy.toml.tmp", target)                    # same bytes again: not a change
        # Kubernetes-style: the file is a symlink into a data dir that is swapped atomically.
        (d / "v2").mkdir()
        (d / "v2" / "deploy.toml").write_text("# two\n")
        os.symlink("v2", d / "..data_tmp")
        os.replace(d / "..data_tmp", d / "..data")
        target.unlink()
        os.symlink("..data/deploy.toml", target)
        wait_for(lambda: len(inbox.drain()) == 2, 5, "the swapped symlink")
        assert [c.data for c in inbox.got] == [b"# one\n", b"# two\n"]
        assert all(c.source == "local" and c.origin == str(target) for c in inbox.got)
    finally:
        w.stop()


def test_a_missing_directory_is_created_and_watched(tmp_path):
    d = tmp_path / "not-yet" / "cfg"
    w, inbox = start(WatchSpec(dir=str(d), debounce_s=0.05), tmp_path)
    try:
        wait_for(lambda: d.is_dir() and w.status()["local"]["checks"] >= 1, 5, "the directory")
        (d / "deploy.toml").write_text("# hello\n")
        wait_for(lambda: inbox.drain(), 5, "the file")
        assert w.status()["local"]["present"] is True
    finally:
        w.stop()
