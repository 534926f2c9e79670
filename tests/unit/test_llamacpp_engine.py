"""llama.cpp engine: flag snapshot, lint (unknown/removed flags), autofit guard, argv."""

from pathlib import Path

import pytest

from supervisor.config import parse_config
from supervisor.engines import llamacpp
from supervisor.engines.flags import load_llama_snapshot

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
