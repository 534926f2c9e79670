"""Create-or-update of RunPod templates, and CI's Pod gate, against a stand-in for RunPod's REST API
(tests/support/runpod_standin.py: not RunPod; it enforces RunPod's published schema and its
create/update semantics, template names unique)."""

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from images import gate, runpod, runpod_api
from images.lock import load_lock, pins_for
from images.target import load_target
from tests.support.runpod_standin import RunPodStandIn

ROOT = Path(__file__).resolve().parents[2]
KEY = "rpa_kiln-canary-7c1e2f"


@pytest.fixture
def standin():
    with RunPodStandIn(KEY) as s:
        yield s


def tpl(target_name="cpu-llamacpp", **kw):
    target = load_target(target_name)
    return runpod.build_template(target, pins_for(target, load_lock()), **kw)


def build_py(*args, env=None):
    return subprocess.run([sys.executable, "build.py", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def test_create_then_unchanged_then_update_by_name(standin):
    api = runpod_api.RunPodAPI(KEY, standin.url)
    body = tpl().body
    first = runpod_api.upsert_template(api, body)
    assert first.action == "created" and first.name == "kiln-cpu-llamacpp"
    stored = standin.templates[first.template_id]
    assert {k: stored[k] for k in body} == body

    writes = len(standin.writes())
    again = runpod_api.upsert_template(api, body)
    assert again == runpod_api.UpsertResult("unchanged", first.template_id, first.name)
    assert len(standin.writes()) == writes, "an idempotent run must write nothing"

    newer = dict(body, imageName=body["imageName"].replace("-0.", "-9."), containerDiskInGb=12)
    third = runpod_api.upsert_template(api, newer)
    assert third.action == "updated" and third.template_id == first.template_id
    assert standin.templates[first.template_id]["imageName"] == newer["imageName"]
    assert standin.writes()[-1] == ("PATCH", f"/v1/templates/{first.template_id}")
    assert len(standin.templates) == 1


def test_the_standin_enforces_unique_names_and_the_schema(standin):
    api = runpod_api.RunPodAPI(KEY, standin.url)
    body = tpl().body
    api.create_template(body)
    # A second create with the same name fails (RunPod: "The name needs to be unique.").
    r = api._s.post(standin.url + "/templates", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400 and "unique" in r.json()["error"]
    # An invented field is refused by the stand-in too (checked by jsonschema, not Kiln's validator).
    r = api._s.post(standin.url + "/templates", json=dict(body, name="other", args="--x"),
                    headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400 and "args" in json.dumps(r.json())
    # Kiln refuses it before sending.
    before = len(standin.requests)
    with pytest.raises(Exception, match="not a property the schema lists"):
        api.create_template(dict(body, name="other", args="--x"))
    assert len(standin.requests) == before


def test_create_only_fields_and_duplicate_names_are_refused_with_a_fix(standin):
    api = runpod_api.RunPodAPI(KEY, standin.url)
    body = tpl().body
    created = runpod_api.upsert_template(api, body)
    standin.templates[created.template_id]["category"] = "NVIDIA"
    with pytest.raises(runpod_api.RunPodAPIError, match="category .* cannot be updated; delete it or rename"):
        runpod_api.upsert_template(api, body)
    standin.templates["dup"] = dict(standin.templates[created.template_id], id="dup")
    with pytest.raises(runpod_api.RunPodAPIError, match="2 templates are named 'kiln-cpu-llamacpp'"):
        runpod_api.upsert_template(api, body)


def test_errors_never_carry_the_api_key(standin):
    api = runpod_api.RunPodAPI(KEY, standin.url)
    standin.fail_next = (500, "internal error while handling $AUTH")
    with pytest.raises(runpod_api.RunPodAPIError) as e:
        api.list_templates()
    assert KEY not in str(e.value) and "HTTP 500" in str(e.value) and "***" in str(e.value)
    bad = runpod_api.RunPodAPI("wrong-key", standin.url)
    with pytest.raises(runpod_api.RunPodAPIError, match="HTTP 401.*RUNPOD_API_KEY valid"):
        bad.list_templates()


def test_build_py_upserts_idempotently_and_prints_the_template_id(standin):
    env = {"RUNPOD_API_KEY": KEY, "RUNPOD_API_URL": standin.url, "KILN_API_KEY": "kiln-canary-value"}
    r1 = build_py("--target", "cpu-llamacpp", "--runpod-upsert", env=env)
    assert r1.returncode == 0, r1.stderr
    tid = r1.stdout.strip()
    assert tid in standin.templates and "created" in r1.stderr and "templateId" in r1.stderr
    r2 = build_py("--target", "cpu-llamacpp", "--runpod-upsert", env=env)
    assert r2.returncode == 0 and r2.stdout.strip() == tid and "unchanged" in r2.stderr
    for r in (r1, r2):
        assert KEY not in r.stdout + r.stderr and "kiln-canary-value" not in r.stdout + r.stderr
    assert "kiln-canary-value" not in json.dumps(standin.templates)
    # The floating target is refused unless asked for, then created with its floating tag.
    r3 = build_py("--target", "a40-llamacpp", "--runpod-upsert", env=env)
    assert r3.returncode == 2 and "--allow-floating" in r3.stderr
    r4 = build_py("--target", "a40-llamacpp", "--runpod-upsert", "--allow-floating", env=env)
    assert r4.returncode == 0, r4.stderr
    assert standin.templates[r4.stdout.strip()]["imageName"].endswith("-floating")


def test_build_py_upsert_without_a_key_says_how_to_get_one():
    r = build_py("--target", "cpu-llamacpp", "--runpod-upsert", env={"RUNPOD_API_KEY": ""})
    assert r.returncode == 2 and "RUNPOD_API_KEY" in r.stderr and "Settings > API Keys" in r.stderr


# -- CI's gate on a RunPod Pod ---------------------------------------------------------------------
class FakeStatus:
    """Stands for the supervisor's status port behind RunPod's proxy: /status JSON in sequence."""

    def __init__(self, snapshots):
        self.snapshots = list(snapshots)
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                snap = outer.snapshots.pop(0) if len(outer.snapshots) > 1 else outer.snapshots[0]
                data = json.dumps(snap).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.mark.parametrize("final,passed", [
    ({"state": "SERVING", "ready": True, "selftest": {"passed": True, "decode_tok_s": 42.0}}, True),
    ({"state": "FAILED", "ready": False, "selftest": {"passed": False},
      "last_failure": {"class": "selftest_failed", "message": "code probe wrong"}}, False),
    ({"state": "SERVING", "ready": True, "selftest": None}, False),
])
def test_runpod_gate_deploys_by_template_id_and_always_terminates(standin, monkeypatch, final, passed):
    monkeypatch.setattr(gate.time, "sleep", lambda s: None)
    status = FakeStatus([{"state": "FETCH", "ready": False}, {"state": "SELFTEST", "ready": False}, final])
    api = runpod_api.RunPodAPI(KEY, standin.url)
    target = load_target("a40-vllm-qwen3-coder")
    staging = tpl("a40-vllm-qwen3-coder", image="ghcr.io/kiln-llm/kiln:staging-x-1", name="kiln-q-staging")
    verdict = gate.gate_runpod(api, staging, target, timeout_s=30, pod_name="kiln-gate-test",
                               status_url=status.url + "/{pod_id}/{port}")
    status.server.shutdown()
    assert verdict.passed is passed
    (pod,) = standin.pods.values()
    assert pod["templateId"] in standin.templates and pod["gpuTypeIds"] == ["NVIDIA A40"] and pod["gpuCount"] == 1
    assert standin.templates[pod["templateId"]]["imageName"] == "ghcr.io/kiln-llm/kiln:staging-x-1"
    assert pod["desiredStatus"] == "TERMINATED"
    assert not [r for r in standin.requests if r[1].endswith("/stop")], "a Pod is terminated, never stopped"
