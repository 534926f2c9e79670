"""llama.cpp engine: flag snapshot, lint (unknown/removed flags), autofit guard, expert-count and speed lint, argv."""

import json
from pathlib import Path

import pytest

from supervisor.config import parse_config
from supervisor.engines import llamacpp
from supervisor.engines.flags import load_llama_snapshot
from supervisor.errors import ConfigError
from supervisor.failure import FailureClass, classify
from supervisor.model.gguf_layout import FileHeader, read_header

HELP = Path(__file__).resolve().parents[1] / "fixtures" / "engine-logs" / "llama-server-help-cpu-11434.txt"


@pytest.fixture(scope="module")
def snap():
    return load_llama_snapshot(HELP)


def cfg_with(args, placement="autofit", env=None, gpus=None, extra=""):
    env_toml = "".join(f'\n[ladder.rungs.env]\n{k} = "{v}"' for k, v in (env or {}).items())
    hw = f"\n[hardware]\ngpu_count = {gpus}\n" if gpus is not None else ""
    return parse_config(f"""
[model]
source = "/m.gguf"
[server]
binary = "/opt/llama-server"
{extra}
[ladder]
[[ladder.rungs]]
name = "r"
placement = "{placement}"
args = {args!r}{env_toml}
{hw}""".replace("'", '"'), env={})


def lint(cfg, snap, gpus=None):
    return [str(i) for i in llamacpp.lint_rung(cfg, 0, cfg.ladder.rungs[0], snap, gpu_count=gpus)]


def test_snapshot_knows_spellings_values_envs_and_removals(snap):
    assert snap.get("-c") is snap.get("--ctx-size") and snap.get("-c").takes_value
    assert snap.get("--cpu-moe").takes_value is False
    assert snap.get("-ngl").env == "LLAMA_ARG_N_GPU_LAYERS"
    assert "--spec-draft-n-max" in snap.get("--draft-max").removed
    assert snap.get("--api-key-file") is not None


def test_unknown_flag_names_the_nearest_valid_one(snap):
    issues = lint(cfg_with(["--ctx-sise", "512"]), snap)
    assert len(issues) == 1 and "--ctx-sise is not a flag of this llama-server; did you mean --ctx-size?" in issues[0]


def test_removed_flag_names_its_replacement(snap):
    issues = lint(cfg_with(["--draft-max", "4"]), snap)
    assert "--draft-max was removed from this llama-server: use --spec-draft-n-max" in issues[0]


@pytest.mark.parametrize("args", [["-ngl", "99"], ["--tensor-split", "1,1"], ["-ot", "blk.1=CUDA0"],
                                  ["--n-cpu-moe", "80"], ["--cpu-moe"], ["--fit", "off"]])
def test_autofit_rung_refuses_placement_pins(snap, args):
    issues = lint(cfg_with(args), snap)
    assert issues and ("autofit" in issues[0])


def test_autofit_guard_sees_pins_smuggled_in_env(snap):
    issues = lint(cfg_with(["-c", "512"], env={"LLAMA_ARG_N_GPU_LAYERS": "99"}), snap)
    assert any("env LLAMA_ARG_N_GPU_LAYERS" in i and "aborts autofit" in i for i in issues)


def test_manual_split_must_name_every_device(snap):
    assert any("must name explicit device ranges" in i for i in lint(cfg_with(["-ts", "1,1"], "manual"), snap))
    two = cfg_with(["-ngl", "99", "-ot", r"blk\.([0-9]|1[0-9])\.=CUDA0"], "manual", gpus=2)
    assert any("names no layers for CUDA1" in i for i in lint(two, snap, gpus=2))
    both = cfg_with(["-ngl", "99", "-ot", r"blk\.([0-9])\.=CUDA0,blk\.(1[0-9])\.=CUDA1"], "manual", gpus=2)
    assert lint(both, snap, gpus=2) == []


def test_lint_without_snapshot_still_guards_placement():
    assert lint(cfg_with(["-ngl", "99"]), None)


