"""Where a build leaves its SBOM and provenance predicate, and writing them there.

    <out>/attest/sbom.spdx.json              the SPDX 2.3 document (sbom.py)
    <out>/attest/provenance.predicate.json   the SLSA provenance v1 predicate, no statement around it

<out> is `build --out DIR`, by default build-out/<target>/ in the directory build.py runs in. Each
file is written whole under a temporary name and renamed, so a reader never sees half of one; an
earlier build's files are replaced, and nothing else in <out> is touched.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

ATTEST_DIR = "attest"
SBOM_FILE = "sbom.spdx.json"
PREDICATE_FILE = "provenance.predicate.json"
DEFAULT_OUT = Path("build-out")


def default_out(target: str) -> Path:
    return DEFAULT_OUT / target


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_build(out: Path, sbom: dict[str, Any], predicate: dict[str, Any]) -> tuple[Path, Path]:
    """Write a build's two files under <out>/attest/; returns their paths."""
    d = Path(out) / ATTEST_DIR
    return write_json(d / SBOM_FILE, sbom), write_json(d / PREDICATE_FILE, predicate)
