"""kiln_dev/image_start.py: the benches' supervisor starts as an image's does (P1, issue 38): from the
image's venv, its compiled copy of supervisor/, never the checkout, and without the machine's .pth hooks."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kiln_dev.image_start import REQUIREMENTS, image_start

PROBE = ("import sys, supervisor, importlib.util; "
         "print(supervisor.__file__); print(importlib.util.cache_from_source(supervisor.__file__)); "
         "print(sys.prefix); print(int(any('editable' in m for m in sys.modules)))")


def test_the_image_start_runs_the_compiled_copy_from_the_images_venv(tmp_path: Path) -> None:
    start = image_start(tmp_path)
    env = start.env({k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    out = subprocess.run([start.argv[0], "-c", PROBE], env=env, cwd=start.cwd, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    module, pyc, prefix, editable = out[:4]
    assert module == str(Path(start.pythonpath) / "supervisor" / "__init__.py")     # the copy, not the checkout
    assert Path(pyc).is_file()                       # compiled, as the image's last layer is
    assert Path(prefix) == Path(start.argv[0]).parent.parent      # the venv, not the machine's site
    assert editable == "0"                           # no editable-install finder ran at start-up
    assert (Path(prefix) / ".made").read_text() == REQUIREMENTS.read_text()   # made from the image's pins


def test_the_image_start_runs_the_supervisor(tmp_path: Path) -> None:
    start = image_start(tmp_path)
    r = subprocess.run([*start.argv, "--help"], env=start.env(dict(os.environ)), cwd=start.cwd,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "run" in r.stdout
