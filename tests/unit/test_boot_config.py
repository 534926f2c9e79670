"""A boot config that does not validate (issue 24, item 3): the pure parts. What is still usable of
it (config.boot_fallback), how each problem is shown on /status (run/boot_failure.py), and
the readers that raise a ConfigError where a traceback came out (validate.read_text, _apply_env).
The real `python -m supervisor run`: tests/integration/test_boot_failure.py."""

from __future__ import annotations

import errno

import pytest

from supervisor import hubclient
from supervisor.config import RUNPOD_API_URL, boot_fallback, load_config, parse_config
from supervisor.errors import ConfigError, Problem
from supervisor.run.boot_failure import failure_record
from supervisor.validate import read_text

BASE = '[model]\nsource = "/m.gguf"\n[ladder]\n[[ladder.rungs]]\nname = "a"\n'


def test_a_file_that_is_not_utf8_or_cannot_be_read_is_a_config_error_saying_where(tmp_path):
    f = tmp_path / "deploy.toml"
    f.write_bytes(b'engine = "llamacpp"\n# na\xefve\n')
    with pytest.raises(ConfigError) as e:
        load_config(f)
    (p,) = e.value.problems
    assert (p.path, p.message, p.value) == ("(file)", "is not UTF-8 text: byte 0xef at line 2, column 5", str(f))
    with pytest.raises(ConfigError) as e:
        read_text(tmp_path / "missing.toml", "target")
    assert e.value.what == "target" and e.value.problems[0].message == "cannot be read: No such file or directory"
    with pytest.raises(ConfigError, match="cannot be read: Is a directory"):
        read_text(tmp_path)


def test_an_env_override_under_a_key_that_is_not_a_table_is_a_problem_not_a_type_error():
    with pytest.raises(ConfigError) as e:
        parse_config("status = 3\n" + BASE, env={"KILN_STATUS_PORT": "9123", "KILN_MODEL_ENTRY": "x"})
    text = str(e.value)
    assert "status.port (from env KILN_STATUS_PORT): cannot be applied: status in the file is not a table" in text
    assert "status: must be a table (got 3)" in text


def test_the_fallback_status_port_is_the_envs_else_the_files_where_valid_else_8081():
    assert boot_fallback(None, {})[0].port == 8081 and boot_fallback("not a table", {})[0].host == "0.0.0.0"
    data = {"status": {"port": 9000, "host": "127.0.0.1", "typo": 1}}
    assert boot_fallback(data, {})[0].port == 9000
    assert boot_fallback(data, {"KILN_STATUS_PORT": "9123"})[0].port == 9123
    assert boot_fallback(data, {"KILN_STATUS_PORT": "abc"})[0].port == 9000          # env invalid: the file's
    assert boot_fallback({"status": {"port": 70000}}, {"KILN_STATUS_PORT": "0"})[0].port == 8081
    assert boot_fallback({"status": 3}, {"KILN_STATUS_PORT": "9123"})[0].port == 9123


def test_the_fallback_self_termination_honours_the_env_and_the_files_valid_fields_and_only_runpods_api():
    off = boot_fallback(None, {})[1]
    assert off.terminate_on_terminal_failure is False and off.api_url == RUNPOD_API_URL
    on = boot_fallback(None, {"KILN_RUNPOD_TERMINATE_ON_TERMINAL_FAILURE": "true"})[1]
    assert on.terminate_on_terminal_failure is True and on.terminate_grace_s == 300.0
    data = {"runpod": {"terminate_on_terminal_failure": True, "terminate_grace_s": 2.0,
                       "api_url": "http://attacker.example/v2"}}
    spec = boot_fallback(data, {})[1]
    assert spec.terminate_on_terminal_failure and spec.terminate_grace_s == 2.0 and spec.api_url == RUNPOD_API_URL
    assert boot_fallback(data, {"KILN_RUNPOD_API_URL": "http://127.0.0.1:9/v2"})[1].api_url == "http://127.0.0.1:9/v2"
    assert boot_fallback(data, {"KILN_RUNPOD_TERMINATE_ON_TERMINAL_FAILURE": "no"})[1] \
        .terminate_on_terminal_failure is False


