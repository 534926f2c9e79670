"""Binaries artifact: names pin identity, pack is deterministic, and nothing wrong gets executed.

The field notes published compiled llama-server to the Hub as a tarball whose name pins base image, CUDA
version and GPU arch "so a mismatched tarball can never be picked up silently", smoke-tested with
`llama-server --version` before it is trusted. These tests hold images/binaries/artifacts.py to that: a
fake prefix (a shell script standing in for llama-server) for the mechanics, and the real binary
where one has been compiled (kiln_dev.engine: $KILN_LLAMA_PREFIX, else the cached CPU compile).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `pytest` without `python -m` doesn't put the repo root on sys.path
    sys.path.insert(0, str(ROOT))

from images.binaries.artifacts import (
    ArtifactCorrupt,
    ArtifactError,
    ArtifactMismatch,
    ArtifactSpec,
    ArtifactUnsafe,
    SmokeTestFailed,
    build_config_hash,
    extract_and_smoke,
    os_identity,
    pack,
    patch_set_hash,
    spec_from_dict,
    verify,
)
from kiln_dev.engine import require_prefix  # noqa: E402
from supervisor.errors import FetchError  # noqa: E402

SDIST_SHA = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SCRIPT_SHA = "5" * 64
CFG = build_config_hash(["-DGGML_NATIVE=OFF"], SCRIPT_SHA)

CPU = ArtifactSpec(
    engine="llama.cpp", source=f"sdist:sha256:{SDIST_SHA}", patch_set="none", cuda="none",
    archs="cpu", build_config=CFG, base="os:debian-12",
)
BASE_DIGEST = "sha256:" + "ab" * 32
CUDA = ArtifactSpec(
    engine="llama.cpp", source=f"git:https://github.com/ggml-org/llama.cpp@{COMMIT}",
    patch_set=patch_set_hash({"fit.patch": "c" * 64}), cuda="12.8", archs="86-90",
    build_config=CFG, base=BASE_DIGEST,
)
FAKE_VERSION = "version: 1 (test)"


def make_prefix(root: Path, script: str = f'echo "{FAKE_VERSION}" >&2\n') -> Path:
    """A compiled-prefix look-alike: bin/llama-server is a shell script, plus the share/kiln files."""
    (root / "bin").mkdir(parents=True)
    (root / "share" / "kiln").mkdir(parents=True)
    binary = root / "bin" / "llama-server"
    binary.write_text("#!/bin/sh\n" + script)
    binary.chmod(0o755)
    (root / "share" / "kiln" / "llama-server.version.txt").write_text(f"{FAKE_VERSION}\nbuilt with test\n")
    (root / "share" / "kiln" / "llama-server.help.txt").write_text("-m, --model FNAME\n")
    (root / "share" / "kiln" / "build-info.env").write_text("KILN_ENGINE=llama.cpp\n")
    return root


@pytest.fixture
def prefix(tmp_path: Path) -> Path:
    return make_prefix(tmp_path / "prefix")


def tar_with(path: Path, entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = 0o755
    return info


# ----------------------------------------------------------------------------- identity


def test_cpu_name_pins_every_field() -> None:
    assert CPU.name() == (
        f"llama-server_src-b0a2feb64c6f_p-none_cuda-none_arch-cpu_cfg-{CFG[7:19]}_base-os-debian-12.tar.gz"
    )


def test_cuda_name_pins_commit_patches_cuda_arch_and_base_digest() -> None:
    name = CUDA.name()
    assert name == (
        f"llama-server_src-0123456789ab_p-{CUDA.patch_set[7:19]}_cuda-12.8_arch-86-90"
        f"_cfg-{CFG[7:19]}_base-abababababab.tar.gz"
    )
    assert all(c.isalnum() or c in "._-" for c in name)


def test_floating_source_gets_a_distinct_marked_name() -> None:
    main = ArtifactSpec(**{**CPU.to_dict(), "source": "git:https://github.com/ggml-org/llama.cpp#master"})
    other = ArtifactSpec(**{**CPU.to_dict(), "source": "git:https://github.com/ggml-org/llama.cpp#dev"})
    assert main.floating and not CPU.floating
    assert "_src-floating-" in main.name() and main.name() != other.name()


def test_spec_round_trips_through_dict_and_rejects_bad_fields() -> None:
    assert spec_from_dict(CUDA.to_dict()) == CUDA
    with pytest.raises(ArtifactError, match="missing fields \\['base'\\]"):
        spec_from_dict({k: v for k, v in CPU.to_dict().items() if k != "base"})
    with pytest.raises(ArtifactError, match="cuda 'none' goes with archs 'cpu'"):
        spec_from_dict({**CPU.to_dict(), "archs": "86"})
    with pytest.raises(ValueError, match="source"):
        ArtifactSpec(**{**CPU.to_dict(), "source": "sdist:deadbeef"})


def test_patch_set_and_build_config_hashes_ignore_order() -> None:
    assert patch_set_hash({}) == "none"
    a = patch_set_hash({"a.patch": "1" * 64, "b.patch": "2" * 64})
    assert a == patch_set_hash({"b.patch": "2" * 64, "a.patch": "1" * 64})
    text = f"a.patch:{'1' * 64}\nb.patch:{'2' * 64}\n"
    assert a == "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    assert build_config_hash(["-DA=1", "-DB=2"], SCRIPT_SHA) == build_config_hash(["-DB=2", "-DA=1"], SCRIPT_SHA)
    assert build_config_hash(["-DA=1"], SCRIPT_SHA) != build_config_hash(["-DA=1"], "6" * 64)
    with pytest.raises(ValueError):
        patch_set_hash({"a.patch": "not-a-sha"})
    assert patch_set_hash({"a.patch": "floating"}) != patch_set_hash({"b.patch": "floating"})


def test_os_identity_reads_os_release(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "os-release").write_text('PRETTY_NAME="Ubuntu 22.04.4 LTS"\nID=ubuntu\nVERSION_ID="22.04"\n')
    assert os_identity(tmp_path) == "os:ubuntu-22.04"
    (tmp_path / "etc" / "os-release").write_text("ID=arch\n")  # rolling: no VERSION_ID
    assert os_identity(tmp_path) == "os:arch-unversioned"
    assert ArtifactSpec(**{**CPU.to_dict(), "base": os_identity(tmp_path)}).name().endswith("_base-os-arch-unversioned.tar.gz")


# ----------------------------------------------------------------------------- pack, verify, extract


def test_pack_verify_extract_round_trip(prefix: Path, tmp_path: Path) -> None:
    packed = pack(prefix, CPU, tmp_path / "out")
    assert packed.tarball.name == CPU.name()
    stem = CPU.name().removesuffix(".tar.gz")
    assert packed.manifest.name == stem + ".manifest.json" and packed.sha256_file.name == stem + ".sha256"
    assert packed.sha256_file.read_text() == f"{packed.sha256}  {CPU.name()}\n"

    manifest = verify(packed.tarball, packed.manifest, CPU, expected_sha256=packed.sha256)
    assert manifest["schema"] == 1 and manifest["spec"] == CPU.to_dict()
    assert manifest["tarball"] == CPU.name() and manifest["tarball_sha256"] == packed.sha256
    assert manifest["llama_server_version"] == FAKE_VERSION
    assert manifest["created_by"].startswith("kiln ")
    assert set(manifest["files"]) == {
        "bin/llama-server", "share/kiln/llama-server.help.txt",
        "share/kiln/llama-server.version.txt", "share/kiln/build-info.env",
    }
    assert manifest["files"]["bin/llama-server"] == hashlib.sha256((prefix / "bin/llama-server").read_bytes()).hexdigest()

    dest = extract_and_smoke(packed.tarball, manifest, tmp_path / "opt" / "llama")
    assert (dest / "bin" / "llama-server").read_bytes() == (prefix / "bin" / "llama-server").read_bytes()
    assert os.access(dest / "bin" / "llama-server", os.X_OK)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["llama"]  # no temp dir left behind


def test_sha256_file_checks_with_sha256sum(prefix: Path, tmp_path: Path) -> None:
    if shutil.which("sha256sum") is None:
        pytest.skip("sha256sum is not installed")
    packed = pack(prefix, CPU, tmp_path / "out")
    done = subprocess.run(["sha256sum", "--check", packed.sha256_file.name], cwd=packed.tarball.parent,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_pack_is_deterministic(prefix: Path, tmp_path: Path) -> None:
    first = pack(prefix, CPU, tmp_path / "one")
    # Same bytes, different metadata: mtimes, and a copy made elsewhere with another umask.
    os.utime(prefix / "bin" / "llama-server", (1_000_000, 1_000_000))
    copy = tmp_path / "copy"
    shutil.copytree(prefix, copy)
    (copy / "share" / "kiln" / "build-info.env").chmod(0o600)
    second = pack(copy, CPU, tmp_path / "two")
    assert first.sha256 == second.sha256
    assert first.tarball.read_bytes() == second.tarball.read_bytes()
    with tarfile.open(first.tarball) as tar:
        names = tar.getnames()
        assert names == sorted(names)
        assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" for m in tar.getmembers())


def test_corrupted_tarball_is_refused_as_corruption(prefix: Path, tmp_path: Path) -> None:
    packed = pack(prefix, CPU, tmp_path / "out")
    data = bytearray(packed.tarball.read_bytes())
    data[len(data) // 2] ^= 0x01
    packed.tarball.write_bytes(bytes(data))
    with pytest.raises(ArtifactCorrupt, match="corrupt or incomplete") as err:
        verify(packed.tarball, packed.manifest, CPU)
    assert not isinstance(err.value, ArtifactMismatch)
    assert isinstance(err.value, FetchError)  # fits the supervisor's error tree


def test_lock_pinned_sha256_must_match(prefix: Path, tmp_path: Path) -> None:
    packed = pack(prefix, CPU, tmp_path / "out")
    with pytest.raises(ArtifactCorrupt, match="the lock pins"):
        verify(packed.tarball, packed.manifest, CPU, expected_sha256="0" * 64)


def test_tarball_for_another_arch_is_refused_naming_the_field(prefix: Path, tmp_path: Path) -> None:
    built_for_90 = ArtifactSpec(**{**CUDA.to_dict(), "archs": "90"})
    expected_86 = ArtifactSpec(**{**CUDA.to_dict(), "archs": "86"})
    packed = pack(prefix, built_for_90, tmp_path / "out")
    with pytest.raises(ArtifactMismatch) as err:
        verify(packed.tarball, packed.manifest, expected_86)
    assert err.value.differences == [("archs", "86", "90")]
    assert "archs: expected 86, found 90 — this tarball was built for another GPU arch" in str(err.value)


def test_every_differing_field_is_listed(prefix: Path, tmp_path: Path) -> None:
    packed = pack(prefix, CPU, tmp_path / "out")
    with pytest.raises(ArtifactMismatch) as err:
        verify(packed.tarball, packed.manifest, CUDA)
    assert [d[0] for d in err.value.differences] == ["source", "patch_set", "cuda", "archs", "base"]


def test_renamed_tarball_is_refused(prefix: Path, tmp_path: Path) -> None:
    packed = pack(prefix, CPU, tmp_path / "out")
    renamed = packed.tarball.with_name(CPU.name().replace("arch-cpu", "arch-86"))
    packed.tarball.rename(renamed)
    with pytest.raises(ArtifactMismatch, match="tarball name: expected .*arch-cpu.*, found .*arch-86") as err:
        verify(renamed, packed.manifest, CPU)
    assert err.value.differences[0][0] == "tarball name"


@pytest.mark.parametrize("evil", ["../evil", "bin/../../evil", "/tmp/kiln-evil-absolute"])
def test_escaping_entry_is_refused_at_extraction(evil: str, tmp_path: Path) -> None:
    tarball = tar_with(tmp_path / "evil.tar.gz", [(member("bin", tarfile.DIRTYPE), None), (member(evil), b"pwned")])
    dest = tmp_path / "box" / "dest"
    with pytest.raises(ArtifactUnsafe):
        extract_and_smoke(tarball, {"files": {}}, dest)
    assert not dest.exists() and list((tmp_path / "box").iterdir()) == []
    assert not (tmp_path / "box" / "evil").exists() and not (tmp_path / "evil").exists()
    assert not Path("/tmp/kiln-evil-absolute").exists()


@pytest.mark.parametrize("entries", [
    [(member("out", tarfile.SYMTYPE, "../../etc"), None)],
    [(member("abs", tarfile.SYMTYPE, "/etc"), None)],
    # "here" -> "." is harmless alone; "here/up" -> ".." only escapes through the real path.
    [(member("here", tarfile.SYMTYPE, "."), None), (member("here/up", tarfile.SYMTYPE, ".."), None),
     (member("here/up/x"), b"x")],
    [(member("dev", tarfile.CHRTYPE), None)],
    [(member("fifo", tarfile.FIFOTYPE), None)],
    [(member("hard", tarfile.LNKTYPE, "bin/llama-server"), None)],
])
def test_links_and_devices_are_refused(entries: list, tmp_path: Path) -> None:
    tarball = tar_with(tmp_path / "t.tar.gz", entries)
    dest = tmp_path / "box" / "dest"
    with pytest.raises(ArtifactUnsafe):
        extract_and_smoke(tarball, {"files": {}}, dest)
    assert list((tmp_path / "box").iterdir()) == []
    assert not (tmp_path / "x").exists()


def test_extracted_files_must_match_manifest(prefix: Path, tmp_path: Path) -> None:
    packed = pack(prefix, CPU, tmp_path / "out")
    manifest = json.loads(packed.manifest.read_text())
    manifest["files"]["share/kiln/build-info.env"] = "0" * 64
    dest = tmp_path / "dest"
    with pytest.raises(ArtifactCorrupt, match="build-info.env: sha256"):
        extract_and_smoke(packed.tarball, manifest, dest)
    assert not dest.exists()


def test_failing_version_is_refused_and_dest_removed(tmp_path: Path) -> None:
    broken = make_prefix(tmp_path / "prefix", script='echo "error while loading shared libraries: libcuda.so.1" >&2\nexit 127\n')
    packed = pack(broken, CPU, tmp_path / "out")
    manifest = verify(packed.tarball, packed.manifest, CPU)
    dest = tmp_path / "opt" / "llama"
    dest.mkdir(parents=True)  # an empty dest the caller made: gone afterwards all the same
    with pytest.raises(SmokeTestFailed, match="exited with 127:\n.*libcuda.so.1"):
        extract_and_smoke(packed.tarball, manifest, dest)
    assert not dest.exists() and list(dest.parent.iterdir()) == []


def test_version_without_version_line_is_refused(tmp_path: Path) -> None:
    quiet = make_prefix(tmp_path / "prefix", script="echo hello\n")
    packed = pack(quiet, CPU, tmp_path / "out")
    with pytest.raises(SmokeTestFailed, match="no 'version:' line"):
        extract_and_smoke(packed.tarball, json.loads(packed.manifest.read_text()), tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_hung_version_times_out(tmp_path: Path) -> None:
    hung = make_prefix(tmp_path / "prefix", script="exec sleep 30\n")
    packed = pack(hung, CPU, tmp_path / "out")
    with pytest.raises(SmokeTestFailed, match="did not finish within 0.5 s"):
        extract_and_smoke(packed.tarball, json.loads(packed.manifest.read_text()), tmp_path / "dest", timeout_s=0.5)
    assert not (tmp_path / "dest").exists()


def test_smoke_env_is_passed(tmp_path: Path) -> None:
    needs_env = make_prefix(tmp_path / "prefix", script=f'[ "$KILN_STUB" = yes ] || exit 3\necho "{FAKE_VERSION}" >&2\n')
    packed = pack(needs_env, CPU, tmp_path / "out")
    manifest = json.loads(packed.manifest.read_text())
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KILN_STUB": "yes"}
    assert extract_and_smoke(packed.tarball, manifest, tmp_path / "dest", env=env).is_dir()


def test_non_empty_dest_is_left_alone(prefix: Path, tmp_path: Path) -> None:
    packed = pack(prefix, CPU, tmp_path / "out")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep").write_text("mine")
    with pytest.raises(ArtifactError, match="not an empty directory"):
        extract_and_smoke(packed.tarball, json.loads(packed.manifest.read_text()), dest)
    assert (dest / "keep").read_text() == "mine"


def test_pack_refuses_a_prefix_without_llama_server(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match="not a compiled prefix"):
        pack(tmp_path / "empty", CPU, tmp_path / "out")


# ----------------------------------------------------------------------------- the real binary


def _spec_for(prefix: Path) -> ArtifactSpec:
    """The spec the compile step's build-info.env describes (source sha and archs; the rest is local)."""
    info = dict(line.split("=", 1) for line in (prefix / "share/kiln/build-info.env").read_text().splitlines() if "=" in line)
    source = info.get("KILN_SOURCE", "")
    sha = source.rsplit("@sha256:", 1)[-1] if source.startswith("sdist:") else ""
    commit = info.get("KILN_ENGINE_COMMIT", "")
    src = f"sdist:sha256:{sha}" if len(sha) == 64 else source.split("@")[0] + f"@{commit}"
    archs = info.get("KILN_CUDA_ARCHS", "none").replace(";", "-")
    cpu = archs == "none"
    return ArtifactSpec(
        engine="llama.cpp", source=src, patch_set="none", cuda="none" if cpu else "12.8",
        archs="cpu" if cpu else archs, build_config=CFG, base=os_identity(),
    )


@pytest.mark.llama
def test_real_llama_server_packs_and_smokes(tmp_path: Path) -> None:
    prefix = require_prefix()  # Unavailable -> skip here, fail in CI (tests/conftest.py)
    spec = _spec_for(prefix)
    if spec.cuda != "none":
        pytest.skip("the real prefix is a CUDA build; this test smokes CPU builds only")
    packed = pack(prefix, spec, tmp_path / "out")
    manifest = verify(packed.tarball, packed.manifest, spec, expected_sha256=packed.sha256)
    assert manifest["llama_server_version"].startswith("version:")
    dest = extract_and_smoke(packed.tarball, manifest, tmp_path / "llama", timeout_s=60)
    assert (dest / "bin" / "llama-server").stat().st_size == (prefix / "bin" / "llama-server").stat().st_size