def test_argv_keeps_the_key_out_of_argv_and_adds_sampler_and_metrics(snap):
    cfg = parse_config("""
[model]
source = "/m.gguf"
[server]
binary = "/opt/llama-server"
port = 9000
[sampler]
temperature = 0.3
min_p = 0.1
repeat_penalty = 1.05
[ladder]
[[ladder.rungs]]
name = "cpu"
placement = "cpu"
args = ["-c", "512"]
""", env={})
    argv = llamacpp.build_argv(cfg, cfg.ladder.rungs[0], model_path="/m.gguf", api_key_file="/run/k")
    assert argv[:7] == ["/opt/llama-server", "--model", "/m.gguf", "--host", "0.0.0.0", "--port", "9000"]
    assert "--api-key" not in argv and argv[argv.index("--api-key-file") + 1] == "/run/k"
    assert argv[argv.index("--temp") + 1] == "0.3" and argv[argv.index("--repeat-penalty") + 1] == "1.05"
    assert "--metrics" in argv and argv[argv.index("-ngl") + 1] == "0" and argv[-2:] == ["-c", "512"]
    assert lint(cfg, snap) == []


# -- the field notes' placement lessons that need the model's header or only cost speed ------------
def _header(arch: str, **meta) -> FileHeader:
    """A GGUF header as supervisor.model.gguf_layout.read_header returns it (data, not a stand-in)."""
    return FileHeader(Path("/m.gguf"), 3, {"general.architecture": arch, **meta}, {}, [], 0, 0)


K3_TRAINED_16 = _header("kimi-k3", **{"kimi-k3.expert_used_count": 16})   # the field notes' REAP50 Width50


def _rung_toml(args, extra=""):
    return parse_config(f"""
[model]
source = "/m.gguf"
[ladder]
[[ladder.rungs]]
name = "r"
args = {json.dumps(args)}
{extra}
""", env={})


def test_lowering_expert_used_count_below_the_models_own_is_refused(snap):
    cfg = _rung_toml(["--override-kv", "kimi-k3.expert_used_count=int:8"])
    issues = llamacpp.lint_rung(cfg, 0, cfg.ladder.rungs[0], snap, model=K3_TRAINED_16)
    assert len(issues) == 1 and issues[0].severity == llamacpp.ERROR
    assert "routes 8 experts per token where this model was trained for 16" in issues[0].message
    assert "accept_degraded = true" in issues[0].message and "# # # #" in issues[0].message


def test_accept_degraded_lets_the_rung_lower_the_expert_count(snap):
    cfg = _rung_toml(["--override-kv", "kimi-k3.expert_used_count=int:8"], "accept_degraded = true")
    assert cfg.ladder.rungs[0].accept_degraded is True
    assert llamacpp.lint_rung(cfg, 0, cfg.ladder.rungs[0], snap, model=K3_TRAINED_16) == []


@pytest.mark.parametrize("override", ["kimi-k3.expert_used_count=int:16", "other.expert_used_count=int:1",
                                      "tokenizer.ggml.add_bos_token=bool:false,kimi-k3.expert_used_count=int:32"])
def test_expert_overrides_that_degrade_nothing_pass(snap, override):
    cfg = _rung_toml(["--override-kv", override])
    assert llamacpp.lint_rung(cfg, 0, cfg.ladder.rungs[0], snap, model=K3_TRAINED_16) == []


def test_expert_count_lint_reads_a_real_header_and_the_csv_form(snap, tmp_path):
    from kiln_dev.gguf_kimi import N_EXPERT_USED, make

    header = read_header(make("kimi_k3", tmp_path / "k3.gguf"))
    cfg = _rung_toml([f"--override-kv=tokenizer.ggml.add_bos_token=bool:false,kimi-k3.expert_used_count=int:1"])
    issues = llamacpp.lint_rung(cfg, 0, cfg.ladder.rungs[0], snap, model=header)
    assert len(issues) == 1 and f"trained for {N_EXPERT_USED}" in issues[0].message
    # Without the header nothing can be compared: check-config stays quiet, the launch checks it.
    assert llamacpp.lint_rung(cfg, 0, cfg.ladder.rungs[0], snap) == []


