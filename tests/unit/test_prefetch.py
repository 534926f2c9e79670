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
    assert why and "direct I/O" in why


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


def test_neither_switch_changes_the_config_hash_that_keys_the_ladder_memory():
    base = cfg()
    assert base.startup == StartupSpec()
    for startup in ("[startup]\nprefetch = false\n", "[startup]\nprefetch_streams = 8\n"):
        assert cfg(startup=startup).hash == base.hash
    assert cfg(startup='[startup]\nload_mode = "dio"\n').hash != base.hash


def test_files_larger_than_the_memory_share_are_not_read_ahead(tmp_path):
    model = write(tmp_path / "m.gguf", 1000)
    files, why = plan(cfg(), "llamacpp", model, available=int(1000 / prefetch.PREFETCH_SHARE) + 10)
    assert files == [model] and why is None
    files, why = plan(cfg(), "llamacpp", model, available=1000)
    assert files == [] and "larger than 80% of the memory available" in why


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
