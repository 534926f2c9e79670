"""Create-or-update of RunPod templates, and CI's RunPod gate, against kiln_dev/runpod: a stand-in
for RunPod's REST API v2 (not RunPod; it checks bodies against the published v2 schema with the
jsonschema library, answers RFC 9457 problem objects, keeps template names unique)."""

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from images.ci import gate
from images.pins.lock import load_lock, pins_for
from images import runpod_schema as schema
from images.runpod import template
from images.runpod.api import RunPodAPI, RunPodAPIError
from images.runpod.pods import NoMatchingHost
from images.target import load_target
from kiln_dev.runpod import RunPodStandIn, gpu_type

ROOT = Path(__file__).resolve().parents[2]
KEY = "rpa_kiln-canary-7c1e2f"


@pytest.fixture
def standin():
    with RunPodStandIn(KEY) as s:
        yield s
    assert s.faults == [], "the stand-in answered something RunPod's schema does not allow"


def tpl(target_name="cpu-llamacpp", **kw):
    target = load_target(target_name)
    return template.build_template(target, pins_for(target, load_lock()), **kw)


def build_py(*args, env=None):
    return subprocess.run([sys.executable, "build.py", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def test_create_then_unchanged_then_update_by_name(standin):
    api = RunPodAPI(KEY, standin.url)
    body = tpl().body
    first = template.upsert(api, body)
    assert first.action == "created" and first.name == "kiln-cpu-llamacpp"
    stored = standin.templates[first.template_id]
    assert {k: stored[k] for k in body} == body

    writes = len(standin.writes())
    again = template.upsert(api, body)
    assert again == template.UpsertResult("unchanged", first.template_id, first.name)
    assert len(standin.writes()) == writes, "an idempotent run must write nothing"

    newer = dict(body, image=body["image"].replace("-0.", "-9."), disk=12)
    third = template.upsert(api, newer)
    assert third.action == "updated" and third.template_id == first.template_id
    assert standin.templates[first.template_id]["image"] == newer["image"]
    assert standin.writes()[-1] == ("PATCH", f"/v2/templates/{first.template_id}")
    assert standin.requests[-1]["body"] == {"image": newer["image"], "disk": 12}, "a PATCH sends what changed"
    assert len(standin.templates) == 1


def test_the_standin_keeps_names_unique_and_enforces_the_schema_with_runpods_error_shape(standin):
    api = RunPodAPI(KEY, standin.url)
    body = tpl().body
    api.create_template(body)
    headers = {"Authorization": f"Bearer {KEY}"}
    r = api._s.post(standin.url + "/templates", json=body, headers=headers)
    assert r.status_code == 400 and "already exists" in r.json()["detail"]
    assert r.headers["Content-Type"] == "application/problem+json" and r.json()["title"] == "Bad Request"
    # An invented (v1) field, checked by the stand-in with jsonschema, not with Kiln's code: 422.
    r = api._s.post(standin.url + "/templates", json=dict(body, name="other", dockerStartCmd=["run"]),
                    headers=headers)
    assert r.status_code == 422 and any("dockerStartCmd" in e for e in r.json()["errors"])


def test_a_body_that_breaks_the_schema_never_leaves_the_machine(standin):
    api = RunPodAPI(KEY, standin.url)
    body = tpl().body
    before = len(standin.requests)
    for bad, name in ((dict(body, dockerStartCmd=["run"]), "create_template"),
                      (dict(body, args=""), "create_template"),
                      ({"name": "kiln-x-1", "templateId": "t", "gpu": {"id": "NVIDIA A40", "count": 0}}, "create_pod"),
                      ({"name": "v", "size": 5, "dataCenter": "EU-RO-1"}, "create_network_volume")):
        with pytest.raises(schema.RunPodSchemaError, match="nothing was sent"):
            getattr(api, name)(bad)
    with pytest.raises(schema.RunPodSchemaError):
        api.update_template("t", {"dockerEntrypoint": ["x"]})
    assert len(standin.requests) == before


def test_duplicate_names_are_refused_with_a_fix(standin):
    api = RunPodAPI(KEY, standin.url)
    body = tpl().body
    created = template.upsert(api, body)
    standin.templates["dup"] = dict(standin.templates[created.template_id], id="dup")
    with pytest.raises(RunPodAPIError, match="2 templates are named 'kiln-cpu-llamacpp'.*delete the extra"):
        template.upsert(api, body)


def test_errors_never_carry_the_api_key(standin):
    api = RunPodAPI(KEY, standin.url)
    standin.fail_next = (500, "internal error while handling $AUTH")
    with pytest.raises(RunPodAPIError) as e:
        api.templates()
    assert KEY not in str(e.value) and "HTTP 500" in str(e.value) and "***" in str(e.value)
    bad = RunPodAPI("wrong-key", standin.url)
    with pytest.raises(RunPodAPIError, match="HTTP 401.*RUNPOD_API_KEY valid"):
        bad.templates()
    assert KEY not in standin.log_text(), "the stand-in's log holds no header"


def test_build_py_upserts_idempotently_and_prints_the_template_id(standin):
    env = {"RUNPOD_API_KEY": KEY, "RUNPOD_API_URL": standin.url, "KILN_API_KEY": "kiln-canary-value"}
    r1 = build_py("template", "--target", "cpu-llamacpp", "--upsert", env=env)
    assert r1.returncode == 0, r1.stderr
    tid = r1.stdout.strip()
    assert tid in standin.templates and "created" in r1.stderr and "pods up" in r1.stderr
    r2 = build_py("template", "--target", "cpu-llamacpp", "--upsert", env=env)
    assert r2.returncode == 0 and r2.stdout.strip() == tid and "unchanged" in r2.stderr
    for r in (r1, r2):
        assert KEY not in r.stdout + r.stderr and "kiln-canary-value" not in r.stdout + r.stderr
    assert "kiln-canary-value" not in standin.log_text()
    # The floating target is refused unless asked for, then created with its floating tag.
    r3 = build_py("template", "--target", "a40-llamacpp", "--upsert", env=env)
    assert r3.returncode == 2 and "--allow-floating" in r3.stderr
    r4 = build_py("template", "--target", "a40-llamacpp", "--upsert", "--allow-floating", env=env)
    assert r4.returncode == 0, r4.stderr
    assert standin.templates[r4.stdout.strip()]["image"].endswith("-floating")


def test_build_py_upsert_without_a_key_says_how_to_get_one():
    r = build_py("template", "--target", "cpu-llamacpp", "--upsert", env={"RUNPOD_API_KEY": ""})
    assert r.returncode == 2 and "RUNPOD_API_KEY" in r.stderr and "Settings > API Keys" in r.stderr


# -- CI's gate on a RunPod pod -----------------------------------------------------------------------
class FakeStatus:
    """Stands for a supervisor's status port behind RunPod's proxy: /status JSON in sequence (the
    real supervisor behind the stand-in's proxy is tests/integration/test_runpod_pods.py)."""

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
def test_runpod_gate_uses_the_v2_pod_code_and_always_terminates(standin, monkeypatch, final, passed):
    monkeypatch.setattr(gate.time, "sleep", lambda s: None)
    status = FakeStatus([{"state": "FETCH", "ready": False}, {"state": "SELFTEST", "ready": False}, final])
    api = RunPodAPI(KEY, standin.url)
    target = load_target("a40-vllm")
    staging = tpl("a40-vllm", image="ghcr.io/kiln-llm/kiln:staging-x-1", name="kiln-q-staging")
    verdict = gate.gate_runpod(api, staging, target, timeout_s=30, pod_name="kiln-gate-test",
                               proxy=status.url + "/{pod_id}/{port}")
    status.server.shutdown()
    assert verdict.passed is passed
    (pod,) = standin.terminated.values()
    assert pod["gpu"] == {"id": "NVIDIA A40", "count": 1} and pod["image"] == "ghcr.io/kiln-llm/kiln:staging-x-1"
    create = next(r["body"] for r in standin.requests if r["method"] == "POST" and r["path"] == "/v2/pods")
    assert create["gpu"]["minCudaVersion"] == "13.0" and create["templateId"] in standin.templates
    assert standin.pods == {} and not standin.stopped, "a pod is terminated, never stopped"
    assert not [r for r in standin.requests if r["path"].endswith("/action")]


def test_runpod_gate_refuses_before_renting_when_no_host_runs_the_image(standin, monkeypatch):
    standin.catalog[:] = [gpu_type("NVIDIA A40", cuda=(("12.4", True),))]
    api = RunPodAPI(KEY, standin.url)
    target = load_target("a40-vllm")
    with pytest.raises(NoMatchingHost, match=r"12.4 \(available\)"):
        gate.gate_runpod(api, tpl("a40-vllm"), target, timeout_s=1, pod_name="kiln-gate-test")
    assert standin.writes() == []
