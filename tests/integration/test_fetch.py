"""Model fetch into the volume's cache (supervisor/model/fetch/), with the real huggingface_hub client in a
real child process, against kiln_dev/hub/: a local stand-in for huggingface.co (and its
CDN) that speaks the HTTP routes huggingface_hub 2.4 uses (repo info, tree, resolve with its
redirect to the CDN, Range). Where a test needs more than the stand-in's knobs: a real tmpfs stands
for a small disk, a TCP relay (kiln_dev/throttle.py) for a link capped per connection, and a
socket that accepts and never answers for a wedged proxy. The Xet path is in test_fetch_xet.py.

Most tests fetch with small segments (model.fetch_segment_mib = 1) and a few connections, so a few
MB of test data exercise the same segment, journal and verifier paths as a 181 GiB model.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import certifi
import psutil
import pytest

from supervisor.model.fetch import parent
from supervisor.config import parse_config
from supervisor.errors import Cancelled, FetchError
from supervisor.model.fetch import child as fetch_child
from kiln_dev.hub import HubServer, client_env
from kiln_dev.supervised import wait_for
from kiln_dev.throttle import Throttle
from kiln_dev.tmpfs import small_tmpfs

REPO = "kiln-test/model"
MIB = 1 << 20
BODY_ROUTES = ("resolve_get", "cdn_get", "xorb_get")


def cfg_for(state: Path, *, revision: str | None = None, entry: str = "q4/*.gguf", allow: str = '["q4/*"]',
            stall: float = 30.0, connections: int = 4, segment_mib: int = 1):
    rev = f'revision = "{revision}"\n' if revision else ""
    return parse_config(f"""
