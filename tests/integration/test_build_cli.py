"""`build.py build` stopped with SIGTERM (a CI timeout, a `timeout` wrapper) ends its docker CLI
child and removes its temp dirs, the build context and the one holding the HF token file; Python's
default SIGTERM action left `docker build` compiling llama-server unsupervised for minutes.

The docker CLI here is a stand-in (KILN_DOCKER, which build.py honours): a script that stands
for `docker image inspect` / `docker build`, records its pid and argv, then blocks in the build
like a long compile does. The engine it reaches for `ping` is the real private one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from kiln_dev.docker import require_docker
from kiln_dev.supervised import wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.docker

FAKE_DOCKER = '''#!{python}
"""Stands for the docker CLI: `image inspect` says the base exists; `build` records itself and
blocks (reading stdin that never comes), as a long `docker build` does."""
import json, os, signal, sys, time
if sys.argv[1:3] == ["image", "inspect"]:
    print("sha256:" + "0" * 64)
    sys.exit(0)
if sys.argv[1] == "build":
    record = {{"pid": os.getpid(), "argv": sys.argv}}
    signal.signal(signal.SIGTERM, lambda *a: (open({record!r} + ".term", "w").close(), sys.exit(143)))
    with open({record!r} + ".tmp", "w") as f:      # whole or not there: the test reads it once it exists
        json.dump(record, f)
    os.replace({record!r} + ".tmp", {record!r})
    print("#1 building", flush=True)
    signal.pause()
sys.exit(2)
'''


def test_sigterm_to_build_ends_the_docker_build_and_removes_its_temp_dirs(tmp_path):
    host = require_docker()
    record = tmp_path / "build.json"
    fake = tmp_path / "docker"
    fake.write_text(FAKE_DOCKER.format(python=sys.executable, record=str(record)))
    fake.chmod(0o755)
    env = {**os.environ, "DOCKER_HOST": host, "KILN_DOCKER": str(fake), "HF_TOKEN": "hf_kiln-canary-term"}
    proc = subprocess.Popen([sys.executable, "build.py", "build", "--target", "cpu-llamacpp", "--binaries", "compile"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    build: dict = {}
    try:
        wait_for(record.is_file, 60, "the docker build to start")
        build = json.loads(record.read_text())
        context = Path(build["argv"][-1])
        token_file = Path(next(a for a in build["argv"] if a.startswith("id=hf_token,src=")).split("src=", 1)[1])
        assert context.is_dir() and token_file.is_file()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            left = psutil.Process(proc.pid).children(recursive=True)   # the stand-in too, whatever failed
            proc.kill()
            proc.wait()
            for child in left:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass
        if build and psutil.pid_exists(build["pid"]) and not Path(str(record) + ".term").is_file():
            os.kill(build["pid"], signal.SIGKILL)     # a failed run must not leave the stand-in behind
    assert proc.returncode == 143 and "Traceback" not in err, err
    assert Path(str(record) + ".term").is_file()                      # the docker CLI was told to stop...
    wait_for(lambda: not psutil.pid_exists(build["pid"]) or psutil.Process(build["pid"]).status() == "zombie",
             30, "the docker CLI to exit")                             # ...and is gone
    assert not context.exists() and not token_file.exists() and not token_file.parent.exists()
