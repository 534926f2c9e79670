"""A dead Serverless worker's directory on the shared volume is pruned, bounded, and only when Kiln
marked it as its own; its driver JIT cache goes to a new worker of the same image and GPU kind
(supervisor/serverless/workdirs.py; issue 37 item 8). Real files on a real directory tree."""

from __future__ import annotations

import os
from pathlib import Path

from supervisor.serverless import workdirs

DAY = 86_400.0


def a_worker(workers: Path, wid: str, *, seen: float | None, image: str = "img", gpus=("NVIDIA A40",),
             jit: bytes | None = b"jit entries", log_bytes: int = 4096) -> Path:
    """A worker's directory as a worker leaves it: its log, its book, its JIT cache; marked unless seen is None."""
    d = workers / wid
    (d / "run").mkdir(parents=True)
    (d / "run/engine.log").write_bytes(b"x" * log_bytes)
    (d / "reload").mkdir()
    (d / "reload/book.json").write_text("{}")
    if jit is not None:
        (d / "cache/cuda-jit").mkdir(parents=True)
        (d / "cache/cuda-jit/index").write_bytes(jit)
    if seen is not None:
        workdirs.mark(d, worker=wid, image=image, gpus=gpus, now=seen)
        os.utime(d / workdirs.MARK, (seen, seen))
    return d


def test_only_marked_directories_whose_heartbeat_stopped_are_dead(tmp_path):
    workers = tmp_path / "workers"
    own = a_worker(workers, "me", seen=10 * DAY, jit=None)
    old = a_worker(workers, "old", seen=10 * DAY - 2 * workdirs.DEAD_AFTER_S)
    a_worker(workers, "alive", seen=10 * DAY - 60)
    a_worker(workers, "users", seen=None)                  # no mark: never Kiln's to delete, however old
    (workers / "a-file").write_text("a user's")
    assert workdirs.dead(workers, own, now=10 * DAY) == [old]


def test_the_volume_clock_is_the_one_the_marks_were_touched_by(tmp_path):
    own = a_worker(tmp_path / "workers", "me", seen=1.0, jit=None)
    assert abs(workdirs.beat(own) - (own / workdirs.MARK).stat().st_mtime) < 1e-6 and workdirs.beat(own) > 1.0


def test_a_dead_worker_is_deleted_whole_and_its_jit_cache_goes_to_a_new_worker_of_its_image_and_gpus(tmp_path):
    workers = tmp_path / "workers"
    own = a_worker(workers, "me", seen=10 * DAY, jit=None)
    same = a_worker(workers, "same", seen=1.0, jit=b"sm_86 entries", log_bytes=1 << 20)
    other = a_worker(workers, "other-gpu", seen=2.0, gpus=("NVIDIA H200",), jit=b"sm_90 entries")
    user = a_worker(workers, "users", seen=None)
    found = workdirs.dead(workers, own, now=10 * DAY)
    assert workdirs.adopt_jit_cache(found, own, image="img", gpus=["NVIDIA A40"]) == "same"
    assert (own / "cache/cuda-jit/index").read_bytes() == b"sm_86 entries"
    assert workdirs.adopt_jit_cache(found, own, image="img", gpus=["NVIDIA A40"]) is None   # has one now
    done = workdirs.prune(workers, own, found, pruner="me")
    assert sorted(done.removed) == ["other-gpu", "same"] and done.bytes >= (1 << 20) and not done.errors
    assert not same.exists() and not other.exists()
    assert sorted(p.name for p in workers.iterdir()) == ["me", "users"]        # no tombstone left
    assert (user / "run/engine.log").exists() and (own / workdirs.MARK).exists()