state_dir = "{state}"
[model]
source = "hf://{REPO}"
{rev}entry = "{entry}"
allow_patterns = {allow}
fetch_stall_s = {stall}
fetch_connections = {connections}
fetch_segment_mib = {segment_mib}
[ladder]
[[ladder.rungs]]
name = "a"
""", env={})


def run_fetch(cfg, *, env=None, stop=lambda: False, report=lambda e: None):
    return parent.fetch(cfg, dict(os.environ) if env is None else env, token=os.environ.get("HF_TOKEN"),
                        should_stop=stop, sleep=time.sleep, report=report)


def fetch_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "supervisor.model.fetch" in " ".join(p.cmdline())]


def served(hub: HubServer) -> int:
    """Body bytes the stand-in sent for file content, by any route: what the downloads cost."""
    return sum(hub.bytes_served[r] for r in BODY_ROUTES)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blobs_dir(state: Path) -> Path:
    return state / "hf/models--kiln-test--model/blobs"


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


@pytest.fixture
def shards(hub):
    """A multi-shard LFS repo as the Hub serves it (CDN redirects); one shard larger than the segment."""
    data = {f"q4/model-0000{i}-of-00003.gguf": os.urandom(n) for i, n in ((1, 5_500_000), (2, 700_000),
                                                                          (3, 1_300_000))}
    hub.seed(REPO, data, storage="lfs")
    commit = hub.seed(REPO, {"q4/config.json": b'{"shards": 3}'})
    return {**data, "q4/config.json": b'{"shards": 3}'}, commit


def gets(hub) -> list[tuple[str, str | None]]:
    return [(r.path, r.range) for r in hub.log if r.route in BODY_ROUTES]


def test_a_pinned_revision_with_allow_patterns_fetches_one_quant_only(hub, quants, tmp_path):
    data, commit = quants
    hub.seed(REPO, {"q4/model-q4.gguf": b"a newer upload"})          # main moves on; the pin does not
    res = run_fetch(cfg_for(tmp_path / "state", revision=commit))
    assert res.commit == commit and not res.from_cache
    assert res.path.read_bytes() == data["q4/model-q4.gguf"]
    assert {p for p, _ in gets(hub)} == {f"/{REPO}/resolve/{commit}/q4/model-q4.gguf"}     # not q8, not README
    assert served(hub) == len(data["q4/model-q4.gguf"])
    hub.reset_counts()
    assert run_fetch(cfg_for(tmp_path / "state", revision=commit)).path == res.path        # cached: no download
    assert gets(hub) == []


def test_a_multi_shard_repo_downloads_side_by_side_and_in_ranges_into_the_hub_cache_layout(hub, shards, tmp_path):
    data, commit = shards
    state = tmp_path / "state"
    events: list[dict] = []
    with Throttle(int(hub.url.rsplit(":", 1)[1]), bytes_per_s=2_000_000) as slow:
        res = run_fetch(cfg_for(state, entry="q4/model-00001-*.gguf"), env={**os.environ, "HF_ENDPOINT": slow.url},
                        report=events.append)
    snap = state / f"hf/models--kiln-test--model/snapshots/{commit}"
    assert res.snapshot == snap and res.path == snap / "q4/model-00001-of-00003.gguf"
    for rel, body in data.items():
        assert (snap / rel).read_bytes() == body and (snap / rel).is_symlink()
    assert (state / "hf/models--kiln-test--model/refs/main").read_text() == commit
    blobs = sorted(p.name for p in blobs_dir(state).iterdir())
    lfs = {sha256(b) for rel, b in data.items() if rel.endswith(".gguf")}
    assert lfs <= set(blobs) and len(blobs) == 4                   # LFS blobs by sha256, the config by git oid
    assert served(hub) == sum(map(len, data.values()))              # every byte exactly once
    big = [r for p, r in gets(hub) if p == f"/cdn/{sha256(data['q4/model-00001-of-00003.gguf'])}"]
    assert len(big) == 6 and all(r and r.startswith("bytes=") for r in big)     # 5.5 MB in 1 MiB ranges
    assert max(e.get("active", 0) for e in events if e["event"] == "progress") >= 2   # in parallel
    assert hub.counts["resolve_head"] == 4                          # one location per file, not per range
    plan = next(e for e in events if e["event"] == "plan")
    assert (plan["connections"], plan["segment"]) == (4, MIB)


def test_a_cut_connection_resumes_mid_segment_where_its_last_chunk_landed(hub, quants, tmp_path):
    data, commit = quants
    cut = 2 * fetch_child.CHUNK
    hub.truncate_next_download(cut)          # the first connection to send a body drops after two chunks
    res = run_fetch(cfg_for(tmp_path / "state"))
    assert res.path.read_bytes() == data["q4/model-q4.gguf"]
    ranges = [r for _, r in gets(hub)]
    starts = range(0, len(data["q4/model-q4.gguf"]), MIB)
    assert any(f"bytes={s + cut}-" in r for s in starts for r in ranges), ranges    # a segment resumed mid-way
    assert served(hub) == len(data["q4/model-q4.gguf"])             # not one byte fetched twice


def _journal(state: Path, blob: str, size: int, seg: int, done: dict[int, bytes]) -> Path:
    """What an interrupted attempt leaves: the sparse partial and its journal of finished segments."""
    part = blobs_dir(state) / f"{blob}.incomplete"
    part.parent.mkdir(parents=True, exist_ok=True)
    with part.open("wb") as f:
        f.truncate(size)
        for i, chunk in done.items():
            f.seek(i * seg)
            f.write(chunk)
    lines = [f"kiln-journal 1 {blob} {size} {seg}"] + [f"{i} {zlib.crc32(c):08x}" for i, c in done.items()]
    (part.parent / f"{blob}.incomplete.journal").write_text("\n".join(lines) + "\n")
    return part


def git_oid(body: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()


def test_what_an_interrupted_attempt_finished_is_not_fetched_again(hub, quants, tmp_path):
    """A killed process or a restarted container leaves the partial and its journal: segments 0 and 2 done."""
    data, commit = quants
    body = data["q4/model-q4.gguf"]
    state = tmp_path / "state"
    part = _journal(state, git_oid(body), len(body), MIB, {0: body[:MIB], 2: body[2 * MIB:]})
    events: list[dict] = []
    res = run_fetch(cfg_for(state), report=events.append)
    assert res.path.read_bytes() == body and not part.exists() and not list(blobs_dir(state).glob("*.journal"))
    assert [r for _, r in gets(hub)] == [f"bytes={MIB}-{2 * MIB - 1}"]           # only segment 1
    plan = next(e for e in events if e["event"] == "plan")
    assert plan["need"] == MIB                                       # the preflight counted what is here
    assert any(e.get("verified") == len(body) for e in events)       # the kept segments were re-read and hashed


def test_a_corrupted_segment_on_disk_is_detected_and_only_it_is_fetched_again(hub, quants, tmp_path):
    """Regression guard for a partial that rotted (or was written over) while the pod was down:
    the journal says all three segments finished, the disk disagrees about segment 1."""
    data, commit = quants
    body = data["q4/model-q4.gguf"]
    state = tmp_path / "state"
    bad = bytearray(body[MIB:2 * MIB])
    bad[1234] ^= 0x01
    part = _journal(state, git_oid(body), len(body), MIB, {0: body[:MIB], 1: bytes(bad), 2: body[2 * MIB:]})
    with part.open("r+b") as f:                                      # the journal recorded the good CRC...
        f.seek(MIB)
        f.write(bad)
    journal = part.parent / f"{part.name}.journal"
    journal.write_text(journal.read_text().replace(f"1 {zlib.crc32(bytes(bad)):08x}",
                                                   f"1 {zlib.crc32(body[MIB:2 * MIB]):08x}"))
    res = run_fetch(cfg_for(state))                                  # ... the disk holds one flipped bit
    assert res.path.read_bytes() == body
    assert [r for _, r in gets(hub)] == [f"bytes={MIB}-{2 * MIB - 1}"] and served(hub) == MIB


def test_bytes_that_arrive_wrong_are_caught_by_the_hash_and_the_file_alone_is_fetched_again(hub, shards, tmp_path):
    data, commit = shards
    hub.corrupt_next_download(at=5)          # one wrong byte on the wire, in some range of some file
    events: list[dict] = []
    res = run_fetch(cfg_for(tmp_path / "state", entry="q4/model-00001-*.gguf"), report=events.append)
    for rel, body in data.items():
        assert (res.snapshot / rel).read_bytes() == body
    notes = [e["why"] for e in events if e["event"] == "retry"]
    assert any("do not match the Hub's" in n and "fetching it again" in n for n in notes), notes
    (bad,) = [rel for rel in data if rel in " ".join(notes)]          # the note names the file
    assert served(hub) == sum(map(len, data.values())) + len(data[bad])     # that file twice, the rest once


def test_a_file_that_arrives_wrong_twice_fails_naming_it_and_its_bytes_are_dropped(hub, shards, tmp_path):
    data, commit = shards
    for _ in range(100):
        hub.corrupt_next_download(at=0)      # every body starts with a wrong byte
    with pytest.raises(FetchError, match=r"(q4/\S+): the downloaded bytes do not match the Hub's (sha256|git oid) "
                                         r".* fetched twice, both wrong") as e:
        run_fetch(cfg_for(tmp_path / "state", entry="q4/model-00001-*.gguf"))
    (name,) = [rel for rel in data if f"{rel}: the downloaded bytes" in str(e.value)]
    blob = sha256(data[name]) if name.endswith(".gguf") else git_oid(data[name])
    assert not (blobs_dir(tmp_path / "state") / f"{blob}.incomplete").exists()   # nothing wrong to resume from
    assert not (blobs_dir(tmp_path / "state") / blob).exists()


def test_a_hub_outage_mid_download_is_ridden_out_and_the_download_resumes(hub, shards, tmp_path):
    data, commit = shards
    total = sum(map(len, data.values()))
    events: list[dict] = []
    done = threading.Event()
    out: list = []
    with Throttle(int(hub.url.rsplit(":", 1)[1]), bytes_per_s=1_000_000) as slow:
        cfg = cfg_for(tmp_path / "state", entry="q4/model-00001-*.gguf", stall=60)
        t = threading.Thread(target=lambda: (out.append(run_fetch(cfg, env={**os.environ, "HF_ENDPOINT": slow.url},
                                                                  report=events.append)), done.set()))
        t.start()
        wait_for(lambda: served(hub) >= total // 3, 30, "a third of the bytes")
        hub.set_offline(True)                                        # the Hub and its CDN go away
        wait_for(lambda: any(e["event"] == "retry" for e in events), 30, "the fetch to notice")
        hub.set_offline(False)
        t.join(60)
    assert done.is_set() and out, "the fetch did not finish after the Hub came back"
    for rel, body in data.items():
        assert (out[0].snapshot / rel).read_bytes() == body
    assert out[0].attempts == 1                                      # ridden out in the same child
    assert total <= served(hub) <= total + 4 * MIB                   # at most the ranges in flight again


def test_a_cdn_url_that_expires_mid_download_is_resolved_again(hub, shards, tmp_path):
    data, commit = shards
    hub.cdn_ttl_s = 1.0
    with Throttle(int(hub.url.rsplit(":", 1)[1]), bytes_per_s=1_000_000) as slow:
        res = run_fetch(cfg_for(tmp_path / "state", entry="q4/model-00001-*.gguf"),
                        env={**os.environ, "HF_ENDPOINT": slow.url})
    assert res.path.read_bytes() == data["q4/model-00001-of-00003.gguf"]
    assert any(r.route == "cdn_get" and r.status == 403 for r in hub.log)
    assert hub.counts["resolve_head"] > 4                            # asked again where the file is


def start_child(state: Path, env: dict[str, str], *, entry: str = "q4/*.gguf", connections: int,
                segment_mib: int = 1) -> subprocess.Popen:
    """The fetch child on its own (what the supervisor runs), to be killed by a test."""
    argv = [sys.executable, "-m", "supervisor.model.fetch", "--repo", REPO, "--cache", str(state / "hf"),
            "--entry", entry, "--allow", "q4/*", "--connections", str(connections), "--segment-mib", str(segment_mib)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=Path(parent.__file__).parents[2])


def finished_segments(journal: Path) -> set[int]:
    """The segments a journal records as finished (and not dropped since)."""
    try:
        lines = journal.read_text().splitlines()[1:]
    except OSError:
        return set()
    done: set[int] = set()
    for line in lines:
        (done.discard(int(line[1:])) if line.startswith("-") else done.add(int(line.split()[0])))
    return done


def test_sigkill_at_three_points_then_a_restart_downloads_at_most_the_segments_in_flight(hub, tmp_path):
    size, conns = 12 * MIB + 12345, 3
    body = os.urandom(size)
    hub.seed(REPO, {"q4/big.gguf": body}, storage="lfs")
    state = tmp_path / "state"
    journal = blobs_dir(state) / f"{sha256(body)}.incomplete.journal"
    with Throttle(int(hub.url.rsplit(":", 1)[1]), bytes_per_s=1_000_000) as slow:
        env = parent.child_env({**os.environ, "HF_ENDPOINT": slow.url}, hub.token)
        # 1: before any segment finished; 2: with a third done; 3: with two thirds done.
        for point in (lambda: served(hub) > MIB // 2, lambda: len(finished_segments(journal)) >= 4,
                      lambda: len(finished_segments(journal)) >= 9):
            proc = start_child(state, env, connections=conns)
            wait_for(point, 60, "the kill point")
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
    kept, before = len(finished_segments(journal)), served(hub)
    assert 9 <= kept < 13
    res = run_fetch(cfg_for(state, connections=conns, segment_mib=1))
    assert res.path.read_bytes() == body and not journal.exists()
    assert served(hub) - before <= size - (kept - 1) * MIB           # the restart: only what was missing
    assert size <= served(hub) <= size + 3 * conns * MIB             # in all: the file + the segments in flight


@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MiB tmpfs for the cache (the machines here and CI run as root)."""
    with small_tmpfs(tmp_path / "small-disk", "1m", why_skip="test_disk_preflight_in_process covers it") as mnt:
        yield mnt


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
    child = fetch_child.Child(REPO, "main", tmp_path / "hf", ["q4/*"], "q4/*.gguf", None,
                              lambda ev, **kv: events.append((ev, kv)), free=lambda p: 100_000)
    assert child.run() == fetch_child.EXIT_ERROR
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
    assert not fetch_children()


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

    def hold() -> None:
        try:
            for _ in range(8):
                accepted.append(hole.accept()[0])
        except OSError:                 # the test closed the socket: nothing more to hold
            pass

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{hole.getsockname()[1]}"}
    t0 = time.monotonic()
    with pytest.raises(FetchError, match="moved no byte for 1.5 s"):
        parent.fetch(cfg_for(tmp_path / "state", stall=1.5), env, token=None, should_stop=lambda: False,
                     sleep=time.sleep)
    assert time.monotonic() - t0 < 8
    assert not fetch_children()
    hole.shutdown(socket.SHUT_RDWR)     # wakes the holder's accept (Linux), then the socket goes
    hole.close()
    holder.join(5)
    for c in accepted:
        c.close()


