"""The vLLM stand-in (kiln_dev/fake_vllm.py) is for what a CPU cannot show (issue 36): every test that
still boots or reads it says why in a `# stand-in: ...` line; everything else runs the real engine
(tests/integration/test_vllm_real.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
USES = re.compile(r"FAKE_VLLM|fake_vllm(?!_site)|vllm_config\(|KILN_FAKE_SCENARIO\"?: \"vllm")   # fake_vllm_site: ELF headers only


def unexplained(root: Path = ROOT) -> list[str]:
    out = []
    for f in sorted((root / "tests").rglob("test_*.py")):
        text = f.read_text(encoding="utf-8")
        for fn in ast.walk(ast.parse(text)):
            if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_"):
                body = ast.get_source_segment(text, fn) or ""
                if USES.search(body) and "# stand-in:" not in body:
                    out.append(f"{f.relative_to(root)}::{fn.name}")
    return out


def test_every_test_on_the_vllm_stand_in_says_why():
    assert unexplained() == []


def test_the_check_itself_can_fail(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "def test_a():\n    run(FAKE_VLLM)\n\n\ndef test_b():\n    # stand-in: a GPU-only thing\n    run(FAKE_VLLM)\n")
    assert unexplained(tmp_path) == ["tests/test_x.py::test_a"]
