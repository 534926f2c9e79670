"""vLLM engine: flag snapshot from the real `vllm serve --help=all` of vLLM 0.27.1
(tests/fixtures/engine-logs, provenance beside it), lint with vLLM's parser semantics, argv."""

import json
from pathlib import Path

import pytest

from supervisor.config import parse_config
from supervisor.engines import vllm
from supervisor.failure import classify

HELP = Path(__file__).resolve().parents[1] / "fixtures" / "engine-logs" / "vllm-0.27.1-serve-help-all.txt"


@pytest.fixture(scope="module")
def snap():
    return vllm.load_snapshot(HELP)


def cfg(args, family="qwen3-coder", env=None, placement="engine", sampler=""):
    env_toml = "".join(f'\n[ladder.rungs.env]\n{k} = "{v}"' for k, v in (env or {}).items())
    text = f"""
engine = "vllm"
[model]
source = "hf://cyankiwi/Kimi-Linear-48B-A3B-Instruct-AWQ-4bit"
entry = "config.json"
family = "{family}"
{sampler}
[ladder]
[[ladder.rungs]]
name = "r"
placement = "{placement}"
args = {json.dumps(args)}{env_toml}
"""
    return parse_config(text, env={})


def lint(c, snap):
    return [str(i) for i in vllm.lint_rung(c, 0, c.ladder.rungs[0], snap)]


def test_snapshot_has_every_flag_of_the_real_parser(snap):
    assert len(snap.by_name) == 383                    # what vLLM 0.27.1's parser lists, -h included
    assert snap.get("-tp") is snap.get("--tensor-parallel-size")
    assert "kimi_k2" in snap.get("--tool-call-parser").choices
    assert snap.get("--disable-log-requests") is None


def test_the_removed_flag_that_crash_looped_the_seed_is_named(snap):
    issues = lint(cfg(["--disable-log-requests"]), snap)
    assert len(issues) == 1 and "--disable-log-requests was removed in vLLM 0.27" in issues[0]
    assert "--enable-log-requests" in issues[0]


@pytest.mark.parametrize("args", [
    ["--max-model", "4096"],                                   # a unique prefix
    ["--max_model_len", "4096"],                               # underscores for dashes
    ["--max-model-len=4096"],
    ["--speculative-config.num_speculative_tokens", "3"],      # dotted sub-key of a JSON option
    ["-O3"], ["--config", "/etc/vllm.yaml"], ["--enforce-eager"], ["--no-enforce-eager"],
])
def test_what_vllms_parser_accepts_the_lint_accepts(snap, args):
    assert lint(cfg(args), snap) == []


def test_unknown_and_ambiguous_flags(snap):
    assert "did you mean --max-model-len?" in lint(cfg(["--max-modell-len", "1"]), snap)[0]
    assert "is ambiguous" in lint(cfg(["--enable", "x"]), snap)[0]


def test_tool_call_parser_is_checked_against_what_this_version_ships(snap):
    issues = lint(cfg(["--enable-auto-tool-choice", "--tool-call-parser", "kimi_k4"]), snap)
    assert issues and "is not a parser this vLLM ships" in issues[0]
    assert lint(cfg(["--tool-call-parser", "kimi_k4", "--tool-parser-plugin", "/p.py"]), snap) == []
    assert lint(cfg(["--tool-call-parser", "kimi_k2"]), snap) == []


def test_speculation_is_refused_for_kimi_linear_only(snap):
    spec = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 5}']
    issues = lint(cfg(spec, family="kimi-linear"), snap)
    assert len(issues) == 1 and "corrupts code" in issues[0]
    assert lint(cfg(["-sc", "{}"], family="kimi-linear"), snap)
    assert lint(cfg(spec, family="qwen3-coder"), snap) == []


def test_tensor_parallel_rungs_need_nccl_p2p_disabled(snap):
    assert "NCCL_P2P_DISABLE" in lint(cfg(["-tp", "2"]), snap)[0]
    assert lint(cfg(["-tp", "2"], env={"NCCL_P2P_DISABLE": "1"}), snap) == []
    assert lint(cfg(["--tensor-parallel-size", "1"]), snap) == []


def test_llama_cpp_placements_do_not_apply(snap):
    assert "is a llama.cpp placement" in lint(cfg([], placement="autofit"), snap)[0]


def test_argv_serves_the_snapshot_dir_keeps_the_key_out_and_sets_sampler_defaults(tmp_path):
    c = cfg(["--max-model-len", "4096"], sampler="[sampler]\ntemperature = 0.3\nrepeat_penalty = 1.05\n")
    (tmp_path / "config.json").write_text("{}")
    argv = vllm.build_argv(c, c.ladder.rungs[0], model_path=str(tmp_path / "config.json"), api_key_file="/run/k")
    assert argv[:3] == ["vllm", "serve", str(tmp_path)]
    assert argv[argv.index("--served-model-name") + 1] == "cyankiwi/Kimi-Linear-48B-A3B-Instruct-AWQ-4bit"
    assert argv[argv.index("--override-generation-config") + 1] == '{"repetition_penalty": 1.05, "temperature": 0.3}'
    assert "--api-key" not in argv and argv[-2:] == ["--max-model-len", "4096"]
    env = vllm.engine_env(c, c.ladder.rungs[0], "k3y")
    assert env["VLLM_API_KEY"] == "k3y"


