"""build.py as subcommands: each with its own --help, --version, the old flag spellings refused (they
went before a first release), conflicting options refused, every user error one line and exit 2
(never a traceback), and docs/cli.md generated from the parsers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from images.cli import app as cli
from images.pins import lock as lockfile
from images.cli import reference
from images.paths import DOCS_CLI
from supervisor import __version__

ROOT = Path(__file__).resolve().parents[2]


def build_py(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "build.py"), *args], capture_output=True, text=True, cwd=cwd)


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    """A user error: exit 2, no traceback, and stderr's last line the message."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    return r.stderr.strip().splitlines()[-1]


# -- the commands and their --help -----------------------------------------------------------------
# What each subcommand takes: its --help lists exactly these (a new option is a reviewed change here).
TAKES = {
    "build": {"--target", "--image", "--tag", "--push", "--staging", "--base-image", "--ca-bundle",
              "--allow-floating", "--binaries", "--binaries-store", "--fallback-compile", "--patch-file",
              "--cache-from", "--cache-to", "--build-network", "--no-cache", "--out"},
    "render": {"--target", "--out", "--base-image", "--allow-floating", "--patch-file"},
    "list": set(),
    "tag": {"--target", "--image", "--base-image"},
    "lock": {"--target", "--patch-file"},
    "upgrade": {"--target", "--to", "--dry-run", "--published", "--snapshot", "--index", "--python", "--cpu-torch"},
    "compile": {"--target", "--patch-file", "--jobs", "--force", "--allow-floating", "--publish", "--rebuild-check"},
    "publish-binaries": {"--target", "--store", "--patch-file", "--allow-floating", "--in-build", "--build-network",
                         "--rebuild-check"},
    "rebuild-binaries": {"--target", "--against", "--in-build", "--patch-file", "--allow-floating", "--build-network"},
    "compare-images": {"--show"},
    "keygen": {"--out"},
    "sign": {"--target", "--image", "--key", "--attest", "--verdict"},
    "verify": {"--image", "--key", "--ungated"},
    "template": {"--target", "--image", "--image-ref", "--name", "--registry-auth", "--upsert", "--api",
                 "--allow-floating"},
    "pods": set(),          # a group: up, status, logs, down, volumes (their options: images/cli/pods.py)
    "endpoint": set(),      # a group: plan, up, status, logs, down (their options: images/cli/endpoint.py)
    "cluster": set(),       # a group: plan, up, status, logs, down (their options: images/cli/cluster.py)
    "plan": {"--model", "--ctx", "--streams", "--engine", "--kv-type", "--gpu", "--count", "--write-config", "--max-usd-h", "--cloud", "--json",
             "--api"},
    "publish-config": {"--repo", "--branch", "--path", "--flags", "--message", "--token-file", "--create",
                       "--canary", "--wait", "--timeout"},
    "fleet-status": {"--repo", "--branch", "--path", "--json", "--token-file"},
    "router": {"--replicas", "--status-urls", "--policy", "--host", "--port", "--status-port", "--metrics-port",
               "--engine-port", "--poll-s", "--api-key-env", "--no-api-key", "--state-dir", "--router-python", "--print-config"},
    "generate": {"--check", "--only"},
}