def test_each_problem_on_status_says_field_value_origin_and_fix_and_never_echoes_a_key():
    err = ConfigError("deploy config /etc/kiln/deploy.toml", [
        Problem("server.port (from env KILN_SERVER_PORT)", "must be an integer", "abc"),
        Problem("server.api_key", "has the wrong form", "sk-live-0123456789", '"env:NAME", "file:/path" or "none"'),
        Problem("model.source", "is required"),
    ])
    rec = failure_record(err, "/etc/kiln/deploy.toml")
    env, key, missing = rec["problems"]
    assert env == {"field": "server.port", "value": "abc", "from": "env KILN_SERVER_PORT",
                   "problem": "must be an integer", "fix": env["fix"]}
    assert "KILN_SERVER_PORT" in env["fix"]
    assert key["value"] == "not shown: it may be a key" and "sk-live" not in repr(rec)
    assert key["from"] == "/etc/kiln/deploy.toml" and key["fix"].startswith('allowed: "env:NAME"')
    assert "value" not in missing and "change model.source in /etc/kiln/deploy.toml" in missing["fix"]
    assert rec["class"] == "config_rejected" and len(rec["hints"]) == 4
    assert rec["hints"][0].startswith("server.port = 'abc' (from env KILN_SERVER_PORT): must be an integer. Fix: ")


def test_a_malformed_hf_endpoint_is_named_before_huggingface_hub_raises_on_it(tmp_path):
    assert hubclient.endpoint_problem({}) is None
    assert hubclient.endpoint_problem({"HF_ENDPOINT": "https://hf-mirror.example"}) is None
    assert "is not a URL (Invalid IPv6 URL)" in hubclient.endpoint_problem({"HF_ENDPOINT": "http://[::1"})
    assert "is not an http(s) URL" in hubclient.endpoint_problem({"HF_ENDPOINT": "ftp://x"})
    token = tmp_path / "token"
    token.write_bytes(b"hf_\xff\n")
    with pytest.raises(OSError) as e:
        hubclient.token_or_file(str(token))
    assert e.value.errno == errno.EILSEQ and "not UTF-8" in e.value.strerror
    token.write_text("[model\nsource = \n")
    with pytest.raises(OSError, match="more than one word"):
        hubclient.token_or_file(str(token))
    token.write_text("hf_abc\n")
    assert hubclient.token_or_file(str(token)) == "hf_abc"


def test_the_last_net_of_both_clis_is_one_masked_line_and_the_traceback_only_when_asked(monkeypatch, capsys):
    import supervisor.__main__ as sup_main
    from images.cli import app

    def bug(*a, **k):
        raise ValueError("boom near hf_secretTokenValue123")

    monkeypatch.setenv("HF_TOKEN", "hf_secretTokenValue123")
    monkeypatch.delenv("KILN_TRACEBACK", raising=False)
    monkeypatch.setattr(sup_main, "_main", bug)
    assert sup_main.main(["check-config", "x"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unexpected ValueError: boom near ***" in err and "Traceback" not in err
    monkeypatch.setattr(app, "parser", bug)
    assert app.main(["list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: unexpected ValueError: boom near ***") and "Traceback" not in err
    monkeypatch.setenv("KILN_TRACEBACK", "1")
    assert app.main(["list"]) == 1 and "Traceback" in capsys.readouterr().err


def test_a_config_that_needs_the_hub_refuses_a_malformed_hf_endpoint_at_boot_naming_the_fix():
    hub = ('engine = "llamacpp"\n[model]\nsource = "hf://owner/name"\nentry = "m.gguf"\n'
           '[ladder]\n[[ladder.rungs]]\nname = "r"\nplacement = "cpu"\n')
    with pytest.raises(ConfigError) as e:
        parse_config(hub, source="/etc/kiln/deploy.toml", env={"HF_ENDPOINT": "hf-mirror.example"})
    rec = failure_record(e.value, "/etc/kiln/deploy.toml")
    (p,) = rec["problems"]
    assert p["field"] == "HF_ENDPOINT" and p["from"] == "env HF_ENDPOINT" and p["value"] == "hf-mirror.example"
    assert "is not an http(s) URL" in p["problem"] and "correct HF_ENDPOINT" in p["fix"]
    # a config that never talks to the Hub does not care what HF_ENDPOINT holds
    local = hub.replace('source = "hf://owner/name"\nentry = "m.gguf"', 'source = "/models/m.gguf"')
    assert parse_config(local, env={"HF_ENDPOINT": "hf-mirror.example"}).model.source == "/models/m.gguf"
    assert parse_config(hub, env={"HF_ENDPOINT": "https://hf-mirror.example"}).model.source == "hf://owner/name"
    with pytest.raises(ConfigError) as e:             # a token in a malformed URL is not shown
        parse_config(hub, env={"HF_ENDPOINT": "https://user:hf_secret@mirror:abc"})
    assert "hf_secret" not in str(e.value) and "***@mirror:abc" in str(e.value)
