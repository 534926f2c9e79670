"""What makes a rebuild give the same bytes, checked without compiling or building (the real rebuilds:
tests/integration/test_engine_reproducible.py and test_image_reproducible.py):

- SOURCE_DATE_EPOCH comes from the lock: 00:00 UTC of the day the source pin last changed;
- it is part of the engine tarball's identity, and the packer dates every entry with it;
- the build context build.py writes is dated and its modes normalised (a COPY keeps both);
- the image's Kiln layers are made in stages and copied staged, so no RUN writes into the image itself;
- tarcompare names each way two archives differ, and nothing when they are the same; a rebuild that
  differs stops with both sha256s named (what fails the images workflow before it publishes).
"""

from __future__ import annotations

import dataclasses
import io
import re
import tarfile
from pathlib import Path

import pytest

from images.binaries.artifacts import ArtifactSpec, build_config_hash, pack
from images.binaries.rebuild import RebuildMismatch, check_same
from images.build import layers, render
from images.paths import RENDERED_DIR
from images.pins.lock import Pin, load_lock, pins_for, source_date_epoch
from images.tarcompare import differences
from images.target import load_target
from supervisor.errors import ConfigError

NOV_29 = 1795910400     # 2026-11-29T00:00:00Z: `date -u -d 2026-11-29 +%s`


def test_the_epoch_is_the_day_the_lock_last_changed_the_source_pin():
    target = load_target("cpu-llamacpp")
    pins = pins_for(target, load_lock())
    assert pins["source.sha256"].resolved_on == "2026-11-29"
    assert source_date_epoch(target, pins) == NOV_29
    unresolved = {**pins, "source.sha256": Pin("source.sha256", None, unresolved="offline")}
    assert source_date_epoch(target, unresolved) == 0
    bad = {**pins, "source.sha256": dataclasses.replace(pins["source.sha256"], resolved_on="29/11/2026")}
    with pytest.raises(ConfigError, match=r'cpu-llamacpp\."source.sha256"\.resolved_on'):
        source_date_epoch(target, bad)


def test_the_epoch_is_part_of_the_tarballs_identity():
    flags, script = ["-DGGML_NATIVE=OFF"], "5" * 64
    assert build_config_hash(flags, script, NOV_29) != build_config_hash(flags, script, 0)
    assert build_config_hash(flags, script, NOV_29) != build_config_hash(flags, script)
    with pytest.raises(ValueError, match="source_date_epoch must be whole seconds"):
        build_config_hash(flags, script, -1)


def _prefix(root: Path, build_info: str) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "share" / "kiln").mkdir(parents=True)
    (root / "bin" / "llama-server").write_text("#!/bin/sh\n")
    (root / "bin" / "llama-server").chmod(0o755)
    (root / "share" / "kiln" / "llama-server.version.txt").write_text("version: 1 (test)\n")
    (root / "share" / "kiln" / "build-info.env").write_text(build_info)
    return root


SPEC = ArtifactSpec(engine="llama.cpp", source="sdist:sha256:" + "b" * 64, patch_set="none", cuda="none",
                    archs="cpu", build_config="sha256:" + "c" * 64, base="os:debian-12")


def test_the_packer_dates_every_entry_with_the_epoch_the_compile_recorded(tmp_path):
    packed = pack(_prefix(tmp_path / "p", f"KILN_ENGINE=llama.cpp\nKILN_SOURCE_DATE_EPOCH={NOV_29}\n"),
                  SPEC, tmp_path / "out")
    with tarfile.open(packed.tarball) as tar:
        assert {m.mtime for m in tar.getmembers()} == {NOV_29}
    old = pack(_prefix(tmp_path / "q", "KILN_ENGINE=llama.cpp\n"), SPEC, tmp_path / "old")
    with tarfile.open(old.tarball) as tar:
        assert {m.mtime for m in tar.getmembers()} == {0}          # a prefix from before: as packed then


def test_the_build_context_is_dated_and_its_modes_normalised(tmp_path):
    target = load_target("cpu-llamacpp")
    ctx = render.make_context(target, pins_for(target, load_lock()))
    render.write_context(ctx, tmp_path / "ctx")
    entries = [p for p in (tmp_path / "ctx").rglob("*")] + [tmp_path / "ctx"]
    assert len(entries) > 50
    assert {p.lstat().st_mtime for p in entries} == {NOV_29}
    modes = {p.relative_to(tmp_path).as_posix(): p.lstat().st_mode & 0o7777 for p in entries}
    assert set(modes.values()) <= {0o644, 0o755}
    assert modes["ctx/kiln/compile-llama-server.sh"] == 0o755 and modes["ctx/kiln/requirements.txt"] == 0o644


def _final_stage(dockerfile: str) -> list[str]:
    """The instructions after the last FROM, continuation lines joined."""
    text = re.sub(r"\\\n", " ", dockerfile)
    last = [m.start() for m in re.finditer(r"^FROM ", text, re.M)][-1]
    return [ln for ln in text[last:].splitlines() if ln and not ln.startswith("#")]