def test_pruning_is_bounded_and_a_tombstone_a_dead_pruner_left_is_finished_by_the_next(tmp_path):
    workers = tmp_path / "workers"
    own = a_worker(workers, "me", seen=10 * DAY, jit=None)
    for i in range(5):
        a_worker(workers, f"w{i}", seen=float(i + 1))
    first = workdirs.prune(workers, own, workdirs.dead(workers, own, now=10 * DAY), pruner="me", limit=2)
    assert first.removed == ["w0", "w1"] and len(list(workers.iterdir())) == 4
    # a pruner killed half way: its tombstone keeps the dead worker's mark, so it is still Kiln's and dead
    half = workers / ".pruning-gone-pruner-w2"
    os.rename(workers / "w2", half)
    (half / "run/engine.log").unlink()
    rest = workdirs.prune(workers, own, workdirs.dead(workers, own, now=10 * DAY), pruner="me")
    assert sorted(rest.removed) == ["w2", "w3", "w4"] and [p.name for p in workers.iterdir()] == ["me"]


def test_a_symlink_in_a_dead_directory_is_removed_never_followed(tmp_path):
    workers = tmp_path / "workers"
    own = a_worker(workers, "me", seen=10 * DAY, jit=None)
    d = a_worker(workers, "old", seen=1.0)
    outside = tmp_path / "users-data"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    (d / "link").symlink_to(outside)
    workdirs.prune(workers, own, workdirs.dead(workers, own, now=10 * DAY), pruner="me")
    assert not d.exists() and (outside / "precious").read_text() == "keep"


def test_a_jit_cache_reached_through_a_link_is_never_handed_over_and_says_why(tmp_path):
    """Issue 50 item 11: a dead worker's `cache/` linked to a directory outside the volume, and the
    hand-over renamed that directory (a user's, anyone's) into the new worker's own. A cache reached
    through a link, or holding one that leads out of it, is refused, said, and left where it is."""
    workers = tmp_path / "vol/workers"
    own = a_worker(workers, "me", seen=10 * DAY, jit=None)
    outside = tmp_path / "outside"
    (outside / "cuda-jit").mkdir(parents=True)
    (outside / "cuda-jit/index").write_text("not Kiln's")
    linked = a_worker(workers, "linked", seen=1.0, jit=None)
    (linked / "cache").symlink_to(outside)
    leaf = a_worker(workers, "leaf", seen=2.0, jit=None)
    (leaf / "cache").mkdir()
    (leaf / "cache/cuda-jit").symlink_to(outside / "cuda-jit")
    inner = a_worker(workers, "inner", seen=3.0)
    (inner / "cache/cuda-jit/entry").symlink_to(outside / "cuda-jit/index")
    found = workdirs.dead(workers, own, now=10 * DAY)
    assert found == [linked, leaf, inner]
    refused: list[str] = []
    assert workdirs.adopt_jit_cache(found, own, image="img", gpus=["NVIDIA A40"], refused=refused) is None
    assert not (own / "cache/cuda-jit").exists()
    assert (outside / "cuda-jit/index").read_text() == "not Kiln's"
    assert len(refused) == 3 and all("link" in r for r in refused), refused
    assert str(linked / "cache") in refused[0] and str(outside) in refused[0]
    assert str(leaf / "cache/cuda-jit") in refused[1] and str(inner / "cache/cuda-jit/entry") in refused[2]
    # a good cache further down the list is still handed over
    good = a_worker(workers, "good", seen=4.0, jit=b"good entries")
    assert workdirs.adopt_jit_cache(found + [good], own, image="img", gpus=["NVIDIA A40"]) == "good"
    assert (own / "cache/cuda-jit/index").read_bytes() == b"good entries"
    # and pruning the dead deletes the links, never what they lead to
    workdirs.prune(workers, own, workdirs.dead(workers, own, now=10 * DAY), pruner="me")
    assert sorted(p.name for p in workers.iterdir()) == ["me"]
    assert (outside / "cuda-jit/index").read_text() == "not Kiln's"
    assert workdirs.Pruned(refused=["x"]).to_dict()["jit_cache_refused"] == ["x"]
