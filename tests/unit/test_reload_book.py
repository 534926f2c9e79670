"""The reload book's history survives damage on the volume: a torn line, a bad byte, a stray value."""

from __future__ import annotations

import json

from supervisor.reload import book as book_mod
from supervisor.reload.book import ReloadBook


def test_a_bad_byte_or_a_stray_value_costs_only_its_own_line(tmp_path):
    book = ReloadBook(tmp_path / "reload")
    book.append({"outcome": "applied", "n": 1})
    path = tmp_path / "reload" / "history.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"outcome": "appl\xff\xfeied", "n": 2}\n')   # not UTF-8 (a disk error, a hand edit)
        f.write(b"3\n")                                       # JSON, but not an entry
        f.write(b'{"outcome": "rolled_back", "n": 4')        # torn by a power cut
    book.append({"outcome": "applied", "n": 5})
    # the damaged line parses as something else or not at all: whichever, it never raises
    assert [e["n"] for e in book.history()] in ([1, 2, 5], [1, 5])
    assert all(isinstance(e, dict) for e in book.history())


def test_trimming_a_long_history_with_a_bad_byte_in_it_does_not_raise(tmp_path, monkeypatch):
    monkeypatch.setattr(book_mod, "HISTORY_KEEP", 4)
    book = ReloadBook(tmp_path / "reload")
    path = tmp_path / "reload" / "history.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"n": "\xff"}\n' * 10)
    for n in range(6):
        book.append({"n": n, "pad": "x" * 4096})     # past HISTORY_KEEP * 2 KiB: the trim runs
    assert [e["n"] for e in book.history()][-4:] == [2, 3, 4, 5]
    assert len(path.read_text(encoding="utf-8").splitlines()) == 4
