"""The fetch's small parts on their own: segment sizing, the journal's crash rules, the sink's range
guard, the verifier's in-order hashing, and what the child's environment may hold."""

from __future__ import annotations

import hashlib
import os
import threading
import zlib

import pytest

from supervisor.model.fetch import plan
from supervisor.model.fetch.hashing import Meter, Verifier
from supervisor.model.fetch.journal import SegmentJournal
from supervisor.model.fetch.parent import child_env
from supervisor.model.fetch.sink import RangeIgnored, Sink
from kiln_dev.supervised import wait_for

MIB = plan.MIB


def test_segments_are_sized_from_the_model_and_the_connections():
    assert plan.segment_size(300 * 10**6, 32) == 5 * MIB            # about two per connection, whole MiB
    assert plan.segment_size(10**6, 32) == plan.MIN_SEGMENT
    assert plan.segment_size(181 * 2**30, 32) == plan.MAX_SEGMENT    # a 181 GiB model: 64 MiB, 2 GiB in flight
    assert plan.segment_size(181 * 2**30, 32, fixed_mib=8) == 8 * MIB
    assert plan.segments(10, 4) == [(0, 4), (4, 8), (8, 10)] and plan.segments(0, 4) == []


def _partial(tmp_path, size: int):
    part = tmp_path / "b.incomplete"
    part.write_bytes(bytes(size))
    return part, tmp_path / "b.incomplete.journal"


def test_a_journal_survives_a_torn_last_line_and_keeps_drops(tmp_path):
    part, path = _partial(tmp_path, 10)
    j = SegmentJournal.open(path, "b" * 64, 10, 4, part)
    j.finished(0, 0xAB)
    j.finished(2, 0xCD)
    j.dropped(0)
    j.close()
    with path.open("a") as f:
        f.write("1 00ff")                                           # killed mid-line
    again = SegmentJournal.load(path, "b" * 64, 10, part)
    assert again is not None and again.done == {2: 0xCD} and again.seg == 4
    assert again.done_bytes() == 2                                   # the short last segment


def test_a_journal_for_another_blob_size_or_a_missing_partial_is_not_trusted(tmp_path):
    part, path = _partial(tmp_path, 10)
    SegmentJournal.open(path, "b" * 64, 10, 4, part).finished(1, 7)
    assert SegmentJournal.load(path, "c" * 64, 10, part) is None
    assert SegmentJournal.load(path, "b" * 64, 11, part) is None
    part.unlink()
    assert SegmentJournal.load(path, "b" * 64, 10, part) is None
    assert SegmentJournal.open(path, "b" * 64, 10, 4, part).done == {}     # a fresh one replaces it


def test_a_sink_writes_in_place_and_refuses_bytes_beyond_its_range(tmp_path):
    f = tmp_path / "p"
    f.write_bytes(bytes(10))
    fd = os.open(f, os.O_RDWR)
    try:
        got = Meter()
        sink = Sink(fd, 4, 8, got)
        sink.write(b"ab")
        sink.write(b"cd")
        assert sink.full and f.read_bytes() == bytes(4) + b"abcd" + bytes(2) and got.value == 4
        assert sink.crc == zlib.crc32(b"abcd")
        with pytest.raises(RangeIgnored):
            sink.write(b"e")
        with pytest.raises(RangeIgnored):                            # http_get rewinds on a 200 to a resume
            sink.seek(0)
    finally:
        os.close(fd)


def test_the_verifier_hashes_in_order_and_sends_back_a_segment_the_disk_lost(tmp_path):
    body = os.urandom(10_000)
    part, path = _partial(tmp_path, len(body))
    blob = hashlib.sha256(body).hexdigest()
    j = SegmentJournal.open(path, blob, len(body), 4096, part)
    fd = os.open(part, os.O_RDWR)
    corrupt: list[int] = []
    result: list[tuple[bool, str]] = []
    finished = threading.Event()
    v = Verifier(fd, j, Meter(), corrupt.append, lambda ok, got: (result.append((ok, got)), finished.set()),
                 on_error=lambda e: result.append((False, repr(e))))
    v.start()
    try:
        for i in (2, 1, 0):                                          # out of order, as connections finish
            chunk = body[i * 4096:(i + 1) * 4096]
            wrong = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
            os.pwrite(fd, chunk if i != 1 else wrong, i * 4096)      # segment 1 lands wrong on disk
            j.finished(i, zlib.crc32(chunk))
            v.landed(i)
        wait_for(lambda: corrupt == [1] or result, 10, "segment 1 sent back")
        assert corrupt == [1], result
        assert result == []                                          # held at segment 1: no verdict yet
        os.pwrite(fd, body[4096:8192], 4096)                         # fetched again
        j.finished(1, zlib.crc32(body[4096:8192]))
        v.landed(1)
        assert finished.wait(10) and result == [(True, blob)]
    finally:
        v.stop()
        os.close(fd)


def test_the_child_environment_is_an_allowlist():
    env = {"PATH": "/bin", "HOME": "/root", "LANG": "C.UTF-8", "LC_ALL": "C", "HTTPS_PROXY": "http://p:3128",
           "no_proxy": "localhost", "SSL_CERT_FILE": "/ca.pem", "HF_ENDPOINT": "http://hub", "HF_HUB_CACHE": "/c",
           "HF_XET_CLIENT_AC_MAX_DOWNLOAD_CONCURRENCY": "16", "PYTHONPATH": "/x",
           "KILN_API_KEY": "engine-key", "RUNPOD_API_KEY": "rp-key", "HF_TOKEN": "from-env",
           "HUGGING_FACE_HUB_TOKEN": "old-name", "AWS_SECRET_ACCESS_KEY": "s", "KILN_CONFIG": "x"}
    out = child_env(env, "hf_the_token")
    assert out["HF_TOKEN"] == "hf_the_token" and "HUGGING_FACE_HUB_TOKEN" not in out
    for kept in ("PATH", "HOME", "LANG", "LC_ALL", "HTTPS_PROXY", "no_proxy", "SSL_CERT_FILE", "HF_ENDPOINT",
                 "HF_HUB_CACHE", "HF_XET_CLIENT_AC_MAX_DOWNLOAD_CONCURRENCY"):
        assert out[kept] == env[kept]
    for dropped in ("KILN_API_KEY", "RUNPOD_API_KEY", "AWS_SECRET_ACCESS_KEY", "KILN_CONFIG"):
        assert dropped not in out
    assert out["PYTHONPATH"].endswith(os.pathsep + "/x") and out["HF_XET_TELEMETRY_ENABLED"] == "false"
    assert "HF_TOKEN" not in child_env(env, None)                    # no token given: none inherited either