@pytest.mark.parametrize("line,expected", [
    ("vllm serve: error: unrecognized arguments: --disable-log-requests", "config_rejected"),
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
     "initializing the engine.", "oom"),
    ("OSError: [Errno 98] Address already in use", "port_in_use"),
    ("RuntimeError: Failed to infer device type", "load_error"),
])
def test_failure_signatures(line, expected):
    f = classify(returncode=1, elapsed_s=3, tail=["INFO starting", line], signatures=vllm.SIGNATURES,
                 hint_signatures=vllm.HINTS)
    assert f.failure_class == expected


def test_the_real_parsers_errors_are_config_rejected():
    lines = (HELP.parent / "vllm-0.27.1-parser-errors.txt").read_text().splitlines()
    removed = [ln for ln in lines if "unrecognized arguments" in ln]
    ambiguous = [ln for ln in lines if "ambiguous option" in ln]
    assert removed and ambiguous
    for tail in (removed, ambiguous):
        assert classify(returncode=2, elapsed_s=1, tail=tail, signatures=vllm.SIGNATURES).failure_class == "config_rejected"


def test_kv_cache_message_from_the_vllm_source_is_oom():
    line = ("ValueError: To serve at least one request with the model's max seq len (1048576), (31.50 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (7.88 GiB). Try increasing "
            "`gpu_memory_utilization` ...")
    assert classify(returncode=1, elapsed_s=60, tail=[line], signatures=vllm.SIGNATURES).failure_class == "oom"


# ---- vLLM 0.26.0, the version the lent H200 can run on its own torch 2.11.0 (issue 14) ----------
HELP_0_26_0 = HELP.parent / "vllm-0.26.0-serve-help-all.txt"


def test_every_vllm_targets_deploy_config_lints_clean_against_the_real_0_26_0_parser():
    from images.target import load_target, target_names
    from supervisor.config import load_config

    snap026 = vllm.load_snapshot(HELP_0_26_0)
    checked = 0
    for name in target_names():
        target = load_target(name)
        if target.engine != "vllm":
            continue
        for path in [target.deploy_config_path, *target.profiles.values()]:
            c = load_config(path, env={})
            for i, rung in enumerate(c.ladder.rungs):
                assert vllm.lint_rung(c, i, rung, snap026) == [], (name, path.name, rung.name)
                checked += 1
    assert checked >= 3


def test_what_0_26_0_lacks_against_0_27_1_is_caught_by_its_snapshot(snap):
    snap026 = vllm.load_snapshot(HELP_0_26_0)
    # 0.27.1 added these flags and the kimi_k3 tool parser; 0.26.0's own parser is the authority
    for flag in ("--kda-prefill-backend", "--enable-fault-tolerance", "--mamba-ssu-algorithm"):
        assert snap.get(flag) and not snap026.get(flag), flag
        assert lint(cfg([flag, "x"]), snap026), flag
    assert any("kimi_k3 is not a parser this vLLM ships" in i
               for i in lint(cfg(["--tool-call-parser", "kimi_k3", "--enable-auto-tool-choice"]), snap026))
    # and 0.27.1 dropped two that 0.26.0 still has
    assert snap026.get("--max-num-partial-prefills") and not snap.get("--max-num-partial-prefills")


def test_compile_caches_live_on_the_state_volume_and_a_rungs_own_setting_wins(tmp_path):
    from supervisor.engines import llamacpp

    c = cfg(["--max-model-len", "4096"], env={"TRITON_CACHE_DIR": "/elsewhere/triton"})
    env = vllm.engine_defaults(c, c.ladder.rungs[0])
    root = f"{c.state_dir}/cache"
    assert env["VLLM_CACHE_ROOT"] == f"{root}/vllm" and env["TORCHINDUCTOR_CACHE_DIR"] == f"{root}/torchinductor"
    assert env["CUDA_CACHE_PATH"] == f"{root}/cuda-jit" and env["CUDA_CACHE_MAXSIZE"] == "4294967296"
    assert "TRITON_CACHE_DIR" not in env          # the rung's value stays
    assert "VLLM_API_KEY" not in env and vllm.engine_env(c, c.ladder.rungs[0], None) == {}
    assert llamacpp.engine_defaults(c, c.ladder.rungs[0]) == {"CUDA_CACHE_PATH": f"{root}/cuda-jit",
                                                            "CUDA_CACHE_MAXSIZE": "4294967296"}
    assert llamacpp.engine_env(c, c.ladder.rungs[0], "k") == {}


def test_the_engine_environment_lets_the_pod_and_the_rung_override_the_cache_defaults_never_the_key():
    from supervisor.launch import engine_environment

    c = cfg(["--max-model-len", "4096"], env={"TRITON_CACHE_DIR": "/rung/triton"})
    pod = {"TORCHINDUCTOR_CACHE_DIR": "/pod/inductor", "HF_TOKEN": "hf_canary", "KILN_API_KEY": "k-canary",
           "VLLM_API_KEY": "stale", "PATH": "/usr/bin"}
    env = engine_environment(vllm, c, c.ladder.rungs[0], pod, "the-key")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/pod/inductor" and env["TRITON_CACHE_DIR"] == "/rung/triton"
    assert env["VLLM_CACHE_ROOT"] == f"{c.state_dir}/cache/vllm" and env["PATH"] == "/usr/bin"
    assert env["VLLM_API_KEY"] == "the-key"                    # what the engine must have wins
    assert "HF_TOKEN" not in env and "KILN_API_KEY" not in env   # secrets it has no use for stay out
