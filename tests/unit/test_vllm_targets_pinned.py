"""The vLLM targets as committed: one vLLM version, its wheel's sha256, its hash-locked closure and its CUDA
floor agree across the target files, images/lock.toml, images/closures/ and the rendered Dockerfiles
(issue 27 moved them from 0.27.1 to 0.33.0 with `python build.py upgrade`)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from images.build.render import ClosureMismatch, make_context, render_dockerfile
from images.pins import closure as closure_file
from images.pins.lock import Pin, load_lock, pins_for
from images.target import load_target

ROOT = Path(__file__).resolve().parents[2]
VLLM_TARGETS = ("a40-vllm", "b200-vllm")


@pytest.mark.parametrize("name", VLLM_TARGETS)
def test_pin_closure_and_cuda_floor_agree_from_the_target_to_the_rendered_image(name):
    target = load_target(name)
    pins = pins_for(target, load_lock())
    src = target.source
    assert (src.version, src.filename) == ("0.33.0", "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    closure_path = ROOT / "images" / "closures" / f"vllm-{src.version}-cp312.txt"
    text = closure_path.read_text()
    assert pins["engine.closure"].value == hashlib.sha256(text.encode()).hexdigest()
    pinned = closure_file.pinned(text)
    assert pinned["vllm"] == (src.version, (pins["source.sha256"].value,))
    assert pinned["torch"][0] == "2.14.0" and pinned["transformers"][0] == "5.20.2"
    assert all(len(hashes) >= 1 for _, hashes in pinned.values()) and len(pinned) == 199
    assert target.cuda_version == pins["engine.cuda"].value == "13.0"
    rendered = (ROOT / "images" / "rendered" / name / "Dockerfile").read_text()
    assert rendered == render_dockerfile(make_context(target, pins))     # and generate --check keeps it so
    assert f"echo '{pins['engine.closure'].value}  /opt/kiln/engine-requirements.txt' | sha256sum" in rendered
    assert f"images/closures/vllm-0.33.0-cp312.txt, {len(pinned)} packages" in rendered
    assert 'ENV NVIDIA_REQUIRE_CUDA="cuda>=13.0"' in rendered and "--declared '13.0'" in rendered
    assert f'io.kiln.engine.source="pypi:vllm=={src.version}"' in rendered
    assert f'io.kiln.engine.source-sha256="{pins["source.sha256"].value}"' in rendered
    assert f"sha256:{pins['engine.closure'].value}" in rendered and 'io.kiln.cuda="13.0"' in rendered


def test_a_lock_that_disagrees_with_the_closure_file_refuses_to_render():
    target = load_target(VLLM_TARGETS[0])
    pins = pins_for(target, load_lock())
    bad = dict(pins, **{"engine.closure": dataclasses.replace(pins["engine.closure"], value="0" * 64)})
    with pytest.raises(ClosureMismatch, match="images/lock.toml pins engine.closure 0000"):
        make_context(target, bad)
    other = dict(pins, **{"source.sha256": Pin("source.sha256", "f" * 64, "test")})
    with pytest.raises(ClosureMismatch, match="does not pin vllm==0.33.0 with the lock's source.sha256"):
        make_context(target, other)


def test_without_a_locked_closure_the_image_says_its_deps_are_not_hash_pinned():
    target = load_target(VLLM_TARGETS[0])
    pins = {k: v for k, v in pins_for(target, load_lock()).items() if k != "engine.closure"}
    text = render_dockerfile(make_context(target, pins))
    assert "engine-requirements.txt" not in text and "vllm's own requirements, not hash-pinned" in text
    assert "sha256sum --check --strict" in text          # the wheel itself is still verified
