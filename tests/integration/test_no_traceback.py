"""No traceback reaches a user from any `python -m supervisor` or `python build.py` command (issue 24,
item 3): every subcommand of both, run as a user runs it, with bad input -- a file that is missing,
not UTF-8 or not TOML (given as an argument, or a target/lock file of the checkout), and a bad
environment. Each must fail with its own message: not a traceback, and not the last net's "a bug in
Kiln" line either (that one is for what nothing foresaw).

It runs in a copy of the checkout (its images/targets/ gets a target that is not UTF-8 and one that
is not TOML), with RunPod's API, the Hub and Docker pointed at nothing that answers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kiln_dev.supervised import free_port

ROOT = Path(__file__).resolve().parents[2]
NOWHERE = free_port()          # bound once and closed: nothing listens there
KEY = "rpa_no-traceback-test-key-5c1e"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("no-traceback")
    root = tmp / "kiln"
    for name in ("supervisor", "images"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "rendered"))
    shutil.copy2(ROOT / "build.py", root / "build.py")
    (root / "images/targets/not-utf8.toml").write_bytes(b'name = "caf\xe9"\n')
    (root / "images/targets/not-toml.toml").write_text("name = [\n")
    files = tmp / "files"
    files.mkdir()
    (files / "not-utf8.toml").write_bytes(b'engine = "llamacpp"\n# \xff\xfe\n')
    (files / "not-toml.toml").write_text("[model\nsource = \n")
    (files / "status-3.toml").write_text('status = 3\n[model]\nsource = "/m.gguf"\n[ladder]\n[[ladder.rungs]]\n'
                                         'name = "a"\n')
    return root


def bad_files(root: Path) -> list[str]:
    files = root.parent / "files"
    return [str(files / "missing.toml"), str(files / "not-utf8.toml"), str(files / "not-toml.toml")]


def env_for(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KILN_", "RUNPOD_", "HF_", "HUGGING_FACE_")) and k != "DOCKER_HOST"}
    env.update(PYTHONPATH=str(root), RUNPOD_API_KEY=KEY, RUNPOD_API_URL=f"http://127.0.0.1:{NOWHERE}/v2",
               RUNPOD_PROXY_URL=f"http://127.0.0.1:{NOWHERE}/{{pod_id}}-{{port}}",
               HF_ENDPOINT=f"http://127.0.0.1:{NOWHERE}", HF_HUB_DISABLE_TELEMETRY="1",
               DOCKER_HOST="unix:///nonexistent/docker.sock", HOME=str(root.parent / "home"))
    env.update(extra)
    return env


def build_py_cases(root: Path) -> list[tuple[list[str], dict[str, str]]]:
    files = bad_files(root)
    good_deploy = str(root / "images/deploy/cpu-small.toml")
    out: list[tuple[list[str], dict[str, str]]] = []
    with_target = [["build"], ["render", "--out", str(root.parent / "out")], ["tag"], ["lock"], ["compile"],
                   ["publish-binaries", "--store", str(root.parent / "store")], ["template"], ["pods", "up"],
                   ["pods", "status"], ["pods", "down"]]
    for cmd in with_target:
        for target in ("not-utf8", "not-toml", "no-such-target"):
            out.append(([*cmd, "--target", target], {}))
    out += [(["list"], {}), (["generate", "--check"], {})]           # they read every target
    for f in files:
        out += [(["publish-config", f, "--repo", "kiln-test/fleet"], {"HF_TOKEN": "hf_test"}),
                (["publish-config", good_deploy, "--repo", "kiln-test/fleet", "--flags", f], {"HF_TOKEN": "hf_test"}),
                (["publish-config", good_deploy, "--repo", "kiln-test/fleet", "--token-file", f], {}),
                (["fleet-status", "--repo", "kiln-test/fleet", "--token-file", f], {}),
                (["build", "--target", "cpu-llamacpp", "--ca-bundle", f], {})]
    out.append((["render", "--target", "cpu-llamacpp", "--out", str(root.parent / "out2"), "--patch-file",
                 f"x={files[0]}"], {}))             # a patch is any bytes: only a missing one is bad input
    bad_url = "http://[::1"
    out += [(["pods", "status"], {"RUNPOD_API_URL": bad_url}), (["pods", "logs", "abc"], {"RUNPOD_API_URL": bad_url}),
            (["pods", "down", "--pod", "abc"], {"RUNPOD_API_URL": bad_url}),
            (["pods", "volumes"], {"RUNPOD_API_URL": bad_url}),
            (["pods", "status"], {}), (["pods", "logs", "abc"], {}), (["pods", "down", "--all"], {}),
            (["pods", "volumes"], {}), (["pods", "status"], {"RUNPOD_API_KEY": ""}),
            (["template", "--target", "cpu-llamacpp", "--upsert"], {"RUNPOD_API_URL": bad_url}),
            (["fleet-status", "--repo", "kiln-test/fleet"], {"HF_ENDPOINT": bad_url}),
            (["publish-config", good_deploy, "--repo", "kiln-test/fleet"],
             {"HF_ENDPOINT": bad_url, "HF_TOKEN": "hf_t"})]
    return [([sys.executable, str(root / "build.py"), *argv], env) for argv, env in out]


def supervisor_cases(root: Path) -> list[tuple[list[str], dict[str, str]]]:
    files = bad_files(root)
    good = str(root / "images/deploy/cpu-small.toml")
    status3 = str(root.parent / "files/status-3.toml")
    out: list[tuple[list[str], dict[str, str]]] = []
    for f in files:
        out += [(["run", "--config", f, "--exit-on-failure"], {}), (["run", "--exit-on-failure"], {"KILN_CONFIG": f}),
                (["check-config", f], {}), (["check-config", good, "--flags", f], {}),
                (["check-model", f], {}), (["check-model", good, "--facts", f], {}),
                (["check-model", good, "--draft", f], {}),
                (["selftest", "--url", f"http://127.0.0.1:{NOWHERE}", "--json", f + "/report.json"], {}),
                (["publish-config", f, "--repo", "kiln-test/fleet"], {"HF_TOKEN": "hf_test"}),
                (["fleet-status", "--repo", "kiln-test/fleet", "--token-file", f], {})]
    out += [(["check-model", good, "--target", t], {}) for t in ("not-utf8", "not-toml", "no-such-target")]
    out += [(["run", "--config", good, "--exit-on-failure"], {"KILN_SERVER_PORT": "abc"}),
            (["run", "--config", status3, "--exit-on-failure"], {"KILN_STATUS_PORT": "9"}),
            (["check-config", good], {"KILN_SERVER_PORT": "abc", "KILN_SELFTEST_ENABLED": "maybe"}),
            (["check-config", status3], {"KILN_STATUS_PORT": "9"}),
            (["run", "--config", good, "--exit-on-failure"], {"KILN_RUNPOD_API_URL": "http://[::1"}),
            (["selftest", "--url", "http://[::1"], {}),
            (["selftest", "--url", f"http://127.0.0.1:{NOWHERE}", "--api-key-env", "KILN_NO_SUCH_VAR"], {})]
    return [([sys.executable, "-m", "supervisor", *argv], env) for argv, env in out]


def run_all(root: Path, cases: list[tuple[list[str], dict[str, str]]]) -> list[str]:
    def one(case: tuple[list[str], dict[str, str]]) -> str | None:
        argv, extra = case
        r = subprocess.run(argv, capture_output=True, text=True, cwd=root.parent, env=env_for(root, **extra),
                           timeout=120, stdin=subprocess.DEVNULL)
        shown = " ".join(argv[1:]).replace(str(root.parent), "TMP") + (f"  env {extra}" if extra else "")
        if "Traceback" in r.stderr or "Traceback" in r.stdout:
            return f"{shown}: a traceback:\n{r.stderr[-1500:]}"
        if "(a bug in Kiln" in r.stderr:
            return f"{shown}: only the last net caught it: {r.stderr.strip()[-500:]}"
        if r.returncode == 0:
            return f"{shown}: exit 0 for bad input:\n{r.stdout[-300:]}{r.stderr[-300:]}"
        if KEY in r.stdout + r.stderr:
            return f"{shown}: the RunPod key leaked"
        return None

    with ThreadPoolExecutor(max_workers=6) as pool:
        return [f for f in pool.map(one, cases) if f]


def test_no_build_py_command_ends_in_a_traceback_on_bad_files_or_a_bad_environment(checkout):
    failures = run_all(checkout, build_py_cases(checkout))
    assert failures == [], "\n\n".join(failures)


def test_no_python_m_supervisor_command_ends_in_a_traceback_on_bad_files_or_a_bad_environment(checkout):
    failures = run_all(checkout, supervisor_cases(checkout))
    assert failures == [], "\n\n".join(failures)


def test_a_lock_file_that_is_not_utf8_or_not_toml_is_one_message(checkout, tmp_path):
    root = tmp_path / "kiln"
    shutil.copytree(checkout, root)
    failures = []
    for text in (b"[pins]\n# \xff\n", b"[pins\n"):
        (root / "images/lock.toml").write_bytes(text)
        failures += run_all(root, [([sys.executable, str(root / "build.py"), *argv], {}) for argv in
                                   (["tag", "--target", "cpu-llamacpp"], ["render", "--target", "cpu-llamacpp",
                                    "--out", str(tmp_path / "out")], ["lock", "--target", "cpu-llamacpp"])])
    assert failures == [], "\n\n".join(failures)