def test_a_stop_request_ends_the_fetch_at_once(hub, quants, tmp_path):
    hub.set_offline(True)
    asked = time.monotonic() + 0.5
    t0 = time.monotonic()
    with pytest.raises(Cancelled):
        run_fetch(cfg_for(tmp_path / "state"), stop=lambda: time.monotonic() > asked)
    assert time.monotonic() - t0 < 4
    assert not fetch_children()


def test_an_entry_that_matches_nothing_is_refused_before_downloading(hub, quants, tmp_path):
    with pytest.raises(FetchError, match="matches 0 of the files"):
        run_fetch(cfg_for(tmp_path / "state", entry="q5/*.gguf"))
    assert gets(hub) == []


def test_the_fetch_child_never_sees_the_engine_key_or_the_runpod_key(hub, shards, tmp_path):
    """Regression test for issue 18 item 6: the child inherited KILN_API_KEY with the whole environment."""
    secrets = {"KILN_API_KEY": "kiln-engine-key-not-for-the-child", "RUNPOD_API_KEY": "rpa_not_for_the_child",
               "AWS_SECRET_ACCESS_KEY": "unrelated-secret"}
    seen: list[dict[str, str]] = []
    with Throttle(int(hub.url.rsplit(":", 1)[1]), bytes_per_s=1_000_000) as slow:
        env = {**os.environ, **secrets, "HF_ENDPOINT": slow.url, "NO_PROXY": "127.0.0.1,localhost",
               "SSL_CERT_FILE": certifi.where()}

        def look(ev: dict) -> None:
            if ev["event"] == "progress" and not seen:
                seen.extend(p.environ() for p in fetch_children())
        run_fetch(cfg_for(tmp_path / "state", entry="q4/model-00001-*.gguf"), env=env, report=look)
    assert seen, "the child was not caught running"
    child_env = seen[0]
    assert not set(secrets) & set(child_env)
    assert child_env["HF_TOKEN"] == hub.token and child_env["HF_ENDPOINT"] == slow.url
    assert child_env["SSL_CERT_FILE"] == certifi.where() and child_env["NO_PROXY"] == "127.0.0.1,localhost"
    assert "PATH" in child_env and "HUGGING_FACE_HUB_TOKEN" not in child_env


