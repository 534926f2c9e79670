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
