"""The [watch] table: where published configs come from; validated with every problem at once;
environment overrides; left out of the config hash (it says where updates come from, not what runs)."""

from __future__ import annotations

import pytest

from supervisor.config import WatchSpec, parse_config
from supervisor.errors import ConfigError

BASE = """
engine = "llamacpp"
[model]
source = "/models/m.gguf"
[ladder]
[[ladder.rungs]]
name = "a"
"""


def test_no_watch_table_means_no_watching_and_existing_configs_keep_their_meaning():
    cfg = parse_config(BASE, env={})
    assert cfg.watch == WatchSpec() and not cfg.watch.enabled


def test_a_full_watch_table():
    cfg = parse_config(BASE + """
[watch]
repo = "kiln-test/deploy"
branch = "pods/a40"
path = "pods/a40.toml"
poll_s = 5
max_backoff_s = 60
dir = "/workspace/kiln/config"
debounce_s = 0.1
""", env={})
    w = cfg.watch
    assert (w.repo, w.branch, w.path, w.poll_s, w.max_backoff_s, w.dir, w.debounce_s) == (
        "kiln-test/deploy", "pods/a40", "pods/a40.toml", 5.0, 60.0, "/workspace/kiln/config", 0.1)
    assert w.enabled


def test_every_watch_problem_at_once():
    with pytest.raises(ConfigError) as e:
        parse_config(BASE + """
[watch]
repo = "not a repo"
branch = "../main"
path = "../../etc/passwd"
poll_s = 0
dir = "relative/dir"
debounce_s = -1
pol_s = 3
""", env={})
    text = str(e.value)
    for expected in ("watch.repo: has the wrong form", "watch.branch", "watch.path", "watch.poll_s: is out of range",
                     "watch.dir: has the wrong form", "watch.debounce_s: is out of range",
                     "watch.pol_s: is not a known field; did you mean 'poll_s'?"):
        assert expected in text, expected
    assert len(e.value.problems) >= 7


@pytest.mark.parametrize("path", ["/abs.toml", "a/../b.toml", "..", "a//b", "a b.toml", "a\\b.toml"])
def test_path_must_stay_inside_the_repo_or_directory(path):
    with pytest.raises(ConfigError, match="watch.path"):
        parse_config(BASE + f'[watch]\nrepo = "a/b"\npath = "{path}"\n'.replace("\\", "\\\\"), env={})


def test_env_overrides_watch_fields_including_a_float():
    cfg = parse_config(BASE, env={"KILN_WATCH_REPO": "kiln-test/deploy", "KILN_WATCH_POLL_S": "0.5",
                                  "KILN_WATCH_BRANCH": "canary", "KILN_WATCH_DIR": "/cfg", "KILN_WATCH_PATH": "x.toml"})
    assert (cfg.watch.repo, cfg.watch.poll_s, cfg.watch.branch, cfg.watch.dir, cfg.watch.path) == (
        "kiln-test/deploy", 0.5, "canary", "/cfg", "x.toml")
    with pytest.raises(ConfigError, match=r"watch.poll_s \(from env KILN_WATCH_POLL_S\): must be a number"):
        parse_config(BASE, env={"KILN_WATCH_POLL_S": "often"})


def test_watch_is_not_part_of_the_config_hash():
    a = parse_config(BASE, env={})
    b = parse_config(BASE + '[watch]\nrepo = "a/b"\n', env={})
    assert a.hash == b.hash
    assert parse_config(BASE.replace('name = "a"', 'name = "b"'), env={}).hash != a.hash


@pytest.mark.parametrize("arg", ["4096; --jinja", "`id`", "$(cat /etc/passwd)", "${HOME}", "$HOME", "a && b",
                                 "a > /tmp/x", "a || b"])
def test_shell_syntax_in_args_is_refused(arg):
    with pytest.raises(ConfigError, match="holds shell syntax"):
        parse_config(BASE.replace('name = "a"', f'name = "a"\nargs = ["-c", {arg!r}]'.replace("'", '"')), env={})


@pytest.mark.parametrize("arg", [r"blk\.(1|2)\.ffn_.*_exps=CPU", '{"method": "ngram"}', "price$", "a|b"])
def test_regexes_and_json_in_args_stay_allowed(arg):
    toml_arg = arg.replace("\\", "\\\\").replace('"', '\\"')
    cfg = parse_config(BASE.replace('name = "a"', f'name = "a"\nargs = ["-x", "{toml_arg}"]'), env={})
    assert cfg.ladder.rungs[0].args[1] == arg


def test_fleet_reporting_is_on_with_a_repo_and_its_heartbeat_is_validated():
    cfg = parse_config(BASE + '[watch]\nrepo = "kiln-test/deploy"\n', env={})
    assert cfg.watch.reporting and cfg.watch.report_s == WatchSpec.report_s
    off = parse_config(BASE + '[watch]\nrepo = "kiln-test/deploy"\nreport = false\n', env={})
    assert not off.watch.reporting
    assert not parse_config(BASE + '[watch]\ndir = "/tmp/x"\n', env={}).watch.reporting   # no repo, no report
    with pytest.raises(ConfigError) as e:
        parse_config(BASE + '[watch]\nrepo = "kiln-test/deploy"\npoll_s = 30\nreport_s = 10\n', env={})
    assert "watch.report_s: must be >= poll_s" in str(e.value) and "got 10.0" in str(e.value)
    assert "allowed: 30 or more" in str(e.value)


@pytest.mark.parametrize("branch", ["kiln-fleet", "kiln-canary/main"])
def test_a_pod_cannot_watch_the_fleets_own_branches(branch):
    with pytest.raises(ConfigError) as e:
        parse_config(BASE + f'[watch]\nrepo = "kiln-test/deploy"\nbranch = "{branch}"\n', env={})
    assert f"watch.branch: is where Kiln keeps the fleet's records" in str(e.value) and branch in str(e.value)


def test_the_fleet_fields_stay_out_of_the_config_hash():
    a = parse_config(BASE + '[watch]\nrepo = "kiln-test/deploy"\n', env={})
    b = parse_config(BASE + '[watch]\nrepo = "kiln-test/deploy"\nreport = false\nreport_s = 60\n', env={})
    assert a.hash == b.hash
