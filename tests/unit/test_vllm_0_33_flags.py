"""vLLM 0.33.0's flags as the lint and `upgrade` read them: the real `vllm serve --help=all` of 0.33.0
and 0.27.1 (tests/fixtures/engine-logs, PROVENANCE.md), against what the real parsers accept (the
research for issue 27 dumped their option strings: 485 for 0.33.0, 383 for 0.27.1)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from images.upgrade import flagdiff
from kiln_dev import fake_vllm
from supervisor.config import load_config, parse_config
from supervisor.engines import llamacpp, vllm
from supervisor.engines.flags import parse_llama_help
from supervisor.selftest.metrics import Counters

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "fixtures" / "engine-logs"


@pytest.fixture(scope="module")
def new():
    return vllm.load_snapshot(LOGS / "vllm-0.33.0-serve-help-all.txt")


@pytest.fixture(scope="module")
def old():
    return vllm.load_snapshot(LOGS / "vllm-0.27.1-serve-help-all.txt")


def cfg(args, family="qwen3-coder"):
    return parse_config(f"""
engine = "vllm"
[model]
source = "hf://Qwen/Qwen3-Coder-30B-A3B-Instruct"
entry = "config.json"
family = "{family}"
[ladder]
[[ladder.rungs]]
name = "r"
args = {json.dumps(args)}
""", env={})


def lint(args, snap):
    c = cfg(args)
    return [str(i) for i in vllm.lint_rung(c, 0, c.ladder.rungs[0], snap)]


def test_the_snapshot_accepts_what_the_real_0_33_0_parser_accepts(new, old):
    assert len(new.by_name) == 485 and sum(len(f.hidden) for f in new.flags) == 50
    assert len(old.by_name) == 383 and not any(f.hidden for f in old.flags)
    assert new.get("--no-enable-log-requests") is new.get("--enable-log-requests") is new.get("--disable-log-requests")
    assert new.get("--no-enable-expert-parallel") is new.get("-ep")          # a pair with a short alias between
    assert new.get("--no-disable-cascade-attn") is new.get("--enable-cascade-attn")
    # only the first of a pair gets its old negative: the real parser rejects these
    assert new.get("--no-disable-log-requests") is None and new.get("--no-enable-cascade-attn") is None


@pytest.mark.parametrize("args", [
    ["--no-enable-prefix-caching"], ["--no-enable-log-requests"], ["--disable-log-requests"],
    ["--no-enable-auto-tool-choice"], ["--no-enable-prefix"],            # a unique prefix of a hidden one
    ["--disable-prefix-caching"], ["--device-memory-utilization", "0.9"], ["-O3"], ["-O", "0"],
    ["--safetensors-load-strategy", "lazy"], ["--load-format", "ipc_cache"],
])
def test_a_help_text_only_lint_would_reject_these_the_parser_accepts_them_so_does_kilns(new, args):
    assert lint(args, new) == []


def test_the_flag_the_seed_crash_looped_on_is_a_flag_again_in_0_33_0_and_still_refused_on_0_27_1(new, old):
    assert lint(["--disable-log-requests"], new) == []
    issues = lint(["--disable-log-requests"], old)
    assert len(issues) == 1 and "removed in vLLM 0.27" in issues[0] and "accepted again from 0.33.0" in issues[0]


@pytest.mark.parametrize("flag, why", [
    ("--calculate-kv-scales", "vllm-project/vllm#49389"),
    ("--no-calculate-kv-scales", "vllm-project/vllm#49389"),
    ("--override-attention-dtype", "removed in vLLM 0.28.0"),
    ("--enable-bf16x3-router-gemm", "automatically on Blackwell"),
])
def test_flags_0_28_to_0_30_removed_are_refused_with_why(new, old, flag, why):
    issues = lint([flag, "x"] if "dtype" in flag else [flag], new)
    assert len(issues) == 1 and why in issues[0] and "remove it" in issues[0]
    assert lint([flag, "x"] if "dtype" in flag else [flag], old) == []        # 0.27.1 had each of them


def test_no_disable_log_requests_is_refused_by_0_33_0_as_by_its_parser(new):
    assert "is not a flag of this vLLM" in lint(["--no-disable-log-requests"], new)[0]


def test_the_seeds_settings_lint_clean_on_0_33_0(new):
    # Qwen3-Coder: fp8 KV, 262144 context, qwen3_coder; Kimi-Linear: kimi_k2, the tokenizer override,
    # --gpu-memory-utilization 0.90, no speculation. Every rung of every baked vLLM config.
    seen = set()
    for path in sorted((ROOT / "images" / "deploy").glob("*.toml")):
        c = load_config(path, env={})
        if c.engine != "vllm":
            continue
        for i, rung in enumerate(c.ladder.rungs):
            assert vllm.lint_rung(c, i, rung, new) == [], f"{path.name} {rung.name}"
            seen.update(a for a in rung.args if a.startswith("--"))
    assert {"--kv-cache-dtype", "--max-model-len", "--gpu-memory-utilization", "--tool-call-parser",
            "--tokenizer", "--trust-remote-code", "--enable-auto-tool-choice"} <= seen
    parsers = new.get("--tool-call-parser").choices
    assert "qwen3_coder" in parsers and "kimi_k2" in parsers


def test_the_diff_0_27_1_to_0_33_0_reads_what_the_research_found(old, new):
    d = flagdiff.diff(old, new, old_version="0.27.1", new_version="0.33.0", known=vllm.REMOVED)
    assert [c.flag for c in d.removed] == ["--calculate-kv-scales", "--enable-bf16x3-router-gemm",
                                           "--no-calculate-kv-scales", "--no-enable-bf16x3-router-gemm",
                                           "--override-attention-dtype"]
    assert "vllm-project/vllm#49389" in d.replacement("--calculate-kv-scales")
    assert len(d.renamed) == 43
    assert next(c for c in d.renamed if c.flag == "--no-enable-log-requests").detail.endswith(
        "shows it as --disable-log-requests")
    assert ("--allowed-origins", "['*']", "[]") in d.defaults
    assert ("--gpu-memory-utilization",) not in [x[:1] for x in d.defaults]   # 0.92 in both
    assert d.lost_values(("--spec-method",)) == ("medusa", "mlp_speculator")
    assert "--kv-cache-dtype" in d.choices_unlisted
    added = {c.flag for c in d.added}
    assert {"--disable-log-requests", "--device-memory-utilization", "--max-num-queued-reqs"} <= added
    text = "\n".join(flagdiff.markdown(d))
    assert "| `--calculate-kv-scales` |" in text and "### Renamed: still accepted, no longer shown (43)" in text


def test_llama_cpps_own_removed_text_is_the_replacement():
    # The real 11434.0.0 help lists --draft-max as removed ("use --spec-draft-n-max or ..."); an older
    # help in which it was live is made from it here by dropping that text (synthetic: no older
    # llama-server help is committed).
    real = (LOGS / "llama-server-help-cpu-11434.txt").read_text()
    older = real.replace("the argument has been removed. use --spec-draft-n-max or", "number of tokens to draft")
    d = flagdiff.diff(parse_llama_help(older), parse_llama_help(real), old_version="older",
                      new_version="11434.0.0", known={k: f"use {v}" for k, v in llamacpp.KNOWN_RENAMES.items()})
    fix = d.replacement("--draft-max")
    assert fix and fix.startswith("the 11434.0.0 help says:") and "--spec-draft-n-max" in fix


def test_the_cpu_stand_in_serves_0_33_0s_metrics_and_help():
    # stand-in: no 0.33.0 engine runs here (the CPU engine is 0.32.0); its metrics sample is 0.33.0's own
    text = fake_vllm.metrics_text("served")
    c = Counters.from_text(text)
    assert (c.decode_tokens, c.prompt_tokens, c.prompt_tokens_cached) == (0.0, 0.0, 0.0) and c.spec_drafts is None
    assert 'vllm:admission_rejections_total{model_name="served",reason="max_num_queued_reqs"} 0.0' in text
    assert "my-model" not in text and "python_gc" not in text
    assert Counters.from_text(fake_vllm.metrics_text("served", speculating=True)).spec_drafts == 0.0
    assert fake_vllm.VERSION == "0.33.0" and fake_vllm.HELP == "vllm-0.33.0-serve-help-all.txt"


def fast(args, extra=""):
    return parse_config(f"""