@pytest.mark.parametrize("name", ["cpu-llamacpp", "a40-llamacpp-upstream", "router"])
def test_the_image_itself_only_copies_staged_layers(name):
    final = _final_stage((RENDERED_DIR / name / "Dockerfile").read_text())
    assert final[0] == "FROM runtime"
    writes = [ln for ln in final if ln.split()[0] in {"RUN", "COPY", "ADD"}]
    if "llamacpp" in name and load_target(name).cuda_version:
        # The CUDA floor check reads the assembled image; its two steps are the exception, named in the docs.
        writes = [ln for ln in writes if "cuda-floor.py" not in ln]
    assert writes and all(re.fullmatch(r"COPY --from=[a-z-]+ /kiln-layer/ /", ln) for ln in writes), writes


def _tar(path: Path, members: dict[str, tuple[bytes, int]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, (data, mtime) in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), mtime
            tar.addfile(info, io.BytesIO(data))
    return path


def test_tarcompare_names_each_difference_and_nothing_when_the_same(tmp_path):
    a = _tar(tmp_path / "a.tar", {"etc": (b"", 5), "etc/x": (b"one", 5)})
    b = _tar(tmp_path / "b.tar", {"etc": (b"", 9), "etc/x": (b"two", 5), "etc/y": (b"", 5)})
    diffs = differences(a, b)
    assert "etc: mtime 5 vs 9" in diffs
    assert any(d.startswith("etc/x: sha256 ") for d in diffs)
    assert "etc/y: only in the second" in diffs
    assert differences(a, _tar(tmp_path / "c.tar", {"etc": (b"", 5), "etc/x": (b"one", 5)})) == []


def test_a_rebuild_that_differs_names_both_sha256s_and_what_differs(tmp_path):
    first = pack(_prefix(tmp_path / "a", f"KILN_SOURCE_DATE_EPOCH={NOV_29}\n"), SPEC, tmp_path / "one")
    second_prefix = _prefix(tmp_path / "b", f"KILN_SOURCE_DATE_EPOCH={NOV_29}\n")
    (second_prefix / "bin" / "llama-server").write_text("#!/bin/sh\n# /tmp/kiln-compile-x\n")
    second = pack(second_prefix, SPEC, tmp_path / "two")
    with pytest.raises(RebuildMismatch) as err:
        check_same(first.tarball, second.tarball)
    message = str(err.value)
    assert first.sha256 in message and second.sha256 in message and "not publishing" in message
    assert any(d.startswith("bin/llama-server: size ") for d in err.value.differences)
    same = pack(_prefix(tmp_path / "c", f"KILN_SOURCE_DATE_EPOCH={NOV_29}\n"), SPEC, tmp_path / "three")
    assert check_same(first.tarball, same.tarball) == first.sha256


def _saved(root: Path, steps: list[tuple[str, dict[str, tuple[bytes, int]]]]) -> Path:
    """A directory laid out as `docker save` writes it: manifest.json, the config, one tar per layer."""
    import hashlib
    import json

    root.mkdir()
    tars, diff_ids, history = [], [], [{"created_by": "ARG X", "empty_layer": True}]
    for i, (step, members) in enumerate(steps):
        (root / str(i)).mkdir()
        tar = _tar(root / str(i) / "layer.tar", members)
        tars.append(f"{i}/layer.tar")
        diff_ids.append("sha256:" + hashlib.sha256(tar.read_bytes()).hexdigest())
        history.append({"created_by": step})
    (root / "config.json").write_text(json.dumps({"rootfs": {"diff_ids": diff_ids}, "history": history}))
    (root / "manifest.json").write_text(json.dumps([{"Config": "config.json", "Layers": tars}]))
    return root


def test_compare_images_says_which_layers_are_kilns_and_how_one_differs(tmp_path):
    base = ("ADD rootfs", {"etc": (b"", 1)})
    apt = "RUN apt-get install python3"
    kiln = "COPY /kiln-layer/ / # buildkit"
    a = _saved(tmp_path / "a", [base, (apt, {"var/log/dpkg.log": (b"10:00", 5)}), (kiln, {"opt": (b"", NOV_29)})])
    b = _saved(tmp_path / "b", [base, (apt, {"var/log/dpkg.log": (b"10:01", 6)}), (kiln, {"opt": (b"", NOV_29)})])
    rows = layers.compare(a, b)
    assert [(r.same, r.kilns) for r in rows] == [(True, False), (False, False), (True, True)]
    assert "var/log/dpkg.log: mtime 5 vs 6" in rows[1].differences
    c = _saved(tmp_path / "c", [base, (apt, {}), (kiln, {"opt": (b"", 0)})])
    assert layers.compare(a, c)[2].differences == [f"opt: mtime {NOV_29} vs 0"]
