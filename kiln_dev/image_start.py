"""The supervisor started the way an image starts it, for the benches that time its start-up (P1, P9).

An image runs `/opt/kiln/venv/bin/python3 -m supervisor run` with PYTHONPATH=/opt/kiln/app, from a
venv that holds only supervisor/requirements.txt, with the supervisor's bytecode compiled when the
image was built (images/templates/_supervisor.j2). A development checkout differs in all three, and
each costs start-up time an image never pays:
- this machine's python3 runs site-packages .pth hooks at every start (an editable install's
  finder, a CA injector that imports certifi: 84 ms of `site` under -X importtime, 2026-12-05);
- PYTHONDONTWRITEBYTECODE=1 (set on these machines) makes every start compile the supervisor's
  modules from source (19 modules on the launch path, ~30 ms);
- the checkout itself on sys.path.
A lean interpreter (`python3 -S`, scripts/device/lean-python.sh) errs the other way: no venv, no
site at all. So the benches build what the image has: a venv from the same hash-pinned
requirements (cached by their digest and the interpreter), a copy of supervisor/ with its bytecode
compiled, and that venv's python3 run from outside the checkout.

    start = image_start(tmp)      # ImageStart(argv, env, cwd, described)
    spawn([*start.argv, "run", "--config", cfg], env=start.env(base), cwd=start.cwd)

Offline (a GPU box): KILN_IMAGE_WHEELS=DIR installs from wheels carried there (--no-index).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from . import Unavailable
from .cachelock import held
from .models import kiln_cache_dir

REPO = Path(__file__).resolve().parent.parent
REQUIREMENTS = REPO / "supervisor" / "requirements.txt"


@dataclass(frozen=True)
class ImageStart:
    argv: list[str]          # the interpreter and `-m supervisor`: the image's ENTRYPOINT
    pythonpath: str          # the compiled copy of supervisor/ (the image's /opt/kiln/app)
    cwd: str                 # outside the checkout, so `-m` does not find its supervisor/ first
    described: str           # one line for the bench's output

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` with the image's own PYTHONPATH and PYTHONUNBUFFERED (its Dockerfile's ENV)."""
        return {**base, "PYTHONPATH": self.pythonpath, "PYTHONUNBUFFERED": "1"}


def venv_dir(python: str = sys.executable) -> Path:
    tag = subprocess.run([python, "-c", "import sys; print(sys.implementation.cache_tag)"],
                         capture_output=True, text=True, check=True).stdout.strip()
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    return kiln_cache_dir() / "image-venv" / f"{tag}-{digest}"


def ensure_venv(python: str = sys.executable) -> Path:
    """The image's venv for `python`, made once per requirements digest (pip, hash-checked)."""
    venv = venv_dir(python)
    if (venv / ".made").exists():
        return venv
    with held(venv.with_name(venv.name + ".lock"), what="the image's venv"):
        if (venv / ".made").exists():       # made by the setup we waited for
            return venv
        return _make_venv(python, venv)


def _make_venv(python: str, venv: Path) -> Path:
    tmp = venv.with_name(venv.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)      # a half-made venv of ours, never a user's directory
    subprocess.run([python, "-m", "venv", str(tmp)], check=True)
    wheels = os.environ.get("KILN_IMAGE_WHEELS")
    source = ["--no-index", "--find-links", wheels] if wheels else []
    r = subprocess.run([str(tmp / "bin" / "python3"), "-m", "pip", "install", "--quiet", "--no-cache-dir",
                        "--disable-pip-version-check", "--require-hashes", *source, "-r", str(REQUIREMENTS)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise Unavailable(f"the image's venv could not be made ({python}): {r.stderr.strip()[-400:]}")
    (tmp / ".made").write_text(REQUIREMENTS.read_text())
    os.replace(tmp, venv)       # the venv's scripts keep the .partial path in their #! line; only python3 -m is run
    return venv


def app_copy(dest: Path, python: Path) -> Path:
    """supervisor/ copied under `dest` with its bytecode compiled by `python`, as the image's last
    layer has it (the image runs `python3 -m compileall` in its venv)."""
    app = dest / "app"
    shutil.rmtree(app / "supervisor", ignore_errors=True)
    shutil.copytree(REPO / "supervisor", app / "supervisor", ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([str(python), "-m", "compileall", "-q", str(app / "supervisor")], capture_output=True, text=True)
    if r.returncode != 0:
        raise Unavailable(f"supervisor/ did not compile under {app}: {r.stdout.strip()[-400:]}")
    return app


def image_start(dest: Path, python: str = sys.executable) -> ImageStart:
    py = ensure_venv(python) / "bin" / "python3"
    app = app_copy(dest, py)
    return ImageStart(argv=[str(py), "-m", "supervisor"], pythonpath=str(app), cwd="/",
                      described=f"as the image starts it: {py} -m supervisor, PYTHONPATH={app} (compiled)")
