"""model/fetch/stall.py: a stall is counted in time the process could run (a gap between two looks
far longer than the look interval was time it was stopped), and a waiter judges the lock holder by
what changes on the volume (issue 37, item 15; with real stopped processes:
tests/integration/test_stalled_holder.py)."""

from __future__ import annotations

from supervisor.model.fetch.layout import storage
from supervisor.model.fetch.stall import STOPPED_GAP_S, HolderWatch, StallClock


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_time_stopped_does_not_count_and_progress_resets():
    now = Clock()
    clock = StallClock(0.1, now)
    for _ in range(30):                       # 3 s of looks, nothing moved
        now.t += 0.1
        clock.look()
    assert abs(clock.idle - 3.0) < 1e-6
    now.t += 600                              # SIGSTOP for ten minutes, then SIGCONT
    assert abs(clock.look() - 3.1) < 1e-6 and abs(clock.discounted - 599.9) < 1e-6
    now.t += STOPPED_GAP_S - 0.5              # a slow turn of a loaded machine still counts whole
    assert abs(clock.look() - (3.1 + STOPPED_GAP_S - 0.5)) < 1e-6
    now.t += 0.1
    assert clock.look(progressed=True) == 0.0


def test_a_holder_is_stalled_only_once_nothing_on_the_volume_changed_for_the_window(tmp_path):
    now = Clock()
    note = {"worker": "wa", "pid": 7, "since": 1.0}
    watch = HolderWatch(tmp_path, "owner/model", 2.0, 0.25, lambda: dict(note), now)
    blobs = storage(tmp_path, "owner/model") / "blobs"
    blobs.mkdir(parents=True)
    part = blobs / "abc.incomplete"
    part.write_bytes(b"")
    with open(part, "r+b") as f:
        f.truncate(1 << 20)                   # sparse, full length: as download.py opens a partial

    def looks(n: int, change=lambda i: None) -> bool:
        out = False
        for i in range(n):
            now.t += 0.25
            change(i)
            out = watch.stalled()
        return out

    assert looks(8) is False                  # 1.75 s idle after the first look
    assert looks(1) is True                   # 2 s: stalled

    def write(i: int) -> None:                # a segment lands in place: allocated bytes grow
        with open(part, "r+b") as f:
            f.seek(i * 8192)
            f.write(b"x" * 8192)
    assert looks(20, write) is False
    note["moved"] = 123                       # hashing: nothing on the disk, the holder's note moves
    assert looks(1) is False
    assert looks(8) is True