def test_a_file_over_50_gb_has_no_ceiling(hub, tmp_path):
    """huggingface_hub's http_get refuses a file over 50e9 bytes from byte 0 (MAX_HTTP_DOWNLOAD_SIZE);
    a segment is never that large. A sparse 60 GB file on the stand-in: planned, refused by the disk
    preflight with the real number, and its last segment (past byte 50e9) fetched for real."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import http_get

    from supervisor.model.fetch import plan
    from supervisor.model.fetch.hashing import Meter
    from supervisor.model.fetch.http_source import HttpSource
    from supervisor.model.fetch.sink import Sink

    size = 60 * 10**9
    assert size > constants.MAX_HTTP_DOWNLOAD_SIZE
    commit = hub.seed_sparse(REPO, "q4/huge.gguf", size)
    with pytest.raises(ValueError, match="too large"):              # the library's own path, for the record
        http_get(f"{hub.url}/{REPO}/resolve/{commit}/q4/huge.gguf", open(os.devnull, "wb"), expected_size=size)
    events: list[tuple[str, dict]] = []                              # the preflight (a disk 10 GB free)
    child = fetch_child.Child(REPO, "main", tmp_path / "hf", ["q4/*"], "q4/huge.gguf", None,
                              lambda ev, **kv: events.append((ev, kv)), free=lambda p: 10 * 10**9)
    assert child.run() == fetch_child.EXIT_ERROR
    assert events[-1][0] == "error" and "60.0 GB still to download" in events[-1][1]["message"]
    assert events[0][1]["segment"] == plan.MAX_SEGMENT and hub.bytes_served["cdn_get"] == 0
    _, files = plan.list_files(__import__("huggingface_hub").HfApi(), REPO, commit)
    (item,) = plan.select(files, ["q4/*"], "q4/huge.gguf", REPO, commit)
    seg = plan.segment_size(item.size, 32)
    spans = plan.segments(item.size, seg)
    assert seg == plan.MAX_SEGMENT and len(spans) == -(-size // seg) and spans[-1][1] == size
    part = tmp_path / "huge.incomplete"
    fd = os.open(part, os.O_RDWR | os.O_CREAT)
    try:
        os.ftruncate(fd, size)
        sink = Sink(fd, *spans[-1], Meter())
        HttpSource(REPO, item.path, commit, hub.token).fetch(sink)
        assert sink.full and sink.crc == __import__("zlib").crc32(bytes(spans[-1][1] - spans[-1][0]))
    finally:
        os.close(fd)
    assert hub.bytes_served["cdn_get"] == spans[-1][1] - spans[-1][0]     # one segment moved, not 60 GB
    assert part.stat().st_blocks * 512 < 2 * seg                         # and it landed in place, sparse


def test_the_same_content_under_two_names_is_downloaded_once_and_linked_twice(hub, tmp_path):
    """Regression guard: two files of one blob took huggingface_hub's blob lock twice in one process."""
    body = os.urandom(1_500_000)
    hub.seed(REPO, {"q4/a.gguf": body, "q4/copy/a.gguf": body}, storage="lfs")
    hub.seed(REPO, {"q4/empty.txt": b""})                            # and a file of no bytes: no segment at all
    res = run_fetch(cfg_for(tmp_path / "state", entry="q4/a.gguf"))
    assert res.path.read_bytes() == body and (res.snapshot / "q4/copy/a.gguf").read_bytes() == body
    assert (res.snapshot / "q4/empty.txt").read_bytes() == b""
    assert served(hub) == len(body)
