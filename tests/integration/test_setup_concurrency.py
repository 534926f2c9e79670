"""Two setups at once never break each other (issue 48, item 7): a second `python -m kiln_dev.vllm_cpu
ensure` deleted the first's half-made venv, and pip then reported success on a venv with no
pyvenv.cfg whose `python` was the machine's own. Now each cache has one writer at a time (a flock
beside it) and setup checks the venv is one before and after pip installs through it."""

from __future__ import annotations

import os
import subprocess
import sys
import venv as stdlib_venv
from pathlib import Path

import pytest

from kiln_dev import Unavailable, vllm_cpu
from kiln_dev.cachelock import held
from kiln_dev.supervised import wait_for

ROOT = Path(__file__).resolve().parents[2]


def _ensure_beside(cache: Path, stderr: Path) -> subprocess.Popen:
    env = {**os.environ, "KILN_CACHE_DIR": str(cache)}
    return subprocess.Popen([sys.executable, "-m", "kiln_dev.vllm_cpu", "ensure"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=stderr.open("w"))


def test_a_second_ensure_waits_for_the_first_and_leaves_its_half_made_venv_alone(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(cache))
    half_made = vllm_cpu.venv_dir()              # the first setup is still installing into it
    (half_made / "lib").mkdir(parents=True)
    (half_made / "lib" / "being-installed").write_text("pip is writing here")
    err = tmp_path / "second.err"
    with held(vllm_cpu.cache_root() / "ensure.lock"):          # the first setup, still running
        second = _ensure_beside(cache, err)
        try:
            wait_for(lambda: "waiting for another setup" in err.read_text() or second.poll() is not None
                     or not (half_made / "lib" / "being-installed").exists(),
                     timeout=60, what="the second ensure to wait on the first (or to delete its work)")
            assert second.poll() is None, err.read_text()
            assert (half_made / "lib" / "being-installed").is_file()     # nothing of the first's was deleted
        finally:
            second.kill()
            second.wait()


def test_a_directory_that_is_no_venv_is_refused_before_pip_runs_through_it(tmp_path):
    fake = tmp_path / "venv"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "python").symlink_to(sys.executable)      # a venv with no pyvenv.cfg: the machine's python
    with pytest.raises(Unavailable, match="no pyvenv.cfg"):
        vllm_cpu.check_venv(fake)
    (fake / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\n")
    real = tmp_path / "real"
    stdlib_venv.create(real, with_pip=False, symlinks=True)
    vllm_cpu.check_venv(real)                                  # a real one passes
    (real / "bin" / "python").unlink()
    (real / "bin" / "python").symlink_to(os.path.realpath(sys.executable) if sys.prefix == sys.base_prefix
                                         else Path(sys.base_prefix) / "bin" / "python3")
    (real / "pyvenv.cfg").unlink()
    with pytest.raises(Unavailable):
        vllm_cpu.check_venv(real)
