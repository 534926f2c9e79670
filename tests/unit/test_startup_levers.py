"""The deploy config's [startup] levers (supervisor/engines/startup.py): each names a flag the pinned
engine's own --help lists, reaches argv only when set and only where the rung does not set it
itself, is refused for the other engine or a value the engine does not take, and leaves the hash of
every config without it as it was (the ladder memory's key, a published config's "unchanged")."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from supervisor.config import StartupSpec, parse_config
from supervisor.engines import llamacpp, startup, vllm
from supervisor.engines.flags import load_argparse_snapshot, load_llama_snapshot, parse_llama_help
from supervisor.errors import ConfigError

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "engine-logs"
LLAMA_HELP = LOGS / "llama-server-help-cpu-11434.txt"
VLLM_HELPS = [LOGS / "vllm-0.26.0-serve-help-all.txt", LOGS / "vllm-0.26.0-serve-help-all-h200.txt",
              LOGS / "vllm-0.27.1-serve-help-all.txt"]
TEMPLATES = Path(__file__).resolve().parents[2] / "images" / "templates"


def config(engine: str, table: str = "", args: list[str] | None = None, env: dict[str, str] | None = None):
    text = (f'engine = "{engine}"\n[model]\nsource = "/models/m/config.json"\n'
            + (f"[startup]\n{table}\n" if table else "")
            + f'[[ladder.rungs]]\nname = "main"\nargs = {json.dumps(args or [])}\n')
    return parse_config(text, env=env or {})


def argv(cfg) -> list[str]:
    mod = vllm if cfg.engine == "vllm" else llamacpp
    return mod.build_argv(cfg, cfg.ladder.rungs[0], model_path="/models/m/config.json", api_key_file=None)


def test_every_lever_is_a_flag_of_the_pinned_engines_with_the_values_their_help_lists():
    llama = load_llama_snapshot(LLAMA_HELP)
    assert llama.get("--load-mode") and llama.get("-lm") is llama.get("--load-mode")
    help_text = LLAMA_HELP.read_text()
    for mode in startup.LEVERS["load_mode"].choices:
        assert f"- {mode}:" in help_text, mode
    for path in VLLM_HELPS:
        snap = load_argparse_snapshot(path)
        for name, lever in startup.LEVERS.items():
            if lever.engine == "vllm":
                assert snap.get(lever.flag), (path.name, lever.flag)
        assert set(startup.LEVERS["safetensors_load_strategy"].choices) == \
            set(snap.get("--safetensors-load-strategy").choices) - {"None"}
        assert "-O0 having the best" in path.read_text()       # the levels 0..3 and what 0 is for


def test_nothing_set_adds_nothing_and_the_hash_is_the_one_configs_had_before():
    for engine in ("llamacpp", "vllm"):
        cfg = config(engine)
        assert cfg.startup == StartupSpec()
        assert not {"--load-mode", "--optimization-level", "--load-format", "--compilation-config",
                    "--safetensors-load-strategy"} & set(argv(cfg))
        d = dataclasses.asdict(cfg)
        for key in ("source", "watch", "runpod", "serverless", "startup", "router", "plan", "cache"):  # added since, at defaults
            d.pop(key)
        d["server"].pop("fast_start")
        before = hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":"), default=list).encode()).hexdigest()
        assert cfg.hash == before
        assert config(engine, "load_mode = \"dio\"" if engine == "llamacpp" else "optimization_level = 0").hash != before


def test_a_lever_reaches_argv_unless_the_rung_sets_its_flag_itself():
    out = argv(config("llamacpp", 'load_mode = "dio"'))
    assert out[out.index("--load-mode") + 1] == "dio"
    assert argv(config("llamacpp", 'load_mode = "dio"', ["-lm", "none"])).count("dio") == 0
    cfg = config("vllm", 'optimization_level = 0\nload_format = "safetensors"\nsafetensors_load_strategy = "eager"\n'
                 'compilation_config = \'{"cudagraph_capture_sizes": [1, 2, 4]}\'')
    out = argv(cfg)
    for flag, value in (("--optimization-level", "0"), ("--load-format", "safetensors"),
                        ("--safetensors-load-strategy", "eager"),
                        ("--compilation-config", '{"cudagraph_capture_sizes": [1, 2, 4]}')):
        assert out[out.index(flag) + 1] == value
    for rung_args in (["-O3"], ["--optimization-level", "3"], ["-O", "3"]):
        out = argv(config("vllm", "optimization_level = 0", rung_args))
        assert out.count("--optimization-level") == rung_args.count("--optimization-level") and "0" not in out
    for rung_args in (["-cc.mode=3"], ["--compilation-config", "{}"], ["-cc", "{}"]):
        assert argv(config("vllm", 'compilation_config = "{}"', rung_args)).count("--compilation-config") \
            == rung_args.count("--compilation-config")


@pytest.mark.parametrize("engine, table, says", [
    ("vllm", 'load_mode = "dio"', "applies to llamacpp (--load-mode); this config's engine is vllm"),
    ("llamacpp", "optimization_level = 0", "applies to vllm"),
    ("vllm", "optimization_level = 4", "out of range"),
    ("vllm", 'load_format = "dummy"', "random-weights loader"),
    ("vllm", 'compilation_config = "{nope"', "is not JSON"),
    ("vllm", 'compilation_config = "[1, 2]"', "must be a JSON object"),
    ("vllm", 'safetensors_load_strategy = "fast"', "is not a known value"),
    ("llamacpp", 'load_mode = "directio"', "is not a known value"),
    ("vllm", 'warp_speed = true', "startup.warp_speed"),
])
def test_a_lever_that_cannot_work_is_refused_naming_the_field(engine, table, says):
    with pytest.raises(ConfigError) as e:
        config(engine, table)
    assert says in str(e.value) and "startup." in str(e.value)


def test_the_environment_sets_a_lever_as_a_runpod_template_would():
    cfg = config("vllm", env={"KILN_STARTUP_OPTIMIZATION_LEVEL": "0", "KILN_STARTUP_SAFETENSORS_LOAD_STRATEGY": "eager"})
    assert (cfg.startup.optimization_level, cfg.startup.safetensors_load_strategy) == (0, "eager")
    assert config("llamacpp", env={"KILN_STARTUP_LOAD_MODE": "dio"}).startup.load_mode == "dio"


def test_the_lint_refuses_a_lever_whose_flag_or_value_this_build_lacks():
    cfg = config("llamacpp", 'load_mode = "dio"')
    without = parse_llama_help("\n".join(ln for ln in LLAMA_HELP.read_text().splitlines()
                                         if "--load-mode" not in ln), "a fork without it")
    issues = [str(i) for i in llamacpp.lint_rung(cfg, 0, cfg.ladder.rungs[0], without)]
    assert any("startup.load_mode: this llamacpp build has no --load-mode (flag snapshot a fork without it)" in i
               for i in issues)
    assert not llamacpp.lint_rung(cfg, 0, cfg.ladder.rungs[0], load_llama_snapshot(LLAMA_HELP))
    cfg = config("vllm", 'safetensors_load_strategy = "torchao"')
    assert not vllm.lint_rung(cfg, 0, cfg.ladder.rungs[0], load_argparse_snapshot(VLLM_HELPS[0]))


def test_the_engines_site_packages_get_bytecode_at_build_not_on_each_workers_first_import():
    # pip compiles what it installs unless told --no-compile; where it is told (the reproducible venv
    # stage: its bytecode is compiled once every source is dated), compileall of the venv follows in
    # the same step. The supervisor is compileall'd itself.
    for template in TEMPLATES.glob("*.j2"):
        for step in template.read_text().split("\nRUN ")[1:]:
            if "--no-compile" in step:
                assert "-m compileall -q -f --invalidation-mode timestamp /opt/kiln/venv" in step, template.name
    assert "python3 -m compileall -q --invalidation-mode timestamp /opt/kiln/app/supervisor" in \
        (TEMPLATES / "_supervisor.j2").read_text()
    assert "/opt/kiln/venv/bin/pip install" in (TEMPLATES / "vllm.Dockerfile.j2").read_text()
    assert "--no-compile" not in (TEMPLATES / "vllm.Dockerfile.j2").read_text()


# -- Kiln's own load mode where nothing sets one (engines/llamacpp.py boot_args; issue 28, P9)

GiB = 2**30


def boot(cfg, *, weights=6 * GiB, free=(139_000,), env=None, snapshot="help", prefetched=True):
    snap = load_llama_snapshot(LLAMA_HELP) if snapshot == "help" else snapshot
    return llamacpp.boot_args(cfg, cfg.ladder.rungs[0], snapshot=snap, env=env or {}, weights_bytes=weights,
                              gpu_free_mib=list(free), prefetched=prefetched)


def test_none_is_added_only_where_every_layer_fits_on_the_gpu():
    args, why = boot(config("llamacpp"))
    assert args == ["--load-mode", "none"] and "every layer fits" in why
    assert boot(config("llamacpp"), weights=20 * GiB, free=(24_000,))[0] == []        # autofit would keep layers on the CPU
    assert boot(config("llamacpp"), weights=20 * GiB, free=(16_000, 16_000))[0] == ["--load-mode", "none"]   # two cards
    assert boot(config("llamacpp"), free=())[0] == []                                 # no GPU: mmap costs nothing there
    assert boot(config("llamacpp"), weights=None)[0] == []
    assert boot(config("llamacpp"), prefetched=False)[0] == []                        # measured only with the read


def test_placement_in_the_pods_environment_or_a_choice_of_devices_keeps_the_engines_default():
    # Was: only argv was looked at, so experts put on the CPU by the pod's LLAMA_ARG_N_CPU_MOE still
    # got `none` (a held-out review, 2026-12-02)
    for var, value in (("LLAMA_ARG_N_CPU_MOE", "30"), ("LLAMA_ARG_CPU_MOE", "1"), ("LLAMA_ARG_N_GPU_LAYERS", "10"),
                       ("LLAMA_ARG_OVERRIDE_TENSOR", "exps=CPU")):
        assert boot(config("llamacpp"), env={var: value})[0] == [], var
    for args in (["-dev", "CUDA0"], ["--device", "none"], ["-sm", "none"], ["-mg", "1"]):
        assert boot(config("llamacpp", args=args))[0] == [], args
    visible = parse_config('engine = "llamacpp"\n[model]\nsource = "/m.gguf"\n[[ladder.rungs]]\nname = "v"\n'
                           '[ladder.rungs.env]\nCUDA_VISIBLE_DEVICES = "0"\n', env={})
    assert boot(visible)[0] == []
    assert boot(config("llamacpp"), env={"HF_HOME": "/x"})[0] == ["--load-mode", "none"]   # unrelated variables


def test_a_rung_that_places_layers_itself_or_sets_a_load_mode_keeps_the_engines_default():
    for args in (["-ngl", "10"], ["--n-cpu-moe", "30"], ["-ot", "exps=CPU"], ["--cpu-moe"],
                 ["--load-mode", "mmap"], ["-lm", "mmap"], ["--no-mmap"], ["--mlock"]):
        assert boot(config("llamacpp", args=args))[0] == [], args
    cpu = parse_config('engine = "llamacpp"\n[model]\nsource = "/m.gguf"\n[[ladder.rungs]]\nname = "c"\n'
                       'placement = "cpu"\n', env={})
    assert boot(cpu)[0] == []
    assert boot(config("llamacpp", 'load_mode = "mmap"'))[0] == []
    assert boot(config("llamacpp"), env={"LLAMA_ARG_LOAD_MODE": "mmap"})[0] == []     # the pod's environment
    rung_env = parse_config('engine = "llamacpp"\n[model]\nsource = "/m.gguf"\n[[ladder.rungs]]\nname = "e"\n'
                            '[ladder.rungs.env]\nLLAMA_ARG_MMAP = "1"\n', env={})
    assert boot(rung_env)[0] == []


def test_a_build_without_load_mode_none_or_without_a_snapshot_gets_nothing():
    without = parse_llama_help("\n".join(ln for ln in LLAMA_HELP.read_text().splitlines()
                                         if "--load-mode" not in ln), "a fork without it")
    assert boot(config("llamacpp"), snapshot=without)[0] == []
    assert boot(config("llamacpp"), snapshot=None)[0] == []
    assert vllm.boot_args(config("vllm"), config("vllm").ladder.rungs[0])[0] == []
