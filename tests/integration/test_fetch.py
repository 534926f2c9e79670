"""Model fetch into the volume's cache (supervisor/fetch.py), with the real huggingface_hub client in
a real child process, against kiln_dev/hub/: a local stand-in for huggingface.co that
speaks the HTTP routes huggingface_hub 2.4 uses (repo info, tree, resolve with Range). Where a
test needs more than the stand-in's knobs: a real tmpfs stands for a small disk, a TCP relay
(kiln_dev/throttle.py) for a slow link, and a socket that accepts and never answers for a
wedged proxy.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from supervisor import fetch
from supervisor.config import parse_config
from supervisor.errors import FetchError
from kiln_dev.hub import HubServer, client_env

REPO = "kiln-test/model"


def cfg_for(state: Path, *, revision: str | None = None, entry: str = "q4/*.gguf", allow: str = '["q4/*"]',
            stall: float = 30.0):
    rev = f'revision = "{revision}"\n' if revision else ""
    return parse_config(f"""
state_dir = "{state}"
[model]
source = "hf://{REPO}"
{rev}entry = "{entry}"
allow_patterns = {allow}
fetch_stall_s = {stall}
[ladder]
[[ladder.rungs]]
name = "a"
""", env={})


def run_fetch(cfg, *, stop=lambda: False, report=lambda e: None):
    return fetch.fetch(cfg, dict(os.environ), token=os.environ.get("HF_TOKEN"), should_stop=stop,
                       sleep=time.sleep, report=report)


def no_fetch_children() -> bool:
    return not [p for p in psutil.Process().children(recursive=True) if "supervisor.fetch" in " ".join(p.cmdline())]


@pytest.fixture
def hub(tmp_path):
    with HubServer(tmp_path / "hub") as server, client_env(server, tmp_path / "home"):
        yield server


@pytest.fixture
def quants(hub):
    data = {"q4/model-q4.gguf": os.urandom(2_500_000), "q8/model-q8.gguf": os.urandom(4_000_000),
            "README.md": b"two quants"}
    commit = hub.seed(REPO, data)
    return data, commit


def gets(hub) -> list[tuple[str, str | None]]:
    return [(r.path, r.range) for r in hub.log if r.route == "resolve_get"]


def test_a_pinned_revision_with_allow_patterns_fetches_one_quant_only(hub, quants, tmp_path):
    data, commit = quants
    hub.seed(REPO, {"q4/model-q4.gguf": b"a newer upload"})          # main moves on; the pin does not
    res = run_fetch(cfg_for(tmp_path / "state", revision=commit))
    assert res.commit == commit and not res.from_cache
    assert res.path.read_bytes() == data["q4/model-q4.gguf"]
    assert [p for p, _ in gets(hub)] == [f"/{REPO}/resolve/{commit}/q4/model-q4.gguf"]     # not q8, not README
    hub.reset_counts()
    assert run_fetch(cfg_for(tmp_path / "state", revision=commit)).path == res.path        # cached: no download
    assert gets(hub) == []


def test_a_cut_transfer_resumes_with_a_range_request(hub, quants, tmp_path):
    data, commit = quants
    hub.truncate_next_download(1_600_000)        # the connection drops after 1.6 MB
    res = run_fetch(cfg_for(tmp_path / "state"))
    assert res.path.read_bytes() == data["q4/model-q4.gguf"]
    ranges = [r for _, r in gets(hub)]
    assert ranges[0] is None and ranges[1] == "bytes=1048576-"        # kept what arrived, asked for the rest


def test_a_partial_left_by_an_interrupted_attempt_resumes_where_it_stopped(hub, quants, tmp_path):
    """What a killed process or a restarted container leaves behind: the first MiB in the partial."""
    data, commit = quants
    body = data["q4/model-q4.gguf"]
    oid = hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()
    part = tmp_path / "state/hf/models--kiln-test--model/blobs" / f"{oid}.incomplete"
    part.parent.mkdir(parents=True)
    part.write_bytes(body[:1_048_576])
    events: list[dict] = []
    res = run_fetch(cfg_for(tmp_path / "state"), report=events.append)
    assert res.path.read_bytes() == body and not part.exists()
    assert gets(hub) == [(f"/{REPO}/resolve/{commit}/q4/model-q4.gguf", "bytes=1048576-")]
    plan = next(e for e in events if e["event"] == "plan")
    assert plan["need"] == len(body) - 1_048_576          # the preflight counted what is already here


def test_a_partial_that_is_not_this_file_is_caught_by_the_hash_and_dropped(hub, quants, tmp_path):
    data, commit = quants
    body = data["q4/model-q4.gguf"]
    oid = hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()
    part = tmp_path / "state/hf/models--kiln-test--model/blobs" / f"{oid}.incomplete"
    part.parent.mkdir(parents=True)
    part.write_bytes(os.urandom(1_048_576))                # garbage where the first MiB should be
    with pytest.raises(FetchError, match="do not match the Hub's git oid"):
        run_fetch(cfg_for(tmp_path / "state"))
    assert not part.exists()                               # never resumed from again
    assert run_fetch(cfg_for(tmp_path / "state")).path.read_bytes() == body


@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MiB tmpfs for the cache (the machines here and CI run as root)."""
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "kiln-small-disk", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); test_disk_preflight_in_process covers it")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_disk_that_is_too_small_is_refused_before_any_byte_is_downloaded(hub, quants, small_disk):
    with pytest.raises(FetchError) as e:
        run_fetch(cfg_for(small_disk / "state"))
    msg = str(e.value)
    assert "not enough disk" in msg and "2.5 MB still to download" in msg and "free at" in msg, msg
    assert "nothing was downloaded" in msg
    assert gets(hub) == []                                 # not one byte of the model was asked for
    assert not list((small_disk / "state/hf").rglob("*.incomplete"))


