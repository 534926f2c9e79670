"""The ladder memory (supervisor/ladder/memory.py LadderMemory): bounded to the newest winners
(issue 24, item 5: it kept one entry per config forever)."""

import json

from supervisor.ladder.memory import LadderMemory


def test_only_the_newest_keep_winners_stay(tmp_path):
    path = tmp_path / "ladder-memory.json"
    old = {f"old{i:02d}": {"rung": "a", "at": 1000.0 + i} for i in range(40)}
    old["damaged"] = {"rung": "b", "at": "yesterday"}      # no usable time: the first to go
    path.write_text(json.dumps(old))
    memory = LadderMemory(path)
    memory.remember("new", "cpu")
    data = json.loads(path.read_text())
    assert len(data) == LadderMemory.KEEP == 32
    assert "new" in data and memory.recall("new") == "cpu"
    assert "damaged" not in data and "old08" not in data and "old09" in data and "old39" in data


def test_remembering_a_known_key_again_refreshes_it(tmp_path):
    memory = LadderMemory(tmp_path / "m.json", keep=2)
    memory.remember("a", "r1")
    memory.remember("b", "r1")
    memory.remember("a", "r2")                              # a is the newest now
    memory.remember("c", "r1")
    assert json.loads((tmp_path / "m.json").read_text()).keys() == {"a", "c"}
    assert memory.recall("a") == "r2" and memory.recall("b") is None


def test_the_env_a_winner_was_relaunched_with_comes_back_only_where_the_engine_names_it(tmp_path):
    mem = LadderMemory(tmp_path / "ladder-memory.json")
    allowed = {"VLLM_WORKER_MULTIPROC_METHOD": {"spawn"}}
    mem.remember("k", "main", {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"})
    assert mem.recall("k") == "main" and mem.recall_env("k", allowed) == {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    mem.remember("plain", "main")
    assert mem.recall_env("plain", allowed) == {}
    # a memory file edited on the volume cannot inject an environment into the engine
    data = json.loads((tmp_path / "ladder-memory.json").read_text())
    data["k"]["env"] = {"LD_PRELOAD": "/volume/evil.so", "VLLM_WORKER_MULTIPROC_METHOD": "fork", "X": 3}
    (tmp_path / "ladder-memory.json").write_text(json.dumps(data))
    assert mem.recall_env("k", allowed) == {}
    data["k"]["env"] = ["not", "a", "table"]
    (tmp_path / "ladder-memory.json").write_text(json.dumps(data))
    assert mem.recall_env("k", allowed) == {}
