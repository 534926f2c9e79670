"""The dev setup (docs/development.md) on a newcomer's machine (issue 48, item 2): the distribution's own python3 first on
PATH (Debian 12's refuses `pip install` into the system: PEP 668), nothing else of Python installed.
scripts/dev-setup.sh makes a virtual environment (.venv/ in the checkout) with that python3 and installs
Kiln into it; a failed step stops the script there, naming the step and the cause, never later with a
traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DISTRO_PYTHON = Path("/usr/bin/python3")


def _clone(tmp_path: Path) -> Path:
    """A fresh clone of this checkout's committed tree, with the working tree's setup script over it
    (so the test checks the script as it is now, committed or not)."""
    dest = tmp_path / "kiln"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(dest)], check=True)
    for rel in ("scripts/dev-setup.sh", "pyproject.toml"):
        (dest / rel).write_bytes((ROOT / rel).read_bytes())
    return dest


def _newcomer_env(**extra: str) -> dict[str, str]:
    """PATH as a stock Debian machine has it: the distribution's python3 is the first python3."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = "/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/bin"
    env.pop("KILN_VENV", None)
    env.pop("KILN_BASE_PYTHON", None)
    return {**env, **extra}


@pytest.mark.slow
@pytest.mark.skipif(not DISTRO_PYTHON.is_file(), reason="no distribution python3 at /usr/bin/python3")
def test_setup_makes_a_venv_with_the_distributions_python_and_installs_kiln_there(tmp_path):
    clone = _clone(tmp_path)
    env = _newcomer_env()
    r = subprocess.run(["bash", "scripts/dev-setup.sh", "--venv-only"], cwd=clone, env=env, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    venv = clone / ".venv"
    assert (venv / "pyvenv.cfg").is_file()
    assert f"export VIRTUAL_ENV={venv}" in r.stdout
    base = (venv / "pyvenv.cfg").read_text()
    assert "home = /usr/bin" in base, base                    # made from the distribution's python3
    run = subprocess.run([str(venv / "bin" / "python"), "build.py", "list"], cwd=clone, capture_output=True,
                         text=True, env=env)
    assert run.returncode == 0 and "cpu-llamacpp" in run.stdout, run.stderr
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import images.cli.app as a, jinja2; print(a.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, env=env)
    assert where.returncode == 0 and where.stdout.strip().startswith(str(clone)), where.stderr
    # A second run reuses it: no pip (the stamp matches), the same venv.
    again = subprocess.run(["bash", "scripts/dev-setup.sh", "--venv-only"], cwd=clone, env=env, capture_output=True,
                           text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert again.returncode == 0 and "pip install" not in again.stderr, again.stderr


def test_a_python_too_old_stops_setup_at_once_naming_the_step(tmp_path):
    old = tmp_path / "python3"
    old.write_text("#!/bin/sh\nif [ \"$1\" = -V ]; then echo 'Python 3.9.2'; exit 0; fi\nexit 1\n")
    old.chmod(0o755)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "dev-setup.sh"), "--venv-only"], capture_output=True, text=True,
                       env=_newcomer_env(KILN_BASE_PYTHON=str(old), KILN_VENV=str(tmp_path / "venv")),
                       stdin=subprocess.DEVNULL, timeout=60)
    assert r.returncode == 1
    assert "Kiln needs Python 3.11 or newer" in r.stderr and "Python 3.9.2" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "venv").exists()


def test_a_directory_in_the_venvs_place_is_never_overwritten(tmp_path):
    mine = tmp_path / "not-a-venv"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "dev-setup.sh"), "--venv-only"], capture_output=True, text=True,
                       env=_newcomer_env(KILN_VENV=str(mine)), stdin=subprocess.DEVNULL, timeout=60)
    assert r.returncode == 1 and "is not a virtual environment" in r.stderr, r.stderr
    assert (mine / "notes.txt").read_text() == "mine" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_an_unknown_option_is_refused():
    r = subprocess.run(["bash", str(ROOT / "scripts" / "dev-setup.sh"), "--fast"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=30)
    assert r.returncode == 2 and "unknown option" in r.stderr


def test_the_scripts_never_eval_the_setup_they_cannot_check():
    # `eval "$(bash scripts/dev-setup.sh)"` swallows a failed setup (eval of an empty string is exit 0):
    # the quickstart then died later with ModuleNotFoundError.
    for script in ("scripts/test.sh", "scripts/quickstart.sh"):
        text = (ROOT / script).read_text()
        assert 'eval "$(bash scripts/dev-setup.sh' not in text, script
        assert "dev-setup.sh" in text and "setup failed" in text, script
