"""`python build.py endpoint failures [--clear]` against the serverless stand-in's REST API (kiln_dev/runpod/
serverless.py, not RunPod; no worker is started here: what a worker logs about its records is checked
against a real worker in test_serverless_worker.py). The records live on the network volume, which
RunPod's REST API cannot read: the command says where they are and how to reach them (RunPod's
S3-compatible API), and --clear sets the clear mark on the endpoint's env, a new release, with every
secret sent back as its reference (issue 37 item 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from images.runpod import failures
from kiln_dev.runpod import ServerlessStandIn
from kiln_dev.supervised import wait_for

ROOT = Path(__file__).resolve().parents[2]
TARGET = "a40-vllm"
ACCOUNT_KEY = "rpa_kiln-failures-account-canary-77d1"
HF_CANARY = "hf_kilnFailuresCanaryNeverSent000"
SERVER_KEY = "kiln-failures-server-key-canary-3b9e"


def endpoint_cli(standin, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "RUNPOD_API_KEY": ACCOUNT_KEY, "RUNPOD_API_URL": standin.url, "HF_TOKEN": HF_CANARY,
           "KILN_API_KEY": SERVER_KEY}
    return subprocess.run([sys.executable, str(ROOT / "build.py"), "endpoint", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=timeout)


@pytest.fixture
def standin():
    with ServerlessStandIn(ACCOUNT_KEY, secrets={"hf_token": HF_CANARY, "kiln_api_key": SERVER_KEY}) as s:
        yield s
    assert s.faults == [], "the stand-in answered something RunPod's schema does not allow"


def test_failures_says_where_the_records_are_and_clear_sets_the_mark_as_a_new_release(standin):
    assert endpoint_cli(standin, "up", "--target", TARGET, "--data-center", "EU-RO-1").returncode == 0
    (e,) = standin.endpoints.values()
    (vol,) = standin.volumes
    version = e["_version"]
    shown = endpoint_cli(standin, "failures", "--target", TARGET)
    assert shown.returncode == 0, shown.stderr
    assert "kiln/serverless/failures/<key>/<worker>.json" in shown.stdout and "clear mark: none" in shown.stdout
    assert (f"aws s3 ls --recursive --region EU-RO-1 --endpoint-url https://s3api-eu-ro-1.runpod.io/ "
            f"s3://{vol}/kiln/serverless/failures/") in shown.stdout
    assert standin.endpoints[e["id"]]["_version"] == version                 # showing writes nothing

    before = dict(e["env"])
    cleared = endpoint_cli(standin, "failures", "--target", TARGET, "--clear")
    assert cleared.returncode == 0, cleared.stderr
    after = standin.endpoints[e["id"]]
    mark = after["env"][failures.CLEARED_ENV]
    assert mark.isdigit() and f"{failures.CLEARED_ENV}={mark} is set (a new release)" in cleared.stdout
    assert after["_version"] == version + 1
    assert {k: v for k, v in after["env"].items() if k != failures.CLEARED_ENV} == before   # the rest as it was
    assert after["env"]["HF_TOKEN"] == "{{ RUNPOD_SECRET_hf_token }}"                      # still a reference
    again = endpoint_cli(standin, "failures", "--target", TARGET)
    assert f"clear mark: {failures.CLEARED_ENV}={mark} (" in again.stdout
    # a later `up` of the same target keeps the mark: nothing changed, nothing written, no release
    writes = standin.writes()
    up = endpoint_cli(standin, "up", "--target", TARGET, "--data-center", "EU-RO-1")
    assert up.returncode == 0 and "unchanged" in up.stderr, up.stderr
    assert standin.writes() == writes and standin.endpoints[e["id"]]["env"][failures.CLEARED_ENV] == mark
    for text in (shown.stdout, shown.stderr, cleared.stdout, cleared.stderr, json.dumps(standin.requests)):
        for canary in (ACCOUNT_KEY, HF_CANARY, SERVER_KEY):
            assert canary not in text


def test_a_secret_runpod_answers_resolved_goes_back_as_its_reference():
    e = {"env": {"HF_TOKEN": HF_CANARY, "PORT": "8000", "OTHER": "{{ RUNPOD_SECRET_x }}"}}
    body = failures.clear_body(e, {"HF_TOKEN": "{{ RUNPOD_SECRET_hf_token }}"}, now=1764900000.5)
    assert body == {"env": {"HF_TOKEN": "{{ RUNPOD_SECRET_hf_token }}", failures.CLEARED_ENV: "1764900000",
                            "OTHER": "{{ RUNPOD_SECRET_x }}", "PORT": "8000"}}


def test_clear_on_an_endpoint_whose_target_is_gone_is_refused_pointing_at_the_volume(standin):
    assert endpoint_cli(standin, "up", "--target", TARGET, "--data-center", "EU-RO-1").returncode == 0
    r = endpoint_cli(standin, "failures", "--target", "gone-target", "--name", f"kiln-{TARGET}", "--clear")
    assert r.returncode == 2 and "--clear needs the target's file" in r.stderr and "S3 command" in r.stderr
    assert "aws s3 rm --recursive" in r.stdout
    (e,) = standin.endpoints.values()
    assert failures.CLEARED_ENV not in e["env"]


def test_clear_says_it_replaces_every_worker_before_it_does_and_how_to_watch_or_waits(standin):
    # issue 50 item 5d: --clear made a release (every worker replaced) without saying so or waiting.
    up = endpoint_cli(standin, "up", "--target", TARGET, "--no-network-volume", "--name", "kiln-f")
    assert up.returncode == 0, up.stderr
    (e,) = standin.endpoints.values()
    standin.fail_on[("PATCH", f"/v2/serverless/{e['id']}")] = (503, "service unavailable")
    refused = endpoint_cli(standin, "failures", "--target", TARGET, "--name", "kiln-f", "--clear")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    # said before the PATCH was sent (this one failed): a release, and what it does to the workers
    assert "--clear is a new release of endpoint kiln-f: every worker is replaced" in refused.stdout, refused.stdout
    assert failures.CLEARED_ENV not in standin.endpoints[e["id"]]["env"]

    cleared = endpoint_cli(standin, "failures", "--target", TARGET, "--name", "kiln-f", "--clear")
    assert cleared.returncode == 0, cleared.stdout + cleared.stderr
    assert "(a new release): v2, whose workers ignore" in cleared.stdout, cleared.stdout
    assert f"`python build.py endpoint status --target {TARGET} --name kiln-f`" in cleared.stdout, cleared.stdout
    assert "--wait" in cleared.stdout

    # --wait follows its release as `up --wait` does; no worker can start here, so it is not healthy:
    # exit 1, and the mark stays (a clear is never undone). The mark is a time in seconds: a second
    # clear within the same second would change nothing.
    mark = standin.endpoints[e["id"]]["env"][failures.CLEARED_ENV]
    wait_for(lambda: int(time.time()) > int(mark), 5, "the next second, for a clear mark that differs")
    waited = endpoint_cli(standin, "failures", "--target", TARGET, "--name", "kiln-f", "--clear", "--wait",
                          "--timeout", "1", "--poll", "0.2")
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert "no worker of release v3 turned healthy within 1 s" in waited.stdout, waited.stdout
    after = standin.endpoints[e["id"]]
    assert after["_version"] == 3 and after["env"][failures.CLEARED_ENV].isdigit()
    assert len([q for q in standin.requests if q["method"] == "PATCH"]) == 3     # the refused one, two clears
    assert endpoint_cli(standin, "failures", "--target", TARGET, "--timeout", "1").returncode == 2   # only with --wait
    for text in (refused.stdout, cleared.stdout, waited.stdout, waited.stderr):
        for canary in (ACCOUNT_KEY, HF_CANARY, SERVER_KEY):
            assert canary not in text
