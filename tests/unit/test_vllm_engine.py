"""vLLM engine: flag snapshot from the real `vllm serve --help=all` of vLLM 0.27.1 and 0.26.0
(tests/fixtures/engine-logs, provenance beside it), lint with vLLM's parser semantics, argv, and the
failure signatures against what vLLM 0.26.0 printed on the lent H200."""

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
    from supervisor.run.launch import engine_environment

    c = cfg(["--max-model-len", "4096"], env={"TRITON_CACHE_DIR": "/rung/triton"})
    pod = {"TORCHINDUCTOR_CACHE_DIR": "/pod/inductor", "HF_TOKEN": "hf_canary", "KILN_API_KEY": "k-canary",
           "VLLM_API_KEY": "stale", "PATH": "/usr/bin"}
    env = engine_environment(vllm, c, c.ladder.rungs[0], pod, "the-key")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/pod/inductor" and env["TRITON_CACHE_DIR"] == "/rung/triton"
    assert env["VLLM_CACHE_ROOT"] == f"{c.state_dir}/cache/vllm" and env["PATH"] == "/usr/bin"
    assert env["VLLM_API_KEY"] == "the-key"                    # what the engine must have wins
    assert "HF_TOKEN" not in env and "KILN_API_KEY" not in env   # secrets it has no use for stay out


# ---- what vLLM 0.26.0 really printed on the lent H200, 2026-12-01 (issue 14 phase B) ------------
H200_OOM = HELP.parent / "vllm-0.26.0-oom-h200.log"
H200_BOOT = HELP.parent / "vllm-0.26.0-serve-h200.log"
# The failure as the H200's /status reported it (docs/research/device-run-2026-12-01/call11/status-A.json)
DEVICE_EVIDENCE = "(EngineCore pid=8054) ERROR 12-01 10:23:47 [core.py:1330] torch.AcceleratorError: CUDA error: out of memory"


def recorded_lines(path):
    with open(path, encoding="utf-8", newline="") as f:      # tqdm's \r stays inside its line
        return f.read().rstrip("\n").split("\n")


def test_vllm_0_26_0s_h200_oom_is_oom_not_crashed():
    # Device call 8 called this `crashed` ("no known failure signature") and the ladder stopped;
    # call 11, with the signature, fell through. The supervisor keeps 200 lines of tail: the whole
    # failed engine's output (187 lines; the OOM line is 122 lines before its end).
    lines = recorded_lines(H200_OOM)
    f = classify(returncode=1, elapsed_s=43.297, tail=lines[-200:], signatures=vllm.SIGNATURES,
                 hint_signatures=vllm.HINTS, rung="too-long")
    assert (f.failure_class, f.reason, f.evidence, f.hints) == ("oom", "CUDA out of memory (torch)", DEVICE_EVIDENCE, ())
    assert len(lines) - lines.index(DEVICE_EVIDENCE) == 123


def test_every_failure_line_vllm_printed_on_the_h200_classifies_as_it_did_there():
    # Alone, each line is the OOM it was or nothing: no signature of another class takes a line of
    # the real failure, and every line naming the allocation failure is an OOM.
    classes = {}
    for line in recorded_lines(H200_OOM):
        c = classify(returncode=1, elapsed_s=43.3, tail=[line], signatures=vllm.SIGNATURES).failure_class
        classes.setdefault(c.value, []).append(line)
    assert set(classes) == {"oom", "crashed"}
    oom = classes["oom"]
    assert [ln for ln in oom if "torch.AcceleratorError: CUDA error: out of memory" in ln] == [
        DEVICE_EVIDENCE, "(EngineCore pid=8054) torch.AcceleratorError: CUDA error: out of memory"]
    assert all("out of memory" in ln or "cudaErrorMemoryAllocation" in ln for ln in oom)


def test_a_healthy_vllm_boot_on_the_h200_matches_no_failure_or_stall_signature():
    # The real start-up and stop (the ulimit warning, the engine's config dump, CUDA-graph capture,
    # the SIGTERM shutdown): a signature that fired on one of these lines would fail a boot that was fine.
    pattern, _ = vllm.STALL_LINES
    for line in recorded_lines(H200_BOOT):
        assert not any(s.pattern.search(line) for s in (*vllm.SIGNATURES, *vllm.HINTS)), line
        assert not pattern.search(line), line


def test_the_h200s_own_0_26_0_parser_gives_the_same_snapshot_as_the_cpu_made_one():
    # They differ only in the printed default of --compilation-config (CUDA adds combo_kernels):
    # every flag, its value-taking and its choices are the same, so the lint reads the same.
    cpu = vllm.load_snapshot(HELP.parent / "vllm-0.26.0-serve-help-all.txt")
    gpu = vllm.load_snapshot(HELP.parent / "vllm-0.26.0-serve-help-all-h200.txt")
    assert len(gpu.flags) > 200 and gpu.flags == cpu.flags
    cpu_text = (HELP.parent / "vllm-0.26.0-serve-help-all.txt").read_text()
    gpu_text = (HELP.parent / "vllm-0.26.0-serve-help-all-h200.txt").read_text()
    assert cpu_text != gpu_text and "'combo_kernels': True" in gpu_text and "combo_kernels" not in cpu_text