engine = "vllm"
[model]
source = "/models/m/config.json"
entry = "config.json"
[server]
fast_start = true
{extra}
[ladder]
[[ladder.rungs]]
name = "r"
args = {json.dumps(args)}
""", env={})


def test_fast_start_is_off_by_default_and_adds_only_what_the_rung_does_not_set(new):
    plain = cfg(["--max-model-len", "4096"])
    assert plain.server.fast_start is False
    argv = vllm.build_argv(plain, plain.ladder.rungs[0], model_path="/models/m/config.json")
    assert "--safetensors-load-strategy" not in argv and not any(a.startswith("-O") for a in argv)
    on = fast(["--max-model-len", "4096"])
    argv = vllm.build_argv(on, on.ladder.rungs[0], model_path="/models/m/config.json")
    assert argv[argv.index("--safetensors-load-strategy") + 1] == "prefetch"
    assert "--optimization-level" not in argv    # -O1 left the preset: 4.7x slower decode on the H200
    own = fast(["-O3", "--safetensors-load-strategy=eager"])
    argv = vllm.build_argv(own, own.ladder.rungs[0], model_path="/models/m/config.json")
    assert "--optimization-level" not in argv and "prefetch" not in argv and "-O3" in argv
    assert vllm.lint_rung(on, 0, on.ladder.rungs[0], new) == []


def test_fast_start_is_a_preset_of_startup_levers_and_startup_s_own_value_wins(new):
    both = fast(["--max-model-len", "4096"], extra='[startup]\nsafetensors_load_strategy = "eager"\n'
                                                    "optimization_level = 0\n")
    argv = vllm.build_argv(both, both.ladder.rungs[0], model_path="/models/m/config.json")
    # one load-strategy flag, [startup]'s, not the preset's; [startup]'s other lever beside it
    assert argv.count("--safetensors-load-strategy") == 1
    assert argv[argv.index("--safetensors-load-strategy") + 1] == "eager"
    assert argv[argv.index("--optimization-level") + 1] == "0"


def test_fast_start_on_a_vllm_without_its_flags_is_named_by_the_lint():
    from supervisor.engines.flags import parse_argparse_help

    on = fast(["--max-model-len", "4096"])
    bare = parse_argparse_help("usage: vllm serve\n\noptions:\n  --max-model-len MAX_MODEL_LEN\n", source="a test help")
    issues = vllm.lint_rung(on, 0, on.ladder.rungs[0], bare)
    named = [i for i in issues if i.where == "server.fast_start"]
    assert named and all("set fast_start = false" in i.message for i in named), issues


def test_fast_start_keeps_the_hash_of_a_config_that_does_not_set_it_and_is_vllm_only():
    from supervisor.errors import ConfigError

    off = cfg(["--max-model-len", "4096"])
    assert off.to_dict()["server"]["fast_start"] is False
    assert fast(["--max-model-len", "4096"]).hash != off.hash
    # the hash of a config without the key is what it was before the key existed
    d = off.to_dict()
    for k in ("watch", "runpod", "serverless", "startup", "router", "plan", "cache"):   # the tables added since, at defaults
        d.pop(k)
    d["server"].pop("fast_start")
    assert off.hash == hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":"), default=list)
                                      .encode()).hexdigest()
    with pytest.raises(ConfigError, match="fast_start: is a vLLM option"):
        parse_config('engine = "llamacpp"\n[model]\nsource = "/m.gguf"\n[server]\nfast_start = true\n'
                     '[ladder]\n[[ladder.rungs]]\nname = "r"\nplacement = "cpu"\n', env={})


def test_a_flag_0_33_0_deprecates_is_a_note_not_a_refusal(tmp_path, old, new):
    import dataclasses

    from images.upgrade import engine as upgrade
    from images.target import load_target

    moved = load_target("a40-vllm")                        # pinned on 0.33.0
    pinned = dataclasses.replace(moved, source=dataclasses.replace(moved.source, version="0.27.1"))
    d = flagdiff.diff(old, new, old_version="0.27.1", new_version="0.33.0", known=vllm.REMOVED)
    path = tmp_path / "c.toml"
    path.write_text('engine = "vllm"\n[model]\nsource = "/m/config.json"\nentry = "config.json"\n[ladder]\n'
                    '[[ladder.rungs]]\nname = "r"\nargs = ["--mamba-cache-mode", "none", "--calculate-kv-scales"]\n')
    p = upgrade.Plan(pinned, moved, {}, "", "", "", d, {})
    upgrade._lint_all(p, vllm, old, new, [path])
    refused = [(r.rung, r.where, r.flag) for r in p.refusals]
    assert refused == [("r", "ladder.rungs[0].args[2]", "--calculate-kv-scales")]
    assert [n for n in p.notes if "deprecated" in n] == [
        f"{path}: rung r (ladder.rungs[0].args[0]) --mamba-cache-mode: deprecated in 0.33.0, still accepted"]


@pytest.mark.parametrize("flag, fix", [("--no-mmap", "--load-mode none"), ("--mlock", "--load-mode mmap+mlock"),
                                       ("-dio", "--load-mode dio")])
def test_llama_cpps_load_flags_that_became_load_mode_are_named_with_their_mode(flag, fix):
    snap = parse_llama_help((LOGS / "llama-server-help-cpu-11434.txt").read_text(), "11434")
    c = parse_config(f'engine = "llamacpp"\n[model]\nsource = "/m.gguf"\n[ladder]\n[[ladder.rungs]]\nname = "r"\n'
                     f'placement = "cpu"\nargs = ["{flag}"]\n', env={})
    issues = [str(i) for i in llamacpp.lint_rung(c, 0, c.ladder.rungs[0], snap)]
    assert len(issues) == 1 and f"{flag} was removed; use {fix}" in issues[0]
