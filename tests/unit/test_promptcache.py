"""The prompt cache's key and store (supervisor/promptcache/), without an engine: what changes the key,
what is offered, what the bounds delete (only Kiln's own files, oldest first). The engine's side, with the
real llama-server: tests/integration/test_prompt_cache.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

from supervisor.promptcache.key import cache_key, computation_flags
from supervisor.promptcache.store import Report, Store


def _model(tmp: Path, data: bytes = b"GGUF" + bytes(4096)) -> Path:
    p = tmp / "m.gguf"
    p.write_bytes(data)
    return p


def test_the_key_follows_the_computation_not_the_ports_keys_threads_or_sampler(tmp_path):
    model = _model(tmp_path)
    base = ["/bin/true", "--model", str(model), "--host", "0.0.0.0", "--port", "8080", "-c", "4096",
            "--api-key-file", "/run/k", "-t", "4", "--temp", "0.3", "--slot-save-path", "/x"]
    k = cache_key(base, model)
    moved = [a.replace("8080", "9000").replace("/run/k", "/other").replace("0.3", "0.9") for a in base]
    assert cache_key(moved, model) == k
    assert cache_key([a if a != "4096" else "8192" for a in base], model) != k           # another context
    assert cache_key(base + ["--cache-type-k", "q8_0"], model) != k                       # another KV type
    other = tmp_path / "o.gguf"
    other.write_bytes(b"GGUF" + bytes(4095) + b"\x01")                                   # another model file
    assert cache_key(base, other) != k
    assert computation_flags(base) == ["-c", "4096"]


def _entry(root: Path, key: str, tag: str, slot: int, size: int, age: float) -> None:
    root.mkdir(parents=True, exist_ok=True)
    name = f"{key}-{tag}-{slot}"
    (root / f"{name}.bin").write_bytes(b"x" * size)
    (root / f"{name}.json").write_text(json.dumps({"key": key, "tokens": 1000, "bytes": size,
                                                    "saved_at": time.time() - age, "slot": slot}))


def test_only_whole_entries_of_the_key_are_offered_and_the_rest_are_counted(tmp_path):
    k1, k2 = "a" * 24, "b" * 24
    _entry(tmp_path, k1, "pod1", 0, 100, age=10)
    _entry(tmp_path, k1, "pod2", 0, 100, age=5)
    _entry(tmp_path, k2, "pod1", 0, 100, age=1)
    (tmp_path / f"{k1}-pod3-0.bin").write_bytes(b"no manifest")                         # never offered
    (tmp_path / f"{k1}-pod4-0.bin").write_bytes(b"cut")                                 # manifest says 100
    (tmp_path / f"{k1}-pod4-0.json").write_text(json.dumps({"key": k1, "tokens": 9, "bytes": 100, "saved_at": 0}))
    report = Report("restored")
    got = Store(tmp_path, tag="me", max_bytes=10**9, max_entries=10, min_tokens=1).candidates(k1, report)
    assert [e.tag for e in got] == ["pod2", "pod1"]                                     # newest first
    assert len(report.skipped) == 1 and "its key differs" in report.skipped[0]["why"]


def test_the_bounds_delete_the_oldest_entries_and_never_a_file_that_is_not_kilns(tmp_path):
    for i, age in enumerate((30, 20, 10, 1)):
        _entry(tmp_path, "c" * 24, f"pod{i}", 0, 100, age=age)
    (tmp_path / "notes.txt").write_text("mine")
    Store(tmp_path, tag="me", max_bytes=250, max_entries=10, min_tokens=1)._bound()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["c" * 24 + "-pod2-0.bin", "c" * 24 + "-pod2-0.json", "c" * 24 + "-pod3-0.bin",
                    "c" * 24 + "-pod3-0.json", "notes.txt"]
    Store(tmp_path, tag="me", max_bytes=10**9, max_entries=1, min_tokens=1)._bound()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c" * 24 + "-pod3-0.bin", "c" * 24 + "-pod3-0.json",
                                                          "notes.txt"]
