"""Two compiles of the pinned llama.cpp sdist on this machine give the same tarball, byte for byte.

Real compiles (images/scripts/compile-llama-server.sh, ~15 minutes each on 2 cores), in work
directories of different names and lengths, one after the other, each packed by the packer that
publishes tarballs. kiln_dev/reproducible.py keeps the outcome in the Kiln cache keyed by the inputs
(sdist sha256, compile script sha256, compiler and CMake versions, cmake flags, SOURCE_DATE_EPOCH): a
warm run re-checks that the recorded tarball still hashes to the recorded sha256 and compiles nothing.
"""

from __future__ import annotations

import json
import tarfile

import pytest

from kiln_dev.reproducible import engine_record

pytestmark = [pytest.mark.llama, pytest.mark.slow]


@pytest.fixture(scope="module")
def record() -> dict:
    rec = engine_record("cpu-llamacpp")
    summary = {k: rec[k] for k in ("cache", "first_sha256", "second_sha256", "tarball_name")}
    summary["runs"] = [{k: r[k] for k in ("work_dir", "seconds", "loadavg_before", "loadavg_after", "finished_at")}
                       for r in rec["runs"]]
    print(json.dumps(summary, indent=2))
    return rec


def test_two_compiles_of_the_pinned_sdist_give_the_same_tarball(record):
    assert record["first_sha256"] == record["second_sha256"], (
        f"first {record['first_sha256']} != second {record['second_sha256']}:\n" + "\n".join(record["differences"]))
    assert record["differences"] == []


def test_no_build_path_lands_in_the_tarball(record):
    for run in record["runs"]:
        assert run["leaks"] == [], f"{run['work_dir']} is in: {run['leaks']}"


def test_the_tarball_is_normalised(record):
    from kiln_dev.reproducible import engine_inputs, engine_root, _key

    first = engine_root() / _key(engine_inputs()) / "first.tar.gz"
    head = first.read_bytes()[:10]
    assert head[3] & 0x08 == 0, "the gzip header stores a file name"
    assert int.from_bytes(head[4:8], "little") == 0, "the gzip header stores a time"
    with tarfile.open(first, "r:gz") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    epoch = record["inputs"]["source_date_epoch"]
    assert {(m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, "", "")}
    assert {m.mtime for m in members} == {epoch}
    assert {m.mode for m in members} <= {0o755, 0o644}
