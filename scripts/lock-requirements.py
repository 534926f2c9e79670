#!/usr/bin/env python3
"""Deprecated: supervisor/requirements.txt is written by `python build.py generate` now (with every
other generated file; `--only requirements` for this one, `--check` to verify it). This spelling
forwards there for one release (images/pins/requirements.py does the work)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from images.deprecated import forward  # noqa: E402  (the checkout's root is on sys.path only now)

if __name__ == "__main__":
    sys.exit(forward("scripts/lock-requirements.py", ["generate", "--only", "requirements", *sys.argv[1:]]))
