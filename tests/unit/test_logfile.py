"""supervisor/process/logfile.py: a child's output file rotated by size (issue 24, item 5: engine.log
was appended to forever)."""

from pathlib import Path

import pytest

from supervisor.process.logfile import RotatingFile


def _names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_writing_past_the_cap_rotates_and_keeps_only_keep_old_files(tmp_path):
    f = RotatingFile(tmp_path / "engine.log", max_bytes=100, keep=2)
    for i in range(40):                              # 40 lines of 10 bytes: 400 bytes, four files' worth
        f.write_line(f"line {i:04d}")
    f.close()
    assert _names(tmp_path) == ["engine.log", "engine.log.1", "engine.log.2"]
    sizes = [p.stat().st_size for p in sorted(tmp_path.iterdir())]
    assert all(size <= 100 for size in sizes), sizes
    # newest in engine.log, then .1, then .2; everything older is gone
    current = (tmp_path / "engine.log").read_text().splitlines()
    one = (tmp_path / "engine.log.1").read_text().splitlines()
    two = (tmp_path / "engine.log.2").read_text().splitlines()
    assert current[-1] == "line 0039" and one[-1] == f"line {int(current[0][5:]) - 1:04d}"
    assert two[-1] == f"line {int(one[0][5:]) - 1:04d}" and "line 0000" not in two
    assert f.rotations == 3 and f.old_files() == [tmp_path / "engine.log.1", tmp_path / "engine.log.2"]


def test_a_file_already_past_the_cap_is_rotated_by_the_first_line_not_grown(tmp_path):
    path = tmp_path / "engine.log"
    path.write_bytes(b"x" * 500)                     # a previous boot's log
    f = RotatingFile(path, max_bytes=100, keep=3)
    assert f.size == 500
    f.write_line("new boot")
    f.close()
    assert path.read_text() == "new boot\n" and (tmp_path / "engine.log.1").stat().st_size == 500


def test_appending_continues_the_current_file_below_the_cap(tmp_path):
    path = tmp_path / "engine.log"
    path.write_text("earlier\n")
    f = RotatingFile(path, max_bytes=100, keep=3)
    f.write_line("later")
    f.close()
    assert path.read_text() == "earlier\nlater\n" and _names(tmp_path) == ["engine.log"]


def test_a_line_longer_than_the_cap_is_kept_whole_in_a_file_of_its_own(tmp_path):
    f = RotatingFile(tmp_path / "engine.log", max_bytes=10, keep=1)
    f.write_line("short")
    f.write_line("x" * 50)
    f.close()
    assert (tmp_path / "engine.log").read_text() == "x" * 50 + "\n"
    assert (tmp_path / "engine.log.1").read_text() == "short\n"


def test_keep_zero_truncates_and_no_cap_never_rotates(tmp_path):
    f = RotatingFile(tmp_path / "a.log", max_bytes=10, keep=0)
    for i in range(5):
        f.write_line(f"{i:08d}")
    f.close()
    assert _names(tmp_path) == ["a.log"] and (tmp_path / "a.log").read_text() == "00000004\n"
    g = RotatingFile(tmp_path / "b.log")
    for i in range(1000):
        g.write_line("y" * 100)
    g.close()
    assert (tmp_path / "b.log").stat().st_size == 101_000 and not (tmp_path / "b.log.1").exists()


def test_nonsense_limits_are_refused(tmp_path):
    with pytest.raises(ValueError):
        RotatingFile(tmp_path / "a.log", max_bytes=0)
    with pytest.raises(ValueError):
        RotatingFile(tmp_path / "a.log", max_bytes=10, keep=-1)


def test_the_lines_of_one_read_rotate_between_lines_never_past_the_cap(tmp_path):
    # The reader writes each read's lines at once (P2b): a block larger than the room left is split
    # at a line, so no file passes the cap and no line straddles two files.
    f = RotatingFile(tmp_path / "engine.log", max_bytes=100, keep=5)
    f.write_lines([f"line {i:04d}" for i in range(25)])        # 250 bytes in one call
    f.close()
    files = [tmp_path / n for n in ("engine.log.2", "engine.log.1", "engine.log")]
    assert all(p.stat().st_size <= 100 for p in files)
    assert "".join(p.read_text() for p in files).splitlines() == [f"line {i:04d}" for i in range(25)]
    assert f.rotations == 2


def test_a_write_that_takes_only_part_of_a_block_is_finished_not_lost(tmp_path):
    f = RotatingFile(tmp_path / "engine.log", max_bytes=1000)
    real = f._f

    class Short:                                     # an unbuffered write may take only part (a signal)
        def write(self, b):
            return real.write(bytes(b)[:3])

        def close(self):
            real.close()

    f._f = Short()
    f.write_lines(["first line", "second"])
    f.close()
    assert (tmp_path / "engine.log").read_text() == "first line\nsecond\n" and f.size == 18