def test_disk_preflight_in_process(hub, quants, tmp_path):
    """The same refusal through the child's free-space seam (for hosts where tmpfs cannot be mounted)."""
    events: list[tuple[str, dict]] = []
    child = fetch._Child(REPO, "main", tmp_path / "hf", ["q4/*"], "q4/*.gguf", None,
                         lambda ev, **kv: events.append((ev, kv)), free=lambda p: 100_000)
    assert child.run() == fetch.EXIT_ERROR
    assert events[-1][0] == "error" and events[-1][1]["kind"] == "disk"
    assert gets(hub) == []


def test_unreachable_or_rate_limited_hub_uses_the_complete_cached_model(hub, quants, tmp_path):
    data, commit = quants
    cfg = cfg_for(tmp_path / "state")
    first = run_fetch(cfg)
    hub.fail_next(3, 429)                                  # rate limited (llama.cpp#21677 blocks here)
    res = run_fetch(cfg)
    assert res.from_cache and res.path == first.path and "unavailable" in res.note and "429" in res.note
    hub.set_offline(True)                                  # no network at all
    res = run_fetch(cfg)
    assert res.from_cache and res.path.read_bytes() == data["q4/model-q4.gguf"]
    assert "unreachable" in res.note and commit[:12] in res.note


def test_nothing_cached_and_no_hub_fails_after_the_stall_deadline(hub, quants, tmp_path):
    hub.set_offline(True)
    t0 = time.monotonic()
    with pytest.raises(FetchError, match="no complete copy is cached"):
        run_fetch(cfg_for(tmp_path / "state", stall=2))
    assert time.monotonic() - t0 < 15
    assert no_fetch_children()


def test_a_changed_etag_never_deletes_the_good_cache(hub, quants, tmp_path):
    """llama.cpp#20005 deletes a cached model when the ETag changes: here the old blob stays, and if
    the new revision cannot be fetched the old complete one still serves."""
    data, first_commit = quants
    cfg = cfg_for(tmp_path / "state")
    old = run_fetch(cfg)
    old_blob = old.path.resolve()
    hub.seed(REPO, {"q4/model-q4.gguf": os.urandom(2_000_000)})      # same name, new content, new ETag
    hub.fail_next(1, 503, path_prefix=f"/{REPO}/resolve/")           # and its download fails
    res = run_fetch(cfg)
    assert res.from_cache and res.commit == first_commit and res.path.read_bytes() == data["q4/model-q4.gguf"]
    assert old_blob.is_file()
    new = run_fetch(cfg)                                              # the Hub is back
    assert new.commit != first_commit and not new.from_cache
    assert old_blob.is_file() and old_blob.read_bytes() == data["q4/model-q4.gguf"]    # still there


def test_a_silent_hub_is_stopped_by_the_stall_deadline(tmp_path):
    """A socket that accepts and never answers: a wedged proxy. Nothing moves, so the fetch ends."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: [accepted.append(hole.accept()[0]) for _ in range(8)], daemon=True).start()
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{hole.getsockname()[1]}"}
    t0 = time.monotonic()
    with pytest.raises(FetchError, match="moved no byte for 1.5 s"):
        fetch.fetch(cfg_for(tmp_path / "state", stall=1.5), env, token=None, should_stop=lambda: False,
                    sleep=time.sleep)
    assert time.monotonic() - t0 < 8
    assert no_fetch_children()
    hole.close()


def test_a_stop_request_ends_the_fetch_at_once(hub, quants, tmp_path):
    hub.set_offline(True)
    asked = time.monotonic() + 0.5
    t0 = time.monotonic()
    with pytest.raises(fetch.Cancelled):
        run_fetch(cfg_for(tmp_path / "state"), stop=lambda: time.monotonic() > asked)
    assert time.monotonic() - t0 < 4
    assert no_fetch_children()


def test_an_entry_that_matches_nothing_is_refused_before_downloading(hub, quants, tmp_path):
    with pytest.raises(FetchError, match="matches 0 of the files"):
        run_fetch(cfg_for(tmp_path / "state", entry="q5/*.gguf"))
    assert gets(hub) == []
