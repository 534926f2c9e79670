"""`python -m supervisor publish-config|fleet-status`: the old spellings of two commands that moved
to the workstation (`python build.py ...`). From a checkout they are the new command plus one
deprecation line; in an image (no images/ beside supervisor/) they are that line and exit 2, no
traceback; and nothing else the image runs imports images/."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=cwd, timeout=60)


def deprecation(command: str, *args: str) -> str:
    return (f"python -m supervisor {command}: deprecated spelling (it goes in the next release); use: "
            f"python build.py {command}{''.join(' ' + a for a in args)}")


@pytest.mark.parametrize("argv", [["fleet-status", "--repo", "not-a-repo"], ["publish-config", "--help"]])
def test_the_old_spelling_is_the_new_command_with_one_deprecation_line(argv):
    """Answered exactly as build.py answers, after the one line."""
    old = run(["-m", "supervisor", *argv], ROOT)
    new = run([str(ROOT / "build.py"), *argv], ROOT)
    assert old.returncode == new.returncode
    assert old.stdout == new.stdout
    assert old.stderr.splitlines() == [deprecation(*argv)] + new.stderr.splitlines()


def test_file_arguments_stay_relative_to_the_caller_s_directory(tmp_path):
    """The forwarded command runs in the caller's directory, not the checkout's."""
    (tmp_path / "deploy.toml").write_text("not toml at all [[[\n")
    old = subprocess.run([sys.executable, "-m", "supervisor", "publish-config", "deploy.toml", "--repo", "a/b"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    new = subprocess.run([sys.executable, str(ROOT / "build.py"), "publish-config", "deploy.toml", "--repo", "a/b"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert (old.returncode, old.stdout) == (new.returncode, new.stdout)
    assert old.stderr.splitlines()[1:] == new.stderr.splitlines()


@pytest.fixture
def image(tmp_path) -> Path:
    """What an image holds of Kiln: supervisor/ alone."""
    shutil.copytree(ROOT / "supervisor", tmp_path / "supervisor", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


@pytest.mark.parametrize("command", ["publish-config", "fleet-status"])
def test_in_an_image_the_old_spelling_is_one_line_and_exit_2(image, command):
    r = run(["-m", "supervisor", command, "--repo", "owner/name"], image)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [deprecation(command, "--repo", "owner/name")
                                     + " from a Kiln checkout (this image carries no workstation commands)"]


def test_in_an_image_the_supervisor_s_own_commands_need_nothing_of_images(image):
    assert run(["-m", "supervisor", "--version"], image).returncode == 0
    help_text = run(["-m", "supervisor", "--help"], image)
    assert help_text.returncode == 0 and "deprecated: python build.py publish-config" in help_text.stdout
    assert "Traceback" not in help_text.stderr
    r = run(["-m", "supervisor", "check-config", "/nonexistent.toml"], image)
    assert r.returncode == 2 and "Traceback" not in r.stderr
