#!/usr/bin/env python3
"""The image's venv on the device (issue 38): kiln_dev/image_start.py's ensure_venv, from the wheels
carried in $KILN_IMAGE_WHEELS (the device has no internet), so bench/coldstart.py starts Kiln as an
image does. A distribution Python may lack ensurepip (Ubuntu's without python3-venv), so `python3 -m
venv` cannot put pip in the venv; then the venv is made --without-pip and this interpreter's own pip
installs the same hash-pinned requirements into it. Prints the venv's path.

    KILN_IMAGE_WHEELS=DIR PYTHONPATH=KILN python3 scripts/device/image_venv.py
    KILN_VENV_NO_ENSUREPIP=1 ...      take the second way (the CPU dry run of it)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from kiln_dev import Unavailable
from kiln_dev.image_start import REQUIREMENTS, ensure_venv, venv_dir


def without_ensurepip() -> str:
    venv = venv_dir()
    if (venv / ".made").exists():
        return str(venv)
    tmp = venv.with_name(venv.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)          # a half-made venv of ours
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp)], check=True)
    site = subprocess.run([str(tmp / "bin" / "python3"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-cache-dir", "--disable-pip-version-check",
                    "--no-index", "--find-links", os.environ["KILN_IMAGE_WHEELS"], "--require-hashes",
                    "--target", site, "-r", str(REQUIREMENTS)], check=True)
    (tmp / ".made").write_text(REQUIREMENTS.read_text())
    os.replace(tmp, venv)
    return str(venv)


def main() -> int:
    if not os.environ.get("KILN_IMAGE_WHEELS"):
        print("image_venv: KILN_IMAGE_WHEELS=DIR (the carried wheels of supervisor/requirements.txt)", file=sys.stderr)
        return 2
    if os.environ.get("KILN_VENV_NO_ENSUREPIP"):
        print(without_ensurepip())
        return 0
    try:
        print(ensure_venv())
    except (Unavailable, subprocess.CalledProcessError) as e:
        print(f"image_venv: {str(e)[-300:]}; making it --without-pip", file=sys.stderr)
        print(without_ensurepip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
