"""No path a doc names can go stale (issue 35: docs/architecture.md named files at paths that no longer
existed). Every `code` span in README.md, docs/architecture.md, docs/field-notes.md and the task pages the
README's content moved to (DOCS) that looks like a path of this checkout must exist: as written from the repository's root, or under supervisor/ or images/ (the docs
say `run/launch.py` for supervisor/run/launch.py).

The field notes Kiln relies on live in the clone (issue 48): every citation of them (`field notes`, the
section sign, then a heading in double quotes) names a heading of docs/field-notes.md, and no file names the folder the notes once lived in, beside
the checkout (docs/research/ keeps its dated records as they were)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("docs/architecture.md", "README.md", "docs/field-notes.md", "docs/images.md", "docs/plan.md", "docs/pods.md",
        "docs/endpoints.md", "docs/router.md", "docs/clusters.md", "docs/supervisor.md", "docs/fleet-and-reload.md",
        "docs/upgrade.md", "docs/development.md")
SPAN = re.compile(r"`([^`\s]+)`")
PATHLIKE = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*(\.py|\.md|\.sh|\.toml|/)")
BASES = ("", "supervisor/", "images/")     # never "../": a doc names nothing outside the clone
MADE_AT_RUN_TIME = {"bench/out/": "where the benches keep every run (made by the first one)",
                    ".venv/": "the virtual environment scripts/dev-setup.sh makes in the checkout"}


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


# -- field notes citations ---------------------------------------------------------------------------
FIELD_NOTES = "docs/field-notes.md"
CITING = ("README.md", "CHANGELOG.md", "build.py", "docs", "supervisor", "images", "kiln_dev", "bench",
          "tests", "scripts")
SKIP_DIRS = {"__pycache__", ".venv", "node_modules", ".git"}
SECTION = "\u00a7"                                   # the section sign, spelled so this file cites nothing
CITATION = re.compile(SECTION + r' "([^"\n]+)"')
UNCLOSED = re.compile(SECTION + r' "[^"\n]*$', re.M)  # a heading wrapped onto the next line: unchecked
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
# The notes' old home, beside the checkout; spelled in pieces so this file does not name it.
OLD_HOME = re.compile("shared/" + "seed|" + re.escape("..") + "/shared")


def texts(root: Path, tops: tuple[str, ...]) -> dict[str, str]:
    """Relative path -> text of every readable text file under `tops` (files or folders) of `root`."""
    out: dict[str, str] = {}
    for top in tops:
        base = root / top
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []
        for f in files:
            rel = f.relative_to(root)
            if SKIP_DIRS & set(rel.parts) or rel.parts[:2] == ("bench", "out"):
                continue
            try:
                out[rel.as_posix()] = f.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
    return out


def headings(text: str) -> set[str]:
    """Every Markdown heading of `text` (any level), outside fenced code blocks."""
    found, fenced = set(), False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            found.add(m.group(1))
    return found


def bad_citations(files: dict[str, str], known: set[str]) -> list[str]:
    """'path:line: problem' for every citation that names no heading, or whose heading is cut by a line end."""
    out = []
    for rel, text in files.items():
        for m in CITATION.finditer(text):
            if m.group(1) not in known:
                out.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: no heading {m.group(1)!r} in {FIELD_NOTES}")
        for m in UNCLOSED.finditer(text):
            out.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: a cited heading must be on one line")
    return sorted(out)


def test_every_field_notes_citation_names_a_heading_of_the_field_notes():
    known = headings((ROOT / FIELD_NOTES).read_text(encoding="utf-8"))
    files = texts(ROOT, CITING)
    assert sum(len(CITATION.findall(t)) for t in files.values()) > 50       # the scan reaches the citations
    assert bad_citations(files, known) == []


def test_the_citation_check_itself_can_fail(tmp_path):
    notes = "# Field notes\n\n## Autofit and placement flags\n\n```\n## not a heading\n```\n"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "field-notes.md").write_text(notes)
    (tmp_path / "supervisor").mkdir()
    (tmp_path / "supervisor" / "a.py").write_text(
        f'# field notes {SECTION} "Autofit and placement flags"\n'
        f'# field notes {SECTION} "Result: 7.3 tok/s"\n'
        f'# field notes {SECTION} "not a heading"\n'
        f'# field notes {SECTION} "Autofit and\n# placement flags"\n')
    known = headings(notes)
    assert known == {"Field notes", "Autofit and placement flags"}
    assert bad_citations(texts(tmp_path, CITING), known) == [
        f"supervisor/a.py:2: no heading 'Result: 7.3 tok/s' in {FIELD_NOTES}",
        f"supervisor/a.py:3: no heading 'not a heading' in {FIELD_NOTES}",
        "supervisor/a.py:4: a cited heading must be on one line",
    ]


def tracked(root: Path) -> list[str]:
    """The checkout's tracked files (git ls-files), else every file under root."""
    try:
        r = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True)
        return [p for p in r.stdout.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def naming_the_old_home(root: Path) -> list[str]:
    out = []
    for rel in tracked(root):
        if rel.startswith("docs/research/") or not (root / rel).is_file():
            continue
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out += [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}" for m in OLD_HOME.finditer(text)]
    return out


def test_no_file_names_the_folder_beside_the_checkout():
    assert naming_the_old_home(ROOT) == []


def test_the_old_home_check_itself_can_fail(tmp_path):
    (tmp_path / "docs" / "research").mkdir(parents=True)
    (tmp_path / "docs" / "research" / "2026-11-30.md").write_text("then: " + "shared/" + "seed/FINDINGS.md\n")
    (tmp_path / "README.md").write_text("see `docs/field-notes.md`\n")
    (tmp_path / "a.py").write_text("# " + ".." + "/shared/x\n")
    (tmp_path / "b.md").write_text("one\n" + "shared/" + "seed/FINDINGS.md\n")
    assert naming_the_old_home(tmp_path) == ["a.py:1", "b.md:2"]
