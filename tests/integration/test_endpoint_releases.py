"""How `endpoint up --wait` judges a release, end to end: `python build.py endpoint` against the
serverless stand-in (kiln_dev/runpod/serverless.py, not RunPod) whose workers are REAL Kiln
supervisors. The engine is the stand-in llama-server (kiln_dev/fake_llama_server.py), because
what is tested is a release whose workers never get as far as a model (a deploy config that does
not validate) or whose engine dies a moment after it turned ready (crash-after-ready, which a
real llama-server does not do on demand); the supervisor, its health path and its failure line
are the real ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiln_dev.models import make_tiny_gguf
from kiln_dev.runpod import ServerlessStandIn, WorkerRunner
from kiln_dev.supervised import FAKE, config

ROOT = Path(__file__).resolve().parents[2]
TARGET = "a40-vllm"           # a GPU target with resolved pins; its workers run the config below
ACCOUNT_KEY = "rpa_kiln-endpoint-release-canary-5d20"
GOOD, BAD_CONFIG = "r.example/kiln:good", "r.example/kiln:bad-config"


def worker_config(model: Path, state: Path, *, rung_env: dict[str, str] | None = None, extra: str = "") -> str:
    env = "".join(f'{k} = "{v}"\n' for k, v in (rung_env or {"KILN_FAKE_SCENARIO": "ok"}).items())
    rungs = f'[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1"]\n[ladder.rungs.env]\n{env}'
    return config(binary=str(FAKE), model=str(model), port=8080, status_port=8081, state_dir=state, rungs=rungs,
                  extra=extra)


def endpoint_cli(standin, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "RUNPOD_API_KEY": ACCOUNT_KEY, "RUNPOD_API_URL": standin.url}
    return subprocess.run([sys.executable, str(ROOT / "build.py"), "endpoint", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=timeout)


@pytest.fixture
def tiny(tmp_path) -> Path:
    return make_tiny_gguf(tmp_path / "tiny.gguf")


def standin_with(tmp_path: Path, config_for) -> ServerlessStandIn:
    runner = WorkerRunner(tmp_path / "rp", config_for, extra_env={"KILN_SERVERLESS_EXIT_GRACE_S": "2"})
    return ServerlessStandIn(ACCOUNT_KEY, workers=runner, no_worker_limit_s=240, worker_stop_grace_s=10)


def release_over_good(standin, image: str, *wait: str) -> tuple[dict, subprocess.CompletedProcess]:
    """An endpoint created on GOOD (no worker woken), then `up --wait` of `image` over it."""
    first = endpoint_cli(standin, "up", "--target", TARGET, "--image-ref", GOOD, "--no-network-volume")
    assert first.returncode == 0, first.stderr
    (e,) = standin.endpoints.values()
    return e, endpoint_cli(standin, "up", "--target", TARGET, "--image-ref", image, "--no-network-volume",
                           "--wait", "--poll", "0.2", *wait)


def bad_config_for(tiny: Path, tmp_path: Path):
    def config_for(endpoint, worker_id, volume):
        text = worker_config(tiny, tmp_path / "disk" / worker_id / "kiln")
        if str(endpoint.get("image", "")).endswith(":bad-config"):
            text = text.replace("[selftest]\nenabled = false", "[selftest]\nenabled = false\ndecode_tokens = \"many\"")
        return text
    return config_for


def test_a_release_whose_workers_cannot_parse_their_config_says_why_and_is_rolled_back_after_two(tmp_path, tiny):
    # issue 37 item 3: the worker exited before any line the CLI knew, never showed UNHEALTHY, and
    # `up --wait` kept waking workers for its whole timeout (~95 billed cold starts in 20 s).
    with standin_with(tmp_path, bad_config_for(tiny, tmp_path)) as standin:
        e, bad = release_over_good(standin, BAD_CONFIG, "--timeout", "120")
        assert bad.returncode == 3, bad.stdout + bad.stderr
        assert "NOT HEALTHY: config_rejected: the deploy config does not validate" in bad.stdout, bad.stdout
        assert "selftest.decode_tokens" in bad.stdout and "2 workers of release v2 failed and none turned healthy" \
            in bad.stdout, bad.stdout
        assert "restored the previous release's image" in bad.stdout
        assert standin.endpoints[e["id"]]["image"] == GOOD
        started = [w for w in standin.started_workers if w.image == BAD_CONFIG]
        # Each one answered 503 for its grace (UNHEALTHY), so one request woke one worker at a time.
        assert 2 <= len(started) <= 4, f"{len(started)} workers started for the bad release"
        unhealthy = [w for w in started if any("-> UNHEALTHY (health 503)" in line for _, line in w.system)]
        assert len(unhealthy) >= 2, [w.system for w in started]
        for w in unhealthy:
            log = w.container.log_path.read_text(errors="replace")
            (line,) = [ln for ln in log.splitlines() if "serverless worker: it can never serve" in ln]
            assert "(config_rejected: " in line and "answers 503 and the worker exits in 2 s" in line
        assert ACCOUNT_KEY not in bad.stdout + bad.stderr + json.dumps([w.system for w in started])
    assert standin.faults == []


CRASHY = "r.example/kiln:crashy"
RESTART = "[restart]\nmax_restarts = 1\nwindow_s = 120\nbackoff_initial_s = 0.2\nbackoff_max_s = 1\n"


def crashy_config_for(tiny: Path, tmp_path: Path):
    def config_for(endpoint, worker_id, volume):
        crashy = str(endpoint.get("image", "")).endswith(":crashy")
        env = {"KILN_FAKE_SCENARIO": "crash-after-ready", "KILN_FAKE_CRASH_AFTER_S": "3"} if crashy else None
        return worker_config(tiny, tmp_path / "disk" / worker_id / "kiln", rung_env=env, extra=RESTART)
    return config_for


def test_a_release_whose_workers_crash_a_moment_after_turning_ready_is_not_healthy(tmp_path, tiny):
    # issue 37 item 4: `up --wait` took the first 200 and exited 0; the engine died 3 s later.
    with standin_with(tmp_path, crashy_config_for(tiny, tmp_path)) as standin:
        e, crashy = release_over_good(standin, CRASHY, "--timeout", "180", "--settle", "10")
        started = [w for w in standin.started_workers if w.image == CRASHY]
        assert any("-> IDLE (health 200)" in line for w in started for _, line in w.system), "it turned ready"
        assert crashy.returncode == 3, crashy.stdout + crashy.stderr
        assert "turned ready, then" in crashy.stdout + crashy.stderr and "within the 10 s settle window" \
            in crashy.stdout + crashy.stderr, crashy.stdout + crashy.stderr
        assert "restored the previous release's image" in crashy.stdout
        assert standin.endpoints[e["id"]]["image"] == GOOD


def test_a_healthy_release_says_what_its_health_check_vouched_for(tmp_path, tiny):
    # issue 37 item 4: with the selftest off the CLI said "its selftest passed"; it says what was checked.
    with standin_with(tmp_path, crashy_config_for(tiny, tmp_path)) as standin:
        up = endpoint_cli(standin, "up", "--target", TARGET, "--image-ref", GOOD, "--no-network-volume",
                          "--wait", "--poll", "0.2", "--settle", "2")
        assert up.returncode == 0, up.stdout + up.stderr
        assert "is healthy: ready, and still ready 2 s later" in up.stderr, up.stderr
        assert "its selftest passed" not in up.stderr
        assert "no selftest ran on it" in up.stderr, up.stderr


SLOW, TEAM = "r.example/kiln:slow", "r.example/kiln:team"


def slow_config_for(tiny: Path, tmp_path: Path):
    """SLOW's workers load for ten minutes (initializing all along); every other image's serve at once."""
    def config_for(endpoint, worker_id, volume):
        slow = str(endpoint.get("image", "")).endswith(":slow")
        env = {"KILN_FAKE_SCENARIO": "slow-loading-progress", "KILN_FAKE_LOAD_S": "600",
               "KILN_FAKE_DOT_S": "1"} if slow else None
        return worker_config(tiny, tmp_path / "disk" / worker_id / "kiln", rung_env=env)
    return config_for


def test_a_teammates_release_during_the_wait_is_never_reported_as_ours(tmp_path, tiny):
    # issue 50 item 3: `up --wait` followed the endpoint's latest release: a teammate's release made
    # during the wait turned healthy, and `up` said "release v3 is healthy" and exited 0 for a release
    # of its own (v2) that never served.
    from kiln_dev.supervised import wait_for
    from images.runpod.api import RunPodAPI

    with standin_with(tmp_path, slow_config_for(tiny, tmp_path)) as standin:
        first = endpoint_cli(standin, "up", "--target", TARGET, "--image-ref", GOOD, "--no-network-volume")
        assert first.returncode == 0, first.stderr
        (e,) = standin.endpoints.values()
        env = {**os.environ, "RUNPOD_API_KEY": ACCOUNT_KEY, "RUNPOD_API_URL": standin.url}
        cli = subprocess.Popen([sys.executable, str(ROOT / "build.py"), "endpoint", "up", "--target", TARGET,
                                "--image-ref", SLOW, "--no-network-volume", "--wait", "--poll", "0.2", "--settle", "2",
                                "--timeout", "300"], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
        try:
            wait_for(lambda: any(w.image == SLOW for w in standin.started_workers), 120,
                     "a worker of this up's release (v2) started")
            RunPodAPI(ACCOUNT_KEY, standin.url).update_endpoint(e["id"], {"image": TEAM})     # the teammate
            out, err = cli.communicate(timeout=300)
        finally:
            if cli.poll() is None:
                cli.kill()
        assert cli.returncode == 1, out + err
        assert "is healthy" not in err and "release v2 (the one this command made) was replaced by v3 (MANUAL" in out, out + err
        assert standin.endpoints[e["id"]]["image"] == TEAM, "the teammate's release was rolled back"
        assert ACCOUNT_KEY not in out + err


def test_failures_clear_wait_follows_its_release_until_a_worker_of_it_is_healthy(tmp_path, tiny):
    # issue 50 item 5d: --clear replaces every worker; --wait follows that release as `up --wait` does
    with standin_with(tmp_path, crashy_config_for(tiny, tmp_path)) as standin:
        first = endpoint_cli(standin, "up", "--target", TARGET, "--image-ref", GOOD, "--no-network-volume")
        assert first.returncode == 0, first.stderr
        r = endpoint_cli(standin, "failures", "--target", TARGET, "--clear", "--wait", "--poll", "0.2", "--settle", "2",
                         "--timeout", "180")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "of release v2 is healthy" in r.stderr, r.stderr
        (w,) = [w for w in standin.started_workers]
        assert w.version == 2
