"""The README opens with the two commands (dumb-init's README practice, STYLE.md): its first two shell
blocks are exactly the main job and the test command, and CI runs that same test command (issue 18: the
second shell block was an explanatory build.py line)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL_LANGS = {"sh", "bash", "shell", "console", "zsh"}
MAIN_JOB = "bash scripts/quickstart.sh"
TEST_COMMAND = "bash scripts/test.sh"


def fenced_blocks(markdown: str) -> list[tuple[str, str]]:
    """(language, body) of every ``` fenced block, in order."""
    return [(m.group(1).strip().lower(), m.group(2))
            for m in re.finditer(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", markdown, re.MULTILINE | re.DOTALL)]


def commands(body: str) -> list[str]:
    """A shell block's commands: comments and blank lines dropped, continuation lines joined."""
    joined = re.sub(r"\s*\\\n\s*", " ", body)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_the_first_two_shell_blocks_are_the_main_job_and_the_test_command():
    shell = [body for lang, body in fenced_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
             if lang in SHELL_LANGS]
    assert len(shell) >= 2
    assert commands(shell[0]) == [MAIN_JOB]
    assert commands(shell[1]) == [TEST_COMMAND]
    assert (ROOT / "scripts" / "quickstart.sh").is_file() and (ROOT / "scripts" / "test.sh").is_file()


def test_ci_runs_the_readmes_test_command():
    ci = commands((ROOT / ".ci" / "run").read_text(encoding="utf-8"))
    assert TEST_COMMAND in ci


def test_the_block_parser_sees_languages_and_skips_comments():
    md = "x\n```sh\n# c\nbash a.sh \\\n  --flag\n```\n```text\nnot shell\n```\n"
    assert fenced_blocks(md) == [("sh", "# c\nbash a.sh \\\n  --flag\n"), ("text", "not shell\n")]
    assert commands(fenced_blocks(md)[0][1]) == ["bash a.sh --flag"]


def test_no_other_fenced_block_comes_before_the_test_command():
    # A reader (or a tool) that treats every ``` as a shell block must meet the same two commands
    # first: an explanatory ```text block between them was read as the second command.
    blocks = fenced_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    assert [commands(body) for _, body in blocks[:2]] == [[MAIN_JOB], [TEST_COMMAND]]


def test_the_readmes_render_examples_render(tmp_path):
    # Issue 24, item 11: the first build example, `render --target a40-llamacpp --out D`, exited 2 (that
    # target has unresolved pins and needs --allow-floating). Every concrete render example must work.
    examples = [c.split("  #")[0].strip() for _, body in fenced_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
                for c in commands(body) if c.startswith("python build.py render")]
    concrete = [c for c in examples if " T " not in f"{c} "]
    assert concrete, examples
    for i, command in enumerate(concrete):
        words = command.split()[2:]                       # after "python build.py"
        words = [str(tmp_path / f"out{i}") if w == "D" else w for w in words]
        r = subprocess.run([sys.executable, "build.py", *words], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, f"{command}: {r.stderr}"


def test_the_front_doors_stay_short():
    # Issue 48: the README was 968 lines and benchmarks.md a 1,410-line lab notebook. The README opens the
    # project in at most 300 lines with "Serve your own model"; benchmarks.md opens with its results table
    # in at most 400 (the run-by-run history lives in docs/research/benchmarks-history.md).
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    bench = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert readme.count("\n") <= 300 and "## Serve your own model" in readme
    assert bench.count("\n") <= 400 and bench.index("## Results") < bench.index("\n## P1")