def test_top_level_help_lists_every_subcommand_and_version_is_kilns():
    r = build_py("--help")
    assert r.returncode == 0
    listed = [line.split()[0] for line in r.stdout.split("commands:")[1].splitlines()[2:] if line.startswith("    ")
              and not line.startswith("     ")]
    assert listed == [c.name for c in cli.COMMANDS] == list(TAKES)
    r = build_py("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"Kiln {__version__}"


@pytest.mark.parametrize("name", list(TAKES))
def test_each_subcommand_help_lists_exactly_what_it_takes(name):
    r = build_py(name, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: python build.py {name} ")
    options = r.stdout.split("\noptions:\n")[1]
    shown = set(re.findall(r"^  (?:-h, )?(--[\w-]+)", options, re.MULTILINE)) - {"--help"}
    assert shown == TAKES[name]
    assert cli.options_of(name) - {"-h", "--help"} == TAKES[name]


def test_docs_cli_md_is_generated_from_the_parsers_and_has_not_drifted():
    committed = DOCS_CLI.read_text(encoding="utf-8")
    assert committed == reference.render(cli.parser()), "docs/cli.md drifted: run `python build.py generate`"
    for name in TAKES:
        assert f"## `python build.py {name}`" in committed


def test_help_does_not_depend_on_the_terminal_width():
    narrow = subprocess.run([sys.executable, "build.py", "render", "--help"], capture_output=True, text=True,
                            cwd=ROOT, env={**os.environ, "COLUMNS": "40"})
    wide = subprocess.run([sys.executable, "build.py", "render", "--help"], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "COLUMNS": "250"})
    assert narrow.stdout == wide.stdout


def test_a_new_command_module_mounts_through_the_table(monkeypatch):
    """How a group is added (as `pods` was): a Command with children, appended to cli.COMMANDS."""
    seen = []
    up = cli.Command("up", "start a thing", lambda a: seen.append(("up", a.target)) or 0,
                     lambda p: p.add_argument("--target"))
    group = cli.Command("things", "things of a target", children=(up,))
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, group))
    assert cli.main(["things", "up", "--target", "x"]) == 0 and seen == [("up", "x")]
    assert "things" in cli.parser().format_help()
    assert cli.options_of("things up") == {"-h", "--help", "--target"}


