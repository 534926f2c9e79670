"""No path a doc names can go stale (issue 35: docs/architecture.md named files at paths that no longer
existed). Every `code` span in docs/architecture.md and README.md that looks like a path of this
checkout must exist: as written from the repository's root, or under supervisor/ or images/ (the docs
say `run/launch.py` for supervisor/run/launch.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("docs/architecture.md", "README.md")
SPAN = re.compile(r"`([^`\s]+)`")
PATHLIKE = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*(\.py|\.md|\.sh|\.toml|/)")
BASES = ("", "supervisor/", "images/", "../")     # ../: shared/, the folder beside the checkout
MADE_AT_RUN_TIME = {"bench/out/": "where the benches keep every run (made by the first one)"}


def named_paths(text: str) -> list[str]:
    out = []
    for span in SPAN.findall(text):
        span = span.rstrip(",.;:)")
        if "/" in span and PATHLIKE.fullmatch(span) and not span.startswith(("/", "http")):
            out.append(span)
    return out


def missing(paths: list[str], root: Path = ROOT) -> list[str]:
    return sorted({p for p in paths if p not in MADE_AT_RUN_TIME
                   and not any((root / base / p).exists() for base in BASES)})


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_a_doc_names_exists(doc):
    assert missing(named_paths((ROOT / doc).read_text(encoding="utf-8"))) == []


def test_the_check_itself_can_fail(tmp_path):
    (tmp_path / "supervisor" / "run").mkdir(parents=True)
    (tmp_path / "supervisor" / "run" / "loop.py").write_text("")
    text = "see `run/loop.py`, `lifecycle/loop.py` and `supervisor/run/` (not `--flag` or `/etc/x`)"
    assert missing(named_paths(text), tmp_path) == ["lifecycle/loop.py"]
