"""The model prefetch (supervisor/model/prefetch.py): which files, when it is skipped, and that it
reads every byte of every file, in order, with several reads in flight."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.config import StartupSpec, parse_config
from supervisor.errors import ConfigError
from supervisor.model import prefetch
from supervisor.model.prefetch import Prefetch, plan, skip_reason, weight_files


def cfg(engine: str = "llamacpp", startup: str = "", args: str = "[]"):
    source = "/m/model.gguf" if engine == "llamacpp" else "/m"
    entry = "" if engine == "llamacpp" else 'entry = "config.json"\n'
    return parse_config(f'engine = "{engine}"\n[model]\nsource = "{source}"\n{entry}'
                            f'[[ladder.rungs]]\nname = "a"\nargs = {args}\n{startup}')


def write(path: Path, n: int) -> Path:
    path.write_bytes(os.urandom(n))
    return path


# -- which files ---------------------------------------------------------------------------------
def test_a_gguf_is_its_own_file_and_a_split_gguf_brings_every_part_there_is(tmp_path):
    one = write(tmp_path / "m.gguf", 10)
    assert weight_files(one) == [one]
    parts = [write(tmp_path / f"big-{i:05d}-of-00003.gguf", 10) for i in (1, 2, 3)]
    assert weight_files(parts[0]) == parts
    parts[2].unlink()                        # a part missing: the engine will say so; read what is there
    assert weight_files(parts[0]) == parts[:2]


def test_a_vllm_model_reads_its_safetensors_not_the_bin_copies_beside_them(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    st = [write(tmp_path / f"model-0000{i}-of-00002.safetensors", 10) for i in (1, 2)]
    write(tmp_path / "pytorch_model.bin", 10)
    assert weight_files(tmp_path / "config.json") == st
    assert weight_files(tmp_path) == st
    (tmp_path / "sub").mkdir()
    assert weight_files(tmp_path / "sub" / "config.json") == []


# -- when not ------------------------------------------------------------------------------------
@pytest.mark.parametrize("startup,args", [
    ('[startup]\nload_mode = "dio"\n', "[]"),
    ("", '["-lm", "dio"]'),
    ("", '["--load-mode=dio"]'),
])
def test_direct_io_in_startup_or_in_any_rung_skips_it(startup, args):
    why = skip_reason(cfg("llamacpp", startup, args), "llamacpp")
    assert why and "direct I/O" in why and "rung a" in why


def test_mmap_none_and_mlock_read_through_the_page_cache_so_they_keep_it():
    for mode in ("none", "mmap", "mlock"):
        assert skip_reason(cfg("llamacpp", f'[startup]\nload_mode = "{mode}"\n'), "llamacpp") is None


def test_a_vllm_loader_of_its_own_skips_it_and_the_default_loaders_keep_it():
    assert "runai_streamer" in skip_reason(cfg("vllm", '[startup]\nload_format = "runai_streamer"\n'), "vllm")
    assert skip_reason(cfg("vllm", '[startup]\nload_format = "safetensors"\n'), "vllm") is None
    assert skip_reason(cfg("vllm"), "vllm") is None


def test_switched_off_by_config_or_env():
    assert skip_reason(cfg(startup="[startup]\nprefetch = false\n"), "llamacpp") == "[startup] prefetch = false"
    off = parse_config('engine = "llamacpp"\n[model]\nsource = "/m.gguf"\n[[ladder.rungs]]\nname = "a"\n',
                           env={"KILN_STARTUP_PREFETCH": "0"})
    assert not off.startup.prefetch


def test_streams_are_bounded_and_named_when_wrong():
    with pytest.raises(ConfigError) as e:
        cfg(startup="[startup]\nprefetch_streams = 0\n")
    assert "prefetch_streams" in str(e.value)
    assert cfg(startup="[startup]\nprefetch_streams = 8\n").startup.prefetch_streams == 8


def test_widening_is_off_by_default_bounded_named_when_wrong_and_read_from_the_env():
    assert cfg().startup.prefetch_widen_to == 0
    assert cfg(startup="[startup]\nprefetch_widen_to = 4\n").startup.prefetch_widen_to == 4
    with pytest.raises(ConfigError) as e:
        cfg(startup="[startup]\nprefetch_widen_to = 33\n")
    assert "prefetch_widen_to" in str(e.value) and "33" in str(e.value)
    with pytest.raises(ConfigError) as e:                     # as wide already: it would widen nothing
        cfg(startup="[startup]\nprefetch_streams = 4\nprefetch_widen_to = 2\n")
    assert "prefetch_widen_to" in str(e.value) and "more than prefetch_streams (4)" in str(e.value)
    assert "5 to 32, or 0" in str(e.value)
    env = parse_config('engine = "llamacpp"\n[model]\nsource = "/m.gguf"\n[[ladder.rungs]]\nname = "a"\n',
                       env={"KILN_STARTUP_PREFETCH_WIDEN_TO": "8"})
    assert env.startup.prefetch_widen_to == 8


def test_when_it_starts_is_one_of_two_and_named_when_wrong():
    assert cfg().startup.prefetch_at == "start"
    assert cfg(startup='[startup]\nprefetch_at = "preflight"\n').startup.prefetch_at == "preflight"
    with pytest.raises(ConfigError) as e:
        cfg(startup='[startup]\nprefetch_at = "early"\n')
    assert "prefetch_at" in str(e.value) and "early" in str(e.value) and "start" in str(e.value)
    env = parse_config('engine = "llamacpp"\n[model]\nsource = "/m.gguf"\n[[ladder.rungs]]\nname = "a"\n',
                       env={"KILN_STARTUP_PREFETCH_AT": "preflight"})
    assert env.startup.prefetch_at == "preflight"


def test_neither_switch_changes_the_config_hash_that_keys_the_ladder_memory():
    base = cfg()
    assert base.startup == StartupSpec()
    for startup in ("[startup]\nprefetch = false\n", "[startup]\nprefetch_streams = 8\n",
                    '[startup]\nprefetch_at = "preflight"\n', "[startup]\nprefetch_widen_to = 4\n"):
        assert cfg(startup=startup).hash == base.hash
    assert cfg(startup='[startup]\nload_mode = "dio"\n').hash != base.hash


def test_files_and_read_buffers_past_the_memory_share_are_not_read_ahead(tmp_path):
    model = write(tmp_path / "m.gguf", 1000)
    need = 1000 + prefetch.CHUNK                 # the file and one stream's buffer
    files, why = plan(cfg(), "llamacpp", model, available=int(need / prefetch.PREFETCH_SHARE) + 10)
    assert files == [(model, 1000)] and why is None
    files, why = plan(cfg(), "llamacpp", model, available=int(need / prefetch.PREFETCH_SHARE) - 10)
    assert files == [] and "larger than 80% of the memory available" in why


@pytest.mark.parametrize("server,rung_args,rung_env,env", [
    ('[server]\nextra_args = ["--load-mode", "dio"]\n', "[]", "", {}),
    ("", "[]", '[ladder.rungs.env]\nLLAMA_ARG_LOAD_MODE = "dio"\n', {}),
    ("", "[]", "", {"LLAMA_ARG_LOAD_MODE": "dio"}),
])
def test_direct_io_from_extra_args_or_the_engines_env_variable_skips_it_too(server, rung_args, rung_env, env):
    c = parse_config(f'engine = "llamacpp"\n[model]\nsource = "/m.gguf"\n{server}'
                     f'[[ladder.rungs]]\nname = "a"\nargs = {rung_args}\n{rung_env}', env={})
    assert "direct I/O" in skip_reason(c, "llamacpp", env)


def test_a_rungs_own_load_mode_wins_over_startups_and_its_flag_over_the_env():
    c = cfg("llamacpp", '[startup]\nload_mode = "dio"\n', '["--load-mode", "mmap"]')
    assert skip_reason(c, "llamacpp") is None                     # the rung's flag wins: mmap
    c = cfg("llamacpp", "", '["-lm", "none"]')
    assert skip_reason(c, "llamacpp", {"LLAMA_ARG_LOAD_MODE": "dio"}) is None


def test_a_vllm_rungs_own_streaming_loader_skips_it():
    why = skip_reason(cfg("vllm", "", '["--load-format", "runai_streamer"]'), "vllm")
    assert "runai_streamer" in why and "rung a" in why
    assert skip_reason(cfg("vllm", "", '["--load-format=pt"]'), "vllm") is None


# -- the read ------------------------------------------------------------------------------------
def test_every_byte_of_every_file_is_read_with_several_reads_in_flight(tmp_path, monkeypatch):
    monkeypatch.setattr(prefetch, "CHUNK", 4096)
    sizes = [3 * 4096 + 17, 0, 5 * 4096]
    files = [write(tmp_path / f"m{i}.safetensors", n) for i, n in enumerate(sizes)]
    seen: list[Prefetch] = []
    p = Prefetch(files, streams=3, on_done=seen.append).start()
    assert p.wait(30)
    d = p.to_dict()
    assert seen == [p]                        # told once, when the last stream ends
    assert (d["state"], d["read_bytes"], d["bytes"], d["files"], d["streams"]) == ("done", sum(sizes), sum(sizes), 3, 3)
    assert all(fd is None for fd in p._fds)   # every descriptor closed


def test_chunks_are_taken_in_file_order_so_the_front_is_read_first(tmp_path, monkeypatch):
    monkeypatch.setattr(prefetch, "CHUNK", 4096)
    a, b = write(tmp_path / "a.gguf", 2 * 4096 + 1), write(tmp_path / "b.gguf", 4096)
    p = Prefetch([a, b], streams=2)
    p._fds = [10, 11]                          # _take reads only these: no file is opened
    taken = []
    while (job := p._take()) is not None:
        taken.append(job)
    assert taken == [(10, 0, 4096), (10, 4096, 4096), (10, 8192, 1), (11, 0, 4096)]


def test_widened_mid_read_more_streams_read_the_rest_and_every_byte_once(tmp_path, monkeypatch):
    import threading

    monkeypatch.setattr(prefetch, "CHUNK", 4096)
    monkeypatch.setattr(prefetch, "_NOWAIT", None)          # every chunk read, none found resident
    f = write(tmp_path / "m.gguf", 9 * 4096 + 5)
    gate, first_in = threading.Event(), threading.Event()
    offsets: list[int] = []
    real = os.preadv

    def held(fd, bufs, off):                  # the first read waits until the widening is done
        offsets.append(off)
        first_in.set()
        gate.wait(30)
        return real(fd, bufs, off)

    monkeypatch.setattr(prefetch.os, "preadv", held)
    ends: list[Prefetch] = []
    read_at_end: list[int] = []
    p = Prefetch([f], streams=1, on_done=lambda q: (ends.append(q), read_at_end.append(q.read)))
    assert p.widen(3) is False                                   # not started: start() counts its own streams
    p.start()
    assert first_in.wait(30)
    assert p.widen(3) is True
    assert p.widen(2) is False and p.widen(3) is False           # never narrowed, never twice to the same
    gate.set()
    assert p.wait(30)
    d = p.to_dict()
    assert ends == [p] and (d["state"], d["read_bytes"], d["streams"]) == ("done", 9 * 4096 + 5, 3)
    assert read_at_end == [9 * 4096 + 5] and p._running == 0   # ended by the last of the three, not the first
    assert sorted(offsets) == [i * 4096 for i in range(10)]      # each chunk read by one stream only
    assert d["widened_s"] >= 0 and {t.name for t in p._threads} == {f"kiln-prefetch-{i}" for i in range(3)}
    assert p.widen(8) is False                                   # done: nothing left to widen


def nowait_answers(path: Path) -> None:
    """Skip where this filesystem cannot say what its page cache holds (RWF_NOWAIT refused)."""
    if prefetch._NOWAIT is None:
        pytest.skip("no RWF_NOWAIT on this platform")
    fd = os.open(path, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(1)], 0, prefetch._NOWAIT)
    except OSError as e:
        pytest.skip(f"{path.parent}'s filesystem does not take RWF_NOWAIT: {e}")
    finally:
        os.close(fd)


def test_chunks_already_in_the_page_cache_are_counted_not_copied_again(tmp_path, monkeypatch):
    monkeypatch.setattr(prefetch, "CHUNK", 4096)
    f = write(tmp_path / "m.gguf", 6 * 4096 + 3)             # just written: every page in the page cache
    nowait_answers(f)
    copies: list[int] = []
    real = os.preadv
    monkeypatch.setattr(prefetch.os, "preadv", lambda fd, bufs, off, *flags: (
        copies.append(off) if not flags else None) or real(fd, bufs, off, *flags))
    p = Prefetch([f], streams=2).start()
    assert p.wait(30)
    d = p.to_dict()
    assert (d["state"], d["read_bytes"], d["resident_bytes"]) == ("done", 6 * 4096 + 3, 6 * 4096 + 3)
    assert copies == [] and "gib_s" not in d                  # probed, never copied: no read rate to show


@pytest.mark.skipif(prefetch._NOWAIT is None, reason="no RWF_NOWAIT on this platform: nothing is probed")
def test_a_chunk_the_page_cache_does_not_hold_is_read_and_one_it_cannot_tell_about_too(tmp_path, monkeypatch):
    import errno

    monkeypatch.setattr(prefetch, "CHUNK", 4096)
    f = write(tmp_path / "m.gguf", 4 * 4096)
    real = os.preadv
    answers = iter([errno.EAGAIN, errno.EOPNOTSUPP] * 10)    # not in memory; a filesystem that cannot say

    def preadv(fd, bufs, off, *flags):
        if flags:
            raise OSError(next(answers), "probe")
        return real(fd, bufs, off)

    monkeypatch.setattr(prefetch.os, "preadv", preadv)
    p = Prefetch([f], streams=1).start()
    assert p.wait(30)
    d = p.to_dict()
    assert (d["state"], d["read_bytes"], d["resident_bytes"]) == ("done", 4 * 4096, 0)


def test_stopped_before_it_reads_anything_says_stopped(tmp_path):
    p = Prefetch([write(tmp_path / "m.gguf", 100)], streams=2)
    p.stop()
    p.start()
    assert p.wait(30)
    assert p.to_dict()["state"] == "stopped" and p.read == 0


def test_a_file_gone_before_the_read_is_noted_and_the_rest_is_read(tmp_path):
    gone, kept = write(tmp_path / "a.gguf", 100), write(tmp_path / "b.gguf", 200)
    p = Prefetch([gone, kept], streams=1)
    gone.unlink()
    p.start()
    assert p.wait(30)
    d = p.to_dict()
    assert d["state"] == "done" and d["read_bytes"] == 200 and "a.gguf" in d["note"]


def test_a_file_shorter_than_planned_is_noted_not_reported_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(prefetch, "CHUNK", 4096)
    f = write(tmp_path / "m.gguf", 3 * 4096)
    p = Prefetch([f], sizes=[5 * 4096], streams=1)            # planned larger than it is now
    p.start()
    assert p.wait(30)
    d = p.to_dict()
    assert d["read_bytes"] == 3 * 4096 and d["bytes"] == 5 * 4096 and "ended" in d["note"]


def test_no_thread_to_be_had_ends_it_once_as_stopped_and_closes_the_files(tmp_path, monkeypatch):
    import threading

    starts = []

    def refuse(self):
        starts.append(self.name)
        if len(starts) > 1:
            raise RuntimeError("can't start new thread")
        real_start(self)

    real_start = threading.Thread.start
    monkeypatch.setattr(prefetch.threading.Thread, "start", refuse)
    ends: list[Prefetch] = []
    p = Prefetch([write(tmp_path / "m.gguf", 100)], streams=3, on_done=ends.append).start()
    monkeypatch.setattr(prefetch.threading.Thread, "start", real_start)
    assert p.wait(30)
    assert ends == [p] and p.read == 100 and "1 of 3 streams started" in p.note
    assert all(fd is None for fd in p._fds)
    starts.clear()
    monkeypatch.setattr(prefetch.threading.Thread, "start", lambda self: (_ for _ in ()).throw(RuntimeError("no")))
    ends.clear()
    q = Prefetch([write(tmp_path / "n.gguf", 100)], streams=2, on_done=ends.append).start()
    assert ends == [q] and q.state == "stopped" and q.read == 0 and all(fd is None for fd in q._fds)


# -- when it widens: the engine's first line (run/launch.py) -------------------------------------
def test_the_engines_first_line_widens_the_read_once_and_every_line_still_reaches_the_timeline():
    from types import SimpleNamespace

    from supervisor.run.launch import _widening

    widened: list[int] = []
    rt = SimpleNamespace(prefetch=SimpleNamespace(widen=widened.append))
    seen: list[str] = []
    line = _widening(rt, cfg(startup="[startup]\nprefetch_widen_to = 4\n"), seen.append)
    for text in ("initializing", "loading model", "listening"):
        line(text)
    assert widened == [4] and seen == ["initializing", "loading model", "listening"]
    assert _widening(rt, cfg(), seen.append) == seen.append          # off: the timeline's own callback
    rt.prefetch = None                                                # nothing reading: nothing to widen
    _widening(rt, cfg(startup="[startup]\nprefetch_widen_to = 4\n"), seen.append)("initializing")

    def refuse(n: int) -> None:
        raise RuntimeError("can't start new thread")

    rt.prefetch = SimpleNamespace(widen=refuse)                       # a widening that fails: the line still counts
    _widening(rt, cfg(startup="[startup]\nprefetch_widen_to = 4\n"), seen.append)("first")
    assert seen[-1] == "first"


def test_the_memory_check_counts_the_widened_streams_buffers_too(tmp_path):
    f = write(tmp_path / "m.gguf", 1000)
    c = parse_config(f'engine = "llamacpp"\n[model]\nsource = "{f}"\n[[ladder.rungs]]\nname = "a"\n'
                     "[startup]\nprefetch_widen_to = 8\n")
    room = int((1000 + 4 * prefetch.CHUNK) / prefetch.PREFETCH_SHARE) + 1   # room for 4 buffers, not 8
    assert plan(c, "llamacpp", f, room)[1] is not None
    assert plan(c, "llamacpp", f, room * 2)[0] == [(f, 1000)]
