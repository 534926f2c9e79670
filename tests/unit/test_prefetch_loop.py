"""The loop's side of the model prefetch (run/prefetch.py `WalkPrefetch.ensure`): it never raises into PID 1,
a replaced prefetch's late end does not overwrite the current one on /status, and one that was told
to stop does not stand in for a new read of the same files."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from supervisor.config import parse_config
from supervisor.run import loop
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
    sup.prefetch.ensure(Live(sup.boot_cfg, model_path=m))           # must not raise
    shown = sup.rec.snapshot()["prefetch"]
    assert shown["state"] == "skipped" and "could not start" in shown["note"] and sup.rt.prefetch is None


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
    sup.prefetch.ensure(Live(sup.boot_cfg, model_path=a))
    first = sup.rt.prefetch
    sup.prefetch.ensure(Live(sup.boot_cfg, model_path=b))           # another model: the first is stopped
    second = sup.rt.prefetch
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
    sup.prefetch.ensure(Live(sup.boot_cfg, model_path=m))
    first = sup.rt.prefetch
    sup.prefetch.ensure(Live(sup.boot_cfg, model_path=m))           # still reading the same files: kept
    assert sup.rt.prefetch is first
    first.stop()                                              # told to stop (HEALTHY), not ended yet
    sup.prefetch.ensure(Live(sup.boot_cfg, model_path=m))           # a relaunch: read again
    assert sup.rt.prefetch is not first
    gate.set()
    assert sup.rt.prefetch.wait(30) and first.wait(30)


def test_status_says_when_the_prefetch_began_after_the_processs_exec(tmp_path):
    # /status prefetch.start_s: seconds from the exec (the boot timeline's zero) to the read's start
    m = model(tmp_path)
    exec_at = time.monotonic() - 1.0
    cfg = parse_config(f'engine = "llamacpp"\nstate_dir = "{tmp_path / "state"}"\n[model]\nsource = "{m}"\n'
                       '[[ladder.rungs]]\nname = "a"\n', env={})
    sup = loop.Supervisor(cfg, loop.Options(env={}, process_start=exec_at))
    sup.prefetch.ensure(Live(sup.boot_cfg, model_path=m))
    assert sup.rt.prefetch.wait(30)
    shown = sup.rec.snapshot()["prefetch"]
    assert shown["state"] == "done" and shown["start_s"] == round(sup.rt.prefetch.started - exec_at, 3) >= 1.0


# -- [startup] prefetch_at = "start" (the default): begun before the loop (model/prefetch.py begin(), called by
# __main__ as soon as the config is read)

EARLY = '[startup]\nprefetch_at = "start"\n'


def cfg_for(tmp_path: Path, source: str, extra: str = EARLY):
    return parse_config(f'engine = "llamacpp"\nstate_dir = "{tmp_path / "state"}"\n[model]\nsource = "{source}"\n'
                        f'{extra}[[ladder.rungs]]\nname = "a"\n', env={})


def test_begin_reads_a_local_model_when_asked_and_says_nothing_for_what_it_cannot_or_must_not_read(tmp_path):
    m = model(tmp_path)
    p = prefetch.begin(cfg_for(tmp_path, str(m)), {})
    assert p is not None and p.files == [m] and p.wait(30) and p.state == "done" and p.read == 4096
    assert prefetch.begin(cfg_for(tmp_path, str(m), ""), {}) is not None                        # the default
    assert prefetch.begin(cfg_for(tmp_path, str(m), '[startup]\nprefetch_at = "preflight"\n'), {}) is None
    assert prefetch.begin(cfg_for(tmp_path, "hf://org/repo", 'entry = "m.gguf"\n' + EARLY), {}) is None
    assert prefetch.begin(cfg_for(tmp_path, str(tmp_path / "absent.gguf")), {}) is None         # no raise
    assert prefetch.begin(cfg_for(tmp_path, str(m), EARLY + "prefetch = false\n"), {}) is None
    assert prefetch.begin(cfg_for(tmp_path, str(m)), {"LLAMA_ARG_LOAD_MODE": "dio"}) is None      # direct I/O


def test_a_begun_prefetch_is_adopted_its_end_said_once_whether_it_ended_before_or_after(tmp_path, monkeypatch):
    m = model(tmp_path)
    exec_at = time.monotonic() - 1.0                          # the process's exec, the boot timeline's zero
    ended = prefetch.begin(cfg_for(tmp_path, str(m)), {})
    assert ended.wait(30)                                     # ended before the loop was built
    sup = loop.Supervisor(cfg_for(tmp_path, str(m)), loop.Options(env={}, prefetch=ended, process_start=exec_at))
    assert sup.rt.prefetch is ended and sup.rec.snapshot()["prefetch"]["state"] == "done"
    assert sup.rec.snapshot()["prefetch"]["start_s"] == round(ended.started - exec_at, 3) >= 1.0
    assert [h["event"] for h in sup.rec.snapshot()["history"]].count("prefetch") == 1

    gate = threading.Event()
    real_worker = prefetch.Prefetch._worker
    monkeypatch.setattr(prefetch.Prefetch, "_worker", lambda self: (gate.wait(30), real_worker(self)))
    running = prefetch.begin(cfg_for(tmp_path, str(m)), {})
    sup = loop.Supervisor(cfg_for(tmp_path, str(m)), loop.Options(env={}, prefetch=running))
    assert sup.rec.snapshot()["prefetch"]["state"] == "reading"
    sup.prefetch.ensure(Live(sup.boot_cfg, model_path=m))           # preflight plans the same files: kept, not read twice
    assert sup.rt.prefetch is running
    gate.set()
    assert running.wait(30)
    assert sup.rec.snapshot()["prefetch"]["state"] == "done"
    assert [h["event"] for h in sup.rec.snapshot()["history"]].count("prefetch") == 1


def test_a_begun_prefetch_of_another_model_than_the_boots_is_stopped(tmp_path, monkeypatch):
    # The boot's live config can be a published one kept in the volume, with another model than the
    # file's: the early read is stopped and the boot's own model read.
    a, b = model(tmp_path, "a.gguf"), model(tmp_path, "b.gguf")
    gate = threading.Event()
    real_worker = prefetch.Prefetch._worker
    monkeypatch.setattr(prefetch.Prefetch, "_worker", lambda self: (gate.wait(30), real_worker(self)))
    early = prefetch.begin(cfg_for(tmp_path, str(a)), {})
    sup = loop.Supervisor(cfg_for(tmp_path, str(b)), loop.Options(env={}, prefetch=early))
    sup.prefetch.ensure(Live(sup.boot_cfg, model_path=b))
    assert sup.rt.prefetch is not early and sup.rt.prefetch.files == [b]
    gate.set()
    assert early.wait(30) and sup.rt.prefetch.wait(30)
    assert early.state == "stopped" and sup.rec.snapshot()["prefetch"]["files"] == 1
    assert sup.rec.snapshot()["prefetch"]["state"] == "done"


def test_an_early_read_that_ended_is_not_read_again_at_preflight(tmp_path):
    # Was: a finished early read was not "active", so preflight read the same files again (a small model,
    # or a warm page cache after a container restart; a held-out review, 2026-12-02)
    m = model(tmp_path)
    ended = prefetch.begin(cfg_for(tmp_path, str(m)), {})
    assert ended.wait(30) and ended.state == "done"
    sup = loop.Supervisor(cfg_for(tmp_path, str(m)), loop.Options(env={}, prefetch=ended))
    sup.prefetch.ensure(Live(sup.boot_cfg, model_path=m))
    assert sup.rt.prefetch is ended
    assert [h["event"] for h in sup.rec.snapshot()["history"]].count("prefetch") == 1


def test_an_early_read_is_stopped_when_the_boots_model_is_fetched_instead(tmp_path, monkeypatch):
    # Was: the boot's config (kept in the volume) names an hf:// model: the early read of the file's
    # local model went on through the whole download, and /status showed it as this boot's
    m = model(tmp_path)
    gate = threading.Event()
    real_worker = prefetch.Prefetch._worker
    monkeypatch.setattr(prefetch.Prefetch, "_worker", lambda self: (gate.wait(30), real_worker(self)))
    early = prefetch.begin(cfg_for(tmp_path, str(m)), {})
    fetched = cfg_for(tmp_path, "hf://org/repo", 'entry = "m.gguf"\n' + EARLY)
    sup = loop.Supervisor(fetched, loop.Options(env={}, prefetch=early))
    sup.prefetch.ensure(Live(fetched, model_path=None))
    assert sup.rt.prefetch is None and not early.active
    gate.set()
    assert early.wait(30) and early.state == "stopped"
    assert sup.rec.snapshot().get("prefetch") is None


def test_the_read_is_spent_when_the_engine_is_healthy_and_a_later_walk_reads_anew(tmp_path, monkeypatch):
    # Was: a finished read was kept for every later walk (a reload hours later read nothing, and a
    # restart took --load-mode none as if a read were on; a second held-out review, 2026-12-02)
    from supervisor.lifecycle import events as E
    from supervisor.lifecycle.state import State

    m = model(tmp_path)
    gate = threading.Event()
    real_worker = prefetch.Prefetch._worker
    monkeypatch.setattr(prefetch.Prefetch, "_worker", lambda self: (gate.wait(30), real_worker(self)))
    sup = supervisor(tmp_path, m)
    sup.prefetch.ensure(Live(sup.boot_cfg, model_path=m))
    first = sup.rt.prefetch
    for state in (State.FETCH, State.LAUNCHING, State.LOADING, State.HEALTHY):
        sup._do_Enter(E.Enter(state, ""))
    assert sup.rt.prefetch is None          # the launch sees no read from here on
    gate.set()
    assert first.wait(30)
    assert sup.rec.snapshot()["prefetch"]["state"] in ("stopped", "done")   # its end still said on /status
    sup.prefetch.ensure(Live(sup.boot_cfg, model_path=m))                 # a reload of the same model
    assert sup.rt.prefetch is not None and sup.rt.prefetch is not first
    assert sup.rt.prefetch.wait(30)


def test_a_read_that_ended_within_the_walk_is_not_read_again_at_the_launch_check(tmp_path):
    # prefetch_at = "preflight": a small model read whole between preflight and the launch check
    m = model(tmp_path)
    cfg = cfg_for(tmp_path, str(m), '[startup]\nprefetch_at = "preflight"\n')
    sup = loop.Supervisor(cfg, loop.Options(env={}))
    sup.prefetch.ensure(Live(cfg, model_path=m))
    first = sup.rt.prefetch
    assert first.wait(30) and first.state == "done"
    sup.prefetch.ensure(Live(cfg, model_path=m))
    assert sup.rt.prefetch is first
    assert [h["event"] for h in sup.rec.snapshot()["history"]].count("prefetch") == 1