def test_accept_degraded_without_an_expert_override_is_a_config_error():
    with pytest.raises(ConfigError) as e:
        _rung_toml(["--ctx-size", "4096"], "accept_degraded = true")
    assert "ladder.rungs[0].accept_degraded" in str(e.value)
    with pytest.raises(ConfigError):
        _rung_toml(["--override-kv", "kimi-k3.expert_used_count=int:8"], 'accept_degraded = "yes"')


@pytest.mark.parametrize("value", ["1", "16", "0", "abc"])
def test_offload_min_batch_below_the_default_is_a_warning_with_the_seeds_figure(snap, value):
    cfg = cfg_with(["--ctx-size", "4096"], env={"GGML_OP_OFFLOAD_MIN_BATCH": value})
    assert lint(cfg, snap) == []                                       # not an error: it runs
    warnings = llamacpp.lint_rung_warnings(cfg, 0, cfg.ladder.rungs[0], snap)
    assert len(warnings) == 1 and warnings[0].severity == llamacpp.WARNING
    assert "default of 32" in warnings[0].message and "2.46 -> 1.13 tok/s" in warnings[0].message
    assert str(warnings[0]).startswith("ladder.rungs[0] (r).env.GGML_OP_OFFLOAD_MIN_BATCH: warning: ")


@pytest.mark.parametrize("value", ["32", "64"])
def test_offload_min_batch_at_or_above_the_default_is_quiet(snap, value):
    cfg = cfg_with(["--ctx-size", "4096"], env={"GGML_OP_OFFLOAD_MIN_BATCH": value})
    assert llamacpp.lint_rung_warnings(cfg, 0, cfg.ladder.rungs[0], snap) == []


def test_an_unconfigured_moe_cache_is_a_warning(snap):
    cfg = cfg_with(["--moe-cache", "on"])
    warnings = llamacpp.lint_rung_warnings(cfg, 0, cfg.ladder.rungs[0], None)
    assert len(warnings) == 1 and "14 % slower" in warnings[0].message
    assert "GGML_CUDA_MOE_CACHE_" in warnings[0].message
    # The field notes do not name the seven variables; any GGML_CUDA_MOE_CACHE_* one counts as configuring it.
    configured = cfg_with(["--moe-cache", "on"], env={"GGML_CUDA_MOE_CACHE_ANY": "1"})
    assert llamacpp.lint_rung_warnings(configured, 0, configured.ladder.rungs[0], None) == []


def test_the_draft_model_and_override_keys_a_rung_names(snap):
    for args in (["-md", "/d.gguf"], ["--model-draft", "/d.gguf"], ["--spec-draft-model=/d.gguf"]):
        cfg = cfg_with(args)
        assert llamacpp.draft_model(cfg, cfg.ladder.rungs[0], snap) == "/d.gguf"
    cfg = cfg_with(["--ctx-size", "4096"], env={"LLAMA_ARG_SPEC_DRAFT_MODEL": "/e.gguf"})
    assert llamacpp.draft_model(cfg, cfg.ladder.rungs[0], snap) == "/e.gguf"
    assert llamacpp.draft_model(cfg_with(["-c", "512"]), cfg_with(["-c", "512"]).ladder.rungs[0], snap) is None
    cfg = cfg_with(["--override-kv", "a.b=int:1,c.d=str:x"])
    assert llamacpp.kv_override_keys(cfg, cfg.ladder.rungs[0], snap) == {"a.b", "c.d"}


@pytest.mark.parametrize("line", [
    "llama_model_load: error loading model: unknown model architecture: 'dflash-draft'",
    "llama_model_load: error loading model: error loading model hyperparameters: DFlash model requires "
    "'target_layers' in GGUF metadata",
    "llama_model_load: error loading model: done_getting_tensors: wrong number of tensors; expected 16, got 14",
    "llama_model_load: error loading model: tensor 'output.weight' data is not within the file bounds, "
    "model is corrupted or incomplete",
    "llama_model_load: error loading model: llama_model_loader: failed to load GGUF split from x-00002-of-00002.gguf",
])
def test_the_engines_own_refusals_are_model_incompatible(line):
    f = classify(returncode=1, elapsed_s=0.1, tail=[line, "llama_model_load_from_file_impl: failed to load model"],
                 signatures=llamacpp.SIGNATURES)
    assert f.failure_class is FailureClass.MODEL_INCOMPATIBLE


