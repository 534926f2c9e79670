"""Dead workers' directories on the shared volume are pruned by a real worker (`python -m supervisor run`
as RunPod starts a Serverless worker, the CPU llama-server, a tiny model): what a dead worker left (its
engine log, its reload book, its JIT cache) goes, bounded, a user's directory and a live worker's stay,
and the dead worker's driver JIT cache of this image and GPU kind becomes the new worker's (issue 37
item 8: nothing was ever pruned)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiln_dev.supervised import SELFTEST_OFF, wait_for
from supervisor.ladder.memory import image_identity
from supervisor.serverless import workdirs
from tests.integration.test_serverless_worker import worker

pytestmark = pytest.mark.llama
HOURS = 3600.0


def left_behind(workers: Path, wid: str, *, hours_ago: float | None, gpus=(), log_mib: int = 2) -> Path:
    """A worker's directory as it leaves it; marked by Kiln (hours_ago: its last heartbeat) or not (None)."""
    d = workers / wid
    (d / "run").mkdir(parents=True)
    with open(d / "run/engine.log", "wb") as f:
        f.truncate(log_mib << 20)
    (d / "reload").mkdir()
    (d / "reload/book.json").write_text("{}")
    (d / "cache/cuda-jit").mkdir(parents=True)
    (d / "cache/cuda-jit/index").write_text(f"jit of {wid}")
    if hours_ago is not None:
        workdirs.mark(d, worker=wid, image=image_identity(), gpus=list(gpus), now=0.0)
        seen = (d / workdirs.MARK).stat().st_mtime - hours_ago * HOURS
        os.utime(d / workdirs.MARK, (seen, seen))
    return d


def test_a_new_worker_prunes_dead_workers_directories_keeps_the_rest_and_takes_over_a_jit_cache(
        tmp_path, prefix, tiny):
    volume = tmp_path / "vol"
    workers = volume / "workers"
    dead = left_behind(workers, "gone-1", hours_ago=5)                            # this image, no GPU: its cache
    dead_other = left_behind(workers, "gone-2", hours_ago=3, gpus=["NVIDIA H200"])  # another GPU kind
    alive = left_behind(workers, "alive", hours_ago=0.01)                          # a heartbeat a minute ago
    users = left_behind(workers, "my-notes", hours_ago=None)                       # never marked: a user's
    os.utime(users / "run/engine.log", (1.0, 1.0))                                 # however old
    sup = worker(tmp_path, prefix, str(tiny), state=volume, selftest=SELFTEST_OFF, name="fresh")
    with sup:
        sup.wait_state("SERVING", timeout=120)
        pruned = wait_for(lambda: ((sup.status() or {}).get("serverless") or {}).get("pruned"), 60,
                          "the worker to report its prune on /status")
        assert sorted(pruned["removed"]) == ["gone-1", "gone-2"] and pruned["errors"] == []
        assert pruned["bytes"] >= 4 << 20 and pruned["adopted_jit_cache_of"] == "gone-1"
        assert not dead.exists() and not dead_other.exists()
        assert (alive / "run/engine.log").exists() and (users / "run/engine.log").exists()
        own = workers / "fresh"
        assert (own / "cache/cuda-jit/index").read_text() == "jit of gone-1"
        assert (own / workdirs.MARK).exists()
        assert sorted(p.name for p in workers.iterdir()) == ["alive", "fresh", "my-notes"]   # no tombstone
        assert sup.stop() == 0


def test_a_dead_workers_jit_cache_linked_out_of_the_volume_is_never_moved_in(tmp_path, prefix, tiny):
    """Issue 50 item 11: a dead worker's `cache/` was a symbolic link to a directory outside the volume,
    and the hand-over renamed that directory into the new worker's own. Now it is refused, said on
    /status and in the log, the link is pruned with the dead directory, and what it led to stays put."""
    volume = tmp_path / "vol"
    workers = volume / "workers"
    outside = tmp_path / "not-the-volume"
    (outside / "cuda-jit").mkdir(parents=True)
    (outside / "cuda-jit/index").write_text("someone else's")
    linked = left_behind(workers, "gone-linked", hours_ago=5)                      # this image, no GPU
    for p in ((linked / "cache/cuda-jit/index"), (linked / "cache/cuda-jit"), (linked / "cache")):
        p.unlink() if p.is_file() else p.rmdir()
    (linked / "cache").symlink_to(outside)
    sup = worker(tmp_path, prefix, str(tiny), state=volume, selftest=SELFTEST_OFF, name="fresh")
    with sup:
        sup.wait_state("SERVING", timeout=120)
        pruned = wait_for(lambda: ((sup.status() or {}).get("serverless") or {}).get("pruned"), 60,
                          "the worker to report its prune on /status")
        assert pruned["adopted_jit_cache_of"] is None and pruned["removed"] == ["gone-linked"], pruned
        assert len(pruned["jit_cache_refused"]) == 1, pruned
        why = pruned["jit_cache_refused"][0]
        assert "gone-linked" in why and "symbolic link" in why and str(outside) in why, why
        assert why in sup.log()
        assert (outside / "cuda-jit/index").read_text() == "someone else's"             # untouched, where it was
        assert not (workers / "fresh/cache/cuda-jit").exists() and not linked.exists()
        assert sorted(p.name for p in workers.iterdir()) == ["fresh"]
        assert sup.stop() == 0
