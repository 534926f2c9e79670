"""process/statefile.py: a state file is written whole or not at all, leaves no temp file, and a
write that fails is one warning that is taken back once the file is written again (issue 37, item 14;
the full disk itself: tests/integration/test_full_disk.py)."""

from __future__ import annotations

from supervisor.process.statefile import Writes, sweep_temps, write_atomic
from supervisor.run.record import Record


def test_a_write_that_fails_leaves_the_old_file_and_no_temp_file(tmp_path):
    path = tmp_path / "book.json"
    write_atomic(path, b"old", 0o600)
    assert path.read_bytes() == b"old" and path.stat().st_mode & 0o777 == 0o600
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "x").write_text("a directory in the way: the rename fails")
    try:
        write_atomic(blocked, b"new")
    except OSError:
        pass
    else:
        raise AssertionError("a rename over a directory succeeded")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocked", "book.json"]


def test_a_failing_file_is_one_warning_taken_back_once_it_is_written(tmp_path):
    rec = Record("test")
    heard = []

    def report(what, warning):
        heard.append((what, warning))
        rec.stand(what, warning)

    writes = Writes(report)
    blocked = tmp_path / "d"
    blocked.mkdir()
    (blocked / "x").write_text("")

    assert writes.attempt("the book", "a restart forgets", lambda: write_atomic(blocked, b"x")) is False
    assert writes.attempt("the book", "a restart forgets", lambda: write_atomic(blocked, b"x")) is False
    [warning] = rec.snapshot()["warnings"]
    assert warning.startswith("cannot write the book: ") and warning.endswith("; a restart forgets")
    assert writes.failing() == {"the book"}
    assert writes.attempt("the book", "a restart forgets", lambda: write_atomic(tmp_path / "ok", b"x")) is True
    assert rec.snapshot()["warnings"] == [] and writes.failing() == set()
    assert heard[-1] == ("the book", None)


def test_the_temp_files_a_killed_writer_left_are_swept_and_nothing_else(tmp_path):
    """Issue 50 item 12: a writer cut mid-write leaves `.<name>.<pid>.<tid>.tmp`; the owner's next start
    removes those, never a file of another form or another name's (a user's, another owner's)."""
    path = tmp_path / "children.json"
    write_atomic(path, b"[]")
    left = [".children.json.4242.140310184236736.tmp", ".children.json.1.2.tmp"]
    kept = [".children.json.notes.tmp", "children.json.1.2.tmp", ".children.json.1.2.tmp.keep",
            ".children.json.1.tmp", ".book.json.1.2.tmp", ".children.jsonx.1.2.tmp"]
    for name in left + kept:
        (tmp_path / name).write_text("x")
    (tmp_path / ".children.json.7.8.tmp").mkdir()                     # not a plain file: not write_atomic's
    (tmp_path / ".children.json.9.9.tmp").symlink_to(tmp_path / "children.json")
    assert sorted(sweep_temps(path)) == sorted(left)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        kept + ["children.json", ".children.json.7.8.tmp", ".children.json.9.9.tmp"])
    assert path.read_bytes() == b"[]" and sweep_temps(tmp_path / "absent/children.json") == []