SAMPLER = "[sampler]\ntemperature = 0.3\nmin_p = 0.1\ntop_k = 40\nrepeat_penalty = 1.05\n"


def _sampler_argv(cfg):
    argv = llamacpp.build_argv(cfg, cfg.ladder.rungs[0], model_path="/m.gguf", api_key_file=None)
    return {flag: argv[i + 1] for i, flag in enumerate(argv) if flag in ("--temp", "--temperature", "--min-p",
                                                                          "--top-p", "--top-k", "--repeat-penalty")}


@pytest.mark.parametrize("args,env,expected", [
    # Was: a rung that set --temp (or --min-p, --repeat-penalty) dropped EVERY sampler default silently.
    (["--temp", "0.7"], None, {"--temp": "0.7", "--min-p": "0.1", "--top-k": "40", "--repeat-penalty": "1.05"}),
    (["--temperature", "0.7"], None, {"--temperature": "0.7", "--min-p": "0.1", "--top-k": "40",
                                      "--repeat-penalty": "1.05"}),
    (["--top-k=20"], None, {"--temp": "0.3", "--min-p": "0.1", "--repeat-penalty": "1.05"}),
    (["--min-p", "0.05", "--repeat-penalty", "1.0"], None, {"--temp": "0.3", "--min-p": "0.05", "--top-k": "40",
                                                            "--repeat-penalty": "1.0"}),
    # a variable the flag would beat (the flag wins in llama.cpp): the default is not written then
    ([], {"LLAMA_ARG_TEMPERATURE": "0.9"}, {"--min-p": "0.1", "--top-k": "40", "--repeat-penalty": "1.05"}),
])
def test_a_rungs_sampler_flag_replaces_only_its_own_default(args, env, expected):
    assert _sampler_argv(cfg_with(args, placement="cpu", env=env, extra=SAMPLER)) == expected


def test_sampler_overrides_name_the_spelling_the_rung_used(snap):
    c = cfg_with(["--temperature", "0.7", "--top-k", "20"], env={"LLAMA_ARG_MIN_P": "0.2"}, extra=SAMPLER)
    assert llamacpp.sampler_overrides(c, c.ladder.rungs[0], snap) == {
        "temperature": "--temperature 0.7", "min_p": "env LLAMA_ARG_MIN_P=0.2", "top_k": "--top-k 20"}
    plain = cfg_with(["--temp", "0.7"])                            # no [sampler]: nothing is replaced
    assert llamacpp.sampler_overrides(plain, plain.ladder.rungs[0], snap) == {}


def test_every_sampler_spelling_is_a_flag_of_the_pinned_llama_server(snap):
    for spellings, var in llamacpp.SAMPLER_FLAGS.values():
        assert all(snap.get(s) is not None for s in spellings), spellings
        assert var in snap.by_env and snap.by_env[var] is snap.get(spellings[0])


def test_check_config_lists_which_sampler_defaults_a_rung_replaces(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "c.toml"
    path.write_text(f"""
[model]
source = "/m.gguf"
[server]
binary = "/bin/true"
{SAMPLER}
[ladder]
[[ladder.rungs]]
name = "hot"
args = ["--temp", "0.7"]
[[ladder.rungs]]
name = "plain"
args = ["-c", "512"]
""")
    r = subprocess.run([sys.executable, "-m", "supervisor", "check-config", str(path), "--flags", str(HELP)],
                       capture_output=True, text=True, cwd=HELP.parents[3])
    assert r.returncode == 0, r.stderr
    assert ("ladder.rungs[0] (hot): replaces [sampler] temperature = 0.3 with --temp 0.7; "
            "min_p = 0.1, top_k = 40, repeat_penalty = 1.05 still apply") in [x.strip() for x in r.stdout.splitlines()[1:]]
    assert "(plain)" not in r.stdout