def test_kiln_and_python_m_images_cli_are_build_py_by_other_names():
    """`kiln` (the console script pyproject.toml declares) and `python -m images.cli` (what old spellings
    forward to) run the same parser as build.py; kiln's usage lines say `kiln`."""
    import importlib
    import tomllib

    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["kiln"]
    module, _, func = entry.partition(":")
    assert getattr(importlib.import_module(module), func) is cli.kiln
    top = build_py("--help").stdout
    as_module = subprocess.run([sys.executable, "-m", "images.cli", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert as_module.returncode == 0 and as_module.stdout == top
    as_kiln = subprocess.run([sys.executable, "-c", "import sys; from images.cli.app import kiln; "
                              "sys.argv = ['kiln', '--help']; sys.exit(kiln())"],
                             capture_output=True, text=True, cwd=ROOT)
    assert as_kiln.returncode == 0 and as_kiln.stdout.startswith("usage: kiln [-h] [--version] COMMAND ...")
    assert as_kiln.stdout.split("\ncommands:\n")[1] == top.split("\ncommands:\n")[1]     # every command, the same


def test_the_pods_group_mounts_every_pod_command():
    assert {"up", "status", "logs", "down", "volumes"} <= {
        path[1] for _, path in cli.walk(cli.parser()) if len(path) == 2 and path[0] == "pods"}
    assert "--replicas" in cli.options_of("pods up") and "--all" in cli.options_of("pods down")
    for up in ("pods up", "endpoint up", "cluster up"):          # verify the image before renting (issue 53)
        assert {"--verify", "--key"} <= cli.options_of(up), up


# -- the design card's short form: `--target T` is `build --target T` (issue 48) ---------------------
@pytest.mark.parametrize("rest", [
    ["a40-llamacpp"],                                    # floating pins: build refuses, exit 2, the same words
    ["cpu-llamacpp", "--help"],                          # build's own help
    ["cpu-llamacpp", "--render"],                        # an option build does not take: the same usage error
    ["no-such-target"],                                  # the same one-line error naming the targets
])
def test_the_short_form_does_exactly_what_build_does(rest, tmp_path):
    short = build_py("--target", *rest, cwd=tmp_path)
    long = build_py("build", "--target", *rest, cwd=tmp_path)
    assert (short.returncode, short.stdout, short.stderr) == (long.returncode, long.stdout, long.stderr)
    assert "invalid choice" not in short.stderr


def test_the_short_form_with_an_equals_sign_and_its_help_line():
    r = build_py("--target=a40-llamacpp")
    assert r.returncode == 2 and "--allow-floating" in r.stderr and "invalid choice" not in r.stderr
    assert "`python build.py --target T` is short" in build_py("--help").stdout.replace("\n", " ")


# -- the old spellings are gone (issue 35: no shims before a first release; CHANGELOG.md) -------------
@pytest.mark.parametrize("argv", [["--list"], ["--target", "cpu-llamacpp", "--render", "--out", "D"],
                                  ["--target", "cpu-llamacpp", "--print-tag"]])    # build takes no --render, no --print-tag
def test_an_old_single_command_spelling_is_refused_not_guessed(argv, tmp_path):
    r = build_py(*argv, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv,says", [
    (["build", "--binaries", "compile", "--fallback-compile"], "--fallback-compile cannot be combined with --binaries compile"),
    (["build", "--binaries", "compile", "--binaries-store", "/x"], "--binaries-store cannot be combined"),
    (["template", "--api", "http://127.0.0.1:9/v1"], "--api cannot be combined with printing the template"),
    (["template", "--allow-floating"], "--allow-floating cannot be combined with printing the template"),
    (["publish-binaries", "--store", "/x", "--build-network", "default"], "--build-network cannot be combined"),
    (["rebuild-binaries", "--build-network", "default"], "--build-network cannot be combined"),
    (["render", "--push"], "unrecognized arguments: --push"),
    (["tag", "--out", "D"], "unrecognized arguments: --out"),
])
def test_conflicting_new_options_are_refused(argv, says):
    assert says in one_line_error(build_py(*argv))


# -- bad input: one line, exit 2, never a traceback --------------------------------------------------
def test_bad_input_to_every_command_is_one_line_and_exit_2(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    not_utf8 = tmp_path / "latin1.patch"
    not_utf8.write_bytes(b"\xff\xfe")
    cases = [
        (["build", "--target", "a40-llama"], "--target: is not a known target (got 'a40-llama'); allowed: a40-llamacpp"),
        (["render", "--target", "../targets/cpu-llamacpp"], "is not a known target"),
        (["tag", "--target", ""], "is not a known target"),
        (["render", "--out", str(a_file)], f"--out {a_file}: is a file, not a directory"),
        (["render", "--out", str(tmp_path / "no" / "such" / "dir")], "does not exist; create it first"),
        (["render", "--out", "/proc/kiln-not-writable"], "--out /proc/kiln-not-writable: "),
        (["render", "--patch-file", "x"], "--patch-file 'x': expected NAME=PATH"),
        (["render", "--patch-file", f"p={tmp_path}/missing.patch"], "no such file"),
        (["build", "--ca-bundle", str(tmp_path / "missing.crt")], "--ca-bundle"),
        (["build", "--ca-bundle", str(tmp_path)], "is not a file"),
        (["build", "--binaries", "sometimes"], "invalid choice: 'sometimes'"),
        (["build", "--target", "a40-llamacpp"], "pass --allow-floating to build anyway"),
        (["compile", "--target", "a40-vllm"], "is a vllm target: nothing to compile"),
        (["compile", "--jobs", "0"], "--jobs 0: must be 1 or more"),
        (["compile", "--jobs", "many"], "invalid int value: 'many'"),
        (["lock", "--target", "nope"], "is not a known target"),
        (["lock", "--patch-file", "p=/nonexistent.patch"], "no such file"),
        (["publish-binaries", "--target", "cpu-llamacpp"], "the following arguments are required: --store"),
        (["rebuild-binaries", "--target", "a40-vllm"], "is a vllm target: no compiled binaries to rebuild"),
        (["rebuild-binaries", "--against", str(tmp_path / "empty-store")], "to compare with: pass --against STORE"),
        (["compare-images", "kiln-test/none:1"], "the following arguments are required: OTHER"),
        (["template", "--image", "Registry/Me:tag"], "expected a repository"),
        (["template", "--upsert", "--target", "cpu-llamacpp"], "needs RUNPOD_API_KEY"),
        (["pods"], "the following arguments are required: COMMAND"),
        (["pods", "up"], "the following arguments are required: --target"),
        (["--target"], "argument --target: expected one argument"),     # the short form of build --target
        # issue 37 item 7: 0 meant 1800 s and a negative timeout was taken; --vcpu 3 passed the help's "a power of two"
        (["endpoint", "up", "--target", "cpu-llamacpp", "--wait", "--timeout", "0"], "--timeout 0: seconds, more than 0"),
        (["endpoint", "up", "--target", "cpu-llamacpp", "--wait", "--timeout", "-5"], "--timeout -5: seconds, more than 0"),
        (["endpoint", "up", "--target", "cpu-llamacpp", "--wait", "--poll", "0"], "--poll 0: seconds, more than 0"),
        (["endpoint", "up", "--target", "cpu-llamacpp", "--wait", "--settle", "0"], "--settle 0: seconds, more than 0"),
        (["endpoint", "up", "--target", "cpu-llamacpp", "--settle", "5"], "--settle only go with --wait"),
        # item 13: was KeyError: 'router'; the router's upgrade itself: tests/integration/test_upgrade_router.py
        (["upgrade", "--target", "router", "--snapshot", "1.14.0"], "--snapshot '1.14.0': expected VERSION=FILE"),
        (["endpoint", "plan", "--target", "cpu-llamacpp", "--cpu-flavor", "cpu3c", "--vcpu", "3"],
         "--vcpu 3: RunPod's CPU workers come in powers of two vCPUs"),
    ]
    env = {k: v for k, v in os.environ.items() if k != "RUNPOD_API_KEY"}
    for argv, says in cases:
        r = subprocess.run([sys.executable, "build.py", *argv], capture_output=True, text=True, cwd=ROOT, env=env)
        assert says in one_line_error(r), (argv, r.stderr)
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("content,says", [
    (b"\xff\xfe not utf-8", "is not UTF-8 text"),
    (b"[t]\nvalue = \n", "is not valid TOML"),
    (None, "cannot be read"),                                  # a directory where the lock should be
])
def test_an_unreadable_lock_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, content, says):
    bad = tmp_path / "lock.toml"
    if content is None:
        bad.mkdir()
    else:
        bad.write_bytes(content)
    monkeypatch.setattr(lockfile, "LOCK_PATH", bad)
    for argv in (["tag"], ["render", "--out", str(tmp_path / "r")], ["lock"], ["template"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {bad}: 1 problem(s)") and says in err, err
    assert not (tmp_path / "r").exists()


def test_a_lock_that_cannot_be_written_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(lockfile, "LOCK_PATH", Path("/proc/kiln-lock.toml"))     # not writable, even by root
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")                     # resolvers fail fast, offline
    monkeypatch.setenv("NO_PROXY", "")
    assert cli.main(["lock", "--target", "cpu-llamacpp"]) == 2
    out, err = capsys.readouterr()
    assert "base.build: UNRESOLVED" in out                                       # the report still came out
    assert err.startswith("error: /proc/kiln-lock.toml: 1 problem(s)") and "cannot be written" in err


def test_a_reader_that_went_away_is_not_an_error():
    """`build.py list | head -1`: stdout is a pipe nobody reads any more (its read end closed first,
    so the write fails for certain)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        # a user's stdout is buffered: the failing write is the last flush (PYTHONUNBUFFERED hid that)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        r = subprocess.run([sys.executable, "build.py", "list"], stdout=write_end, stderr=subprocess.PIPE,
                           text=True, cwd=ROOT, env=env)
    finally:
        os.close(write_end)
    assert r.stderr == "" and r.returncode == 141
