"""No bare `wait` in any shell we ship.

Regression for the field notes' trap "bare `wait` kills the hot-reload watcher": llama-server runs
with `&`, so a later `wait` without a pid waits for it forever and the watcher never starts.
Always `wait "$pid"`.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNTRACKED_DIRS = ("images", "scripts", ".ci")  # new files there are checked before `git add`

# `wait` as a command (line start, after ; & | ( { !, or then/do/else), with no pid after it:
# only options like -n, then end of line, a comment, ; && || ) or }.
BARE_WAIT = re.compile(
    r"(?:^|[;&|({!]|\b(?:then|do|else)\b)\s*wait(?:\s+-[nf]+)*\s*(?:$|#|;|&&|\|\||\)|\})"
)
SHELL_SHEBANG = re.compile(rb"^#!\s*\S*(?:/|env\s+)(?:ba|da|k|z)?sh\b")


def is_checked(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return (
        name.endswith((".sh", ".bash", ".j2", ".jinja"))
        or name.startswith("Dockerfile")
        or rel.startswith(".ci/")
    )


def has_shell_shebang(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return bool(SHELL_SHEBANG.match(f.readline(200)))
    except OSError:
        return False


def candidate_files() -> list[str]:
    try:
        tracked = _git("ls-files", "-z")
        untracked = _git("ls-files", "-z", "--others", "--exclude-standard", "--", *UNTRACKED_DIRS)
        rels = sorted(set(tracked) | set(untracked))
    except (OSError, subprocess.CalledProcessError):
        # Not a git checkout (e.g. an exported tree): walk it instead.
        rels = _walk()
    return [r for r in rels if (REPO / r).is_file() and (is_checked(r) or has_shell_shebang(REPO / r))]


def _walk() -> list[str]:
    out = []
    for d, dirs, files in os.walk(REPO):
        dirs[:] = [x for x in dirs if x != ".git"]
        out += [str(Path(d, f).relative_to(REPO)) for f in files]
    return sorted(out)


def _git(*args: str) -> list[str]:
    out = subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True).stdout
    return [p.decode() for p in out.split(b"\0") if p]


def bare_waits(text: str) -> list[int]:
    """1-based line numbers with a bare wait; whole-line comments are skipped."""
    return [
        n
        for n, line in enumerate(text.splitlines(), 1)
        if not line.lstrip().startswith("#") and BARE_WAIT.search(line)
    ]


@pytest.mark.parametrize(
    "line",
    ["wait", "  wait  # x", "foo & wait", "sleep 1; wait", "if x; then wait; fi", "wait -n",
     "wait && echo done", "wait || true", "( wait )", "for j in 1; do wait; done", "wait;"],
)
def test_regex_flags_bare_wait(line: str) -> None:
    assert bare_waits(line) == [1]


@pytest.mark.parametrize(
    "line",
    ['wait "$pid"', "wait $!", 'wait "${pids[@]}"', "wait -n \"$a\" \"$b\"", "await foo()",
     "waiting", "echo waiting for it", "# wait for it", "wait_for_port 8080", "wait-for-it db:5432",
     "RUN echo 'please wait'"],
)
def test_regex_passes_waits_with_a_pid_and_other_words(line: str) -> None:
    assert bare_waits(line) == []


def test_selection_covers_shell_templates_and_ci() -> None:
    for rel in ("images/entrypoint.sh", "images/x/Dockerfile.j2", "images/t.jinja", "Dockerfile",
                "images/Dockerfile.cuda", ".ci/run"):
        assert is_checked(rel), rel
    assert not is_checked("supervisor/process/managed.py")


def test_no_bare_wait_in_shell_scripts() -> None:
    found = []
    for rel in candidate_files():
        text = (REPO / rel).read_text(encoding="utf-8", errors="replace")
        found += [f"{rel}:{n}: {text.splitlines()[n - 1].strip()}" for n in bare_waits(text)]
    assert not found, 'bare `wait` (use `wait "$pid"`):\n' + "\n".join(found)
