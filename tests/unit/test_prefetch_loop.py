"""The loop's side of the model prefetch (lifecycle/loop.py `_prefetch`): it never raises into PID 1,
a replaced prefetch's late end does not overwrite the current one on /status, and one that was told
to stop does not stand in for a new read of the same files."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from supervisor.config import parse_config
from supervisor.lifecycle import loop
from supervisor.lifecycle.state import Live
from supervisor.model import prefetch


def supervisor(tmp_path: Path, model: Path) -> loop.Supervisor:
    cfg = parse_config(f'engine = "llamacpp"\nstate_dir = "{tmp_path / "state"}"\n[model]\nsource = "{model}"\n'
                       '[[ladder.rungs]]\nname = "a"\n', env={})
    return loop.Supervisor(cfg, loop.Options(env={}))


def model(tmp_path: Path, name: str = "m.gguf", n: int = 4096) -> Path:
    p = tmp_path / name
    p.write_bytes(os.urandom(n))
    return p


def test_a_file_gone_between_the_plan_and_the_open_is_said_and_nothing_raises(tmp_path, monkeypatch):
    m = model(tmp_path)
    sup = supervisor(tmp_path, m)
    real_plan = prefetch.plan

    def plan_then_lose_it(*a, **kw):
        out = real_plan(*a, **kw)
        m.unlink()
        return out

    monkeypatch.setattr(prefetch, "plan", plan_then_lose_it)
    monkeypatch.setattr(prefetch.Prefetch, "start", lambda self: (_ for _ in ()).throw(OSError(2, "gone")))
    sup._prefetch(Live(sup.boot_cfg, model_path=m))           # must not raise
    shown = sup.rec.snapshot()["prefetch"]
    assert shown["state"] == "skipped" and "could not start" in shown["note"] and sup.prefetch is None


def test_a_replaced_prefetchs_late_end_leaves_the_current_one_on_status(tmp_path, monkeypatch):
    a, b = model(tmp_path, "a.gguf"), model(tmp_path, "b.gguf")
    sup = supervisor(tmp_path, a)
    gate = threading.Event()
    real_worker = prefetch.Prefetch._worker

    def held(self):
        if self.files[0] == a:
            gate.wait(30)                                     # the first one ends only after the second
        real_worker(self)

    monkeypatch.setattr(prefetch.Prefetch, "_worker", held)
    sup._prefetch(Live(sup.boot_cfg, model_path=a))
    first = sup.prefetch
    sup._prefetch(Live(sup.boot_cfg, model_path=b))           # another model: the first is stopped
    second = sup.prefetch
    assert second is not first and second.wait(30)
    gate.set()
    assert first.wait(30) and first.state == "stopped"
    shown = sup.rec.snapshot()["prefetch"]
    assert shown["state"] == "done" and shown["read_bytes"] == 4096
    assert [h["detail"] for h in sup.rec.snapshot()["history"] if h["event"] == "prefetch"] == \
        [f"done: 0.00 of 0.00 GiB in {shown['seconds']} s (1 streams)"]


def test_a_stopped_prefetch_of_the_same_files_is_replaced_not_kept(tmp_path, monkeypatch):
    m = model(tmp_path)
    sup = supervisor(tmp_path, m)
    gate = threading.Event()
    real_worker = prefetch.Prefetch._worker
    monkeypatch.setattr(prefetch.Prefetch, "_worker", lambda self: (gate.wait(30), real_worker(self)))
    sup._prefetch(Live(sup.boot_cfg, model_path=m))
    first = sup.prefetch
    sup._prefetch(Live(sup.boot_cfg, model_path=m))           # still reading the same files: kept
    assert sup.prefetch is first
    first.stop()                                              # told to stop (HEALTHY), not ended yet
    sup._prefetch(Live(sup.boot_cfg, model_path=m))           # a relaunch: read again
    assert sup.prefetch is not first
    gate.set()
    assert sup.prefetch.wait(30) and first.wait(30)


def test_status_says_when_the_prefetch_began_after_the_processs_exec(tmp_path):
    # /status prefetch.start_s: seconds from the exec (the boot timeline's zero) to the read's start
    m = model(tmp_path)
    exec_at = time.monotonic() - 1.0
    cfg = parse_config(f'engine = "llamacpp"\nstate_dir = "{tmp_path / "state"}"\n[model]\nsource = "{m}"\n'
                       '[[ladder.rungs]]\nname = "a"\n', env={})
    sup = loop.Supervisor(cfg, loop.Options(env={}, process_start=exec_at))
    sup._prefetch(Live(sup.boot_cfg, model_path=m))
    assert sup.prefetch.wait(30)
    shown = sup.rec.snapshot()["prefetch"]
    assert shown["state"] == "done" and shown["start_s"] == round(sup.prefetch.started - exec_at, 3) >= 1.0