SAMPLER = "[sampler]\ntemperature = 0.3\nmin_p = 0.1\nrepeat_penalty = 1.05\n"


def _argv(args):
    c = cfg(args, sampler=SAMPLER)
    return c, vllm.build_argv(c, c.ladder.rungs[0], model_path="/models/x/config.json")


def test_a_rungs_generation_config_object_keeps_the_other_sampler_defaults():
    # Was: a rung with its own --override-generation-config dropped every [sampler] default silently.
    c, argv = _argv(["--override-generation-config", '{"temperature": 0.7, "max_new_tokens": 64}'])
    assert argv.count("--override-generation-config") == 1
    assert json.loads(argv[argv.index("--override-generation-config") + 1]) == {
        "temperature": 0.7, "max_new_tokens": 64, "min_p": 0.1, "repetition_penalty": 1.05}
    assert vllm.sampler_overrides(c, c.ladder.rungs[0]) == {"temperature": "--override-generation-config temperature=0.7"}


def test_an_inline_generation_config_is_merged_in_place():
    _, argv = _argv(["--override_generation_config={\"min_p\": 0}"])
    merged = [a for a in argv if a.startswith("--override_generation_config=")]
    assert len(merged) == 1 and "--override-generation-config" not in argv
    assert json.loads(merged[0].split("=", 1)[1]) == {"min_p": 0, "temperature": 0.3, "repetition_penalty": 1.05}


def test_dotted_generation_keys_get_the_missing_defaults_as_dotted_keys():
    # vLLM merges every --override-generation-config.KEY into one object: the defaults join that way.
    c, argv = _argv(["--override-generation-config.temperature", "0.7"])
    assert "--override-generation-config" not in argv
    assert argv[-6:] == ["--override-generation-config.temperature", "0.7",
                         "--override-generation-config.min_p", "0.1",
                         "--override-generation-config.repetition_penalty", "1.05"]
    assert set(vllm.sampler_overrides(c, c.ladder.rungs[0])) == {"temperature"}


def test_a_generation_config_that_is_not_an_object_is_left_to_vllm():
    _, argv = _argv(["--override-generation-config", "not json"])
    assert argv[-2:] == ["--override-generation-config", "not json"] and argv.count("--override-generation-config") == 1


@pytest.mark.parametrize("args, forks", [
    (["--max-model-len", "4096"], True),
    (["--tensor-parallel-size", "1"], True),
    (["--tensor-parallel-size", "2"], False),        # workers of its own: not measured
    (["-tp", "4"], False),
    (["--pipeline-parallel-size=2"], False),
    (["--data-parallel-size", "2"], False),
    (["--api-server-count", "4"], False),           # API servers of its own: not measured either
    (["--tensor-parallel=2"], False),                # a prefix argparse accepts
    (["--data-parallel-size-local", "2"], False),
    (["-pcp", "2"], False),
    (["--nnodes", "2"], False),
    (["--distributed-executor-backend", "mp"], False),
    (["-sc.method=ngram"], False),
    (["--spec-method", "ngram"], False),
    (["--max-num-seqs", "64", "-tp=1"], True),
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'], False),
])
def test_the_engine_core_is_forked_by_default_only_where_that_was_measured_safe(args, forks):
    c = cfg(args)
    env = vllm.engine_defaults(c, c.ladder.rungs[0])
    assert (env.get("VLLM_WORKER_MULTIPROC_METHOD") == "fork") is forks
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in env or forks


def test_the_rung_or_the_pod_can_keep_spawn_and_a_fork_failure_is_its_own_class():
    from supervisor.run.launch import engine_environment
    from supervisor.failure import FailureClass

    c = cfg(["--max-model-len", "4096"], env={"VLLM_WORKER_MULTIPROC_METHOD": "spawn"})
    assert engine_environment(vllm, c, c.ladder.rungs[0], {}, None)["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    c = cfg(["--max-model-len", "4096"])
    env = engine_environment(vllm, c, c.ladder.rungs[0], {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}, None)
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    tail = ["(EngineCore pid=8801) ERROR 12-01 10:25:37 [core.py:1020] RuntimeError: Cannot re-initialize CUDA in "
            "forked subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start method",
            "(APIServer pid=8736) RuntimeError: Engine core initialization failed. See root cause above."]
    f = classify(returncode=1, elapsed_s=30.0, tail=tail, signatures=vllm.SIGNATURES)
    assert f.failure_class == FailureClass.FORK_UNSAFE
    assert vllm.RELAUNCH_ENV[FailureClass.FORK_UNSAFE] == {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
