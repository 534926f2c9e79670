"""What may import what: the product (supervisor/, images/, build.py), the benches (bench/), the
scripts (scripts/) and the dev package (kiln_dev/) never import test code, and the product never
imports kiln_dev (an image ships without it). Regression for issue 16: the README's main job ran
`python3 -m tests.support.models` and eight benches imported tests.support.*.

And kiln_dev imports without numpy or gguf: the model makers load them only when they write a model.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
NO_TESTS = ("bench", "scripts", "supervisor", "images", "kiln_dev", "build.py")
PRODUCT = ("supervisor", "images", "build.py")
# Text that runs or names test code: `-m tests.x`, tests.support / tests/support, "tests" / "support".
TEST_CODE_TEXT = re.compile(r"-m\s+tests\.|\btests[./]support\b|[\"']tests[\"']\s*/\s*[\"']support[\"']")


def tracked_files(*roots: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *roots],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return [REPO / f for f in out if (REPO / f).is_file()]


def imported_modules(path: Path, root: Path = REPO) -> list[tuple[int, str]]:
    """(line, module) of every import in a Python file under root, relative ones resolved within its
    package; `from a import b` counts as both a and a.b (b may be a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = path.relative_to(root).parent.parts
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                mod = ".".join(p for p in (base, node.module or "") if p)
            else:
                mod = node.module or ""
            found += [(node.lineno, mod)] + [(node.lineno, f"{mod}.{a.name}") for a in node.names]
    return found


def offenders(roots: tuple[str, ...], banned: tuple[str, ...]) -> list[str]:
    bad = []
    for path in tracked_files(*roots):
        if path.suffix != ".py":
            continue
        for line, mod in imported_modules(path):
            if mod.split(".")[0] in banned:
                bad.append(f"{path.relative_to(REPO)}:{line}: imports {mod}")
    return bad


def test_product_benches_scripts_and_kiln_dev_never_import_tests() -> None:
    assert offenders(NO_TESTS, ("tests",)) == []


def test_nothing_outside_tests_runs_or_names_test_code() -> None:
    bad = []
    for path in tracked_files(*NO_TESTS):
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary
        for n, line in enumerate(text.splitlines(), 1):
            if TEST_CODE_TEXT.search(line):
                bad.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert bad == []


def test_the_product_never_imports_kiln_dev() -> None:
    assert offenders(PRODUCT, ("kiln_dev",)) == []


def test_the_scan_sees_an_import_of_tests(tmp_path: Path) -> None:
    # The scan must be able to fail: imports of test code, absolute, from-style or relative, are found.
    (tmp_path / "tests" / "support").mkdir(parents=True)
    probe = tmp_path / "tests" / "support" / "probe.py"
    probe.write_text("import tests.support.hw\nfrom tests import conftest\nfrom . import models\n")
    mods = [m for _, m in imported_modules(probe, tmp_path)]
    assert {"tests.support.hw", "tests.conftest", "tests.support.models"} <= set(mods)
    assert TEST_CODE_TEXT.search('model="$(python3 -m tests.support.models smollm2)"')
    assert TEST_CODE_TEXT.search('FAKE = REPO / "tests" / "support" / "fake_llama_server.py"')
    assert not TEST_CODE_TEXT.search("tests/fixtures/engine-logs")  # data beside its provenance is fine


def kiln_dev_modules() -> list[str]:
    mods = []
    for path in sorted((REPO / "kiln_dev").rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        mods.append(".".join(parts))
    return mods


def test_kiln_dev_imports_without_numpy_or_gguf() -> None:
    mods = kiln_dev_modules()
    assert {"kiln_dev.models", "kiln_dev.hub.server", "kiln_dev.children"} <= set(mods)
    code = (
        "import importlib, json, sys\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in ('numpy', 'gguf') if m in sys.modules)))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []


def test_sizing_a_model_needs_no_numpy() -> None:
    # gguf_nbytes is arithmetic on the tensor plan: a bench sizes a model before writing it.
    code = "import sys\nfrom kiln_dev import models\nprint(models.gguf_nbytes(), 'numpy' in sys.modules)\n"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    nbytes, numpy_loaded = r.stdout.split()
    assert int(nbytes) > 200_000 and numpy_loaded == "False"
