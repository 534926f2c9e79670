"""RunPod Serverless load-balancing endpoints from targets (REST v2 CreateEndpointRequest): the body
validates against RunPod's published schema for every GPU target, says every setting explicitly,
holds secrets only as references, and what `up` compares, restores and reads out of a worker's log."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from images.pins.lock import load_lock, pins_for
from images.runpod import endpoint as ep
from images.runpod import endpoints, rollout
from images import runpod_schema as schema
from images.target import load_target, target_names

ROOT = Path(__file__).resolve().parents[2]
CANARY = "kiln-endpoint-canary-77c1"
SECRET_ENV = {"KILN_API_KEY": CANARY + "-api", "HF_TOKEN": "hf_" + CANARY, "RUNPOD_API_KEY": "rp_" + CANARY}
GPU_TARGETS = [n for n in target_names() if load_target(n).is_gpu and not load_target(n).runpod.is_cluster]


def run_build(*args, env=None):
    full = {**{k: v for k, v in os.environ.items() if k not in ("RUNPOD_API_KEY", "RUNPOD_API_URL")}, **(env or {})}
    return subprocess.run([sys.executable, "build.py", *args], capture_output=True, text=True, cwd=ROOT, env=full)


def published(name):
    doc = json.loads((ROOT / "images" / "schemas" / "runpod-rest-v2.json").read_text())
    return jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{name}", "components": doc["components"]})


def plan_of(name, **kw):
    target = load_target(name)
    compute = ep.offline_compute(target, **kw)
    return ep.build_endpoint(target, pins_for(target, load_lock()), compute)


@pytest.mark.parametrize("name", GPU_TARGETS)
def test_plan_prints_a_load_balancing_create_body_that_validates_and_holds_no_secret(name):
    r = run_build("endpoint", "plan", "--target", name, "--allow-floating", env=SECRET_ENV)
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    published("CreateEndpointRequest").validate(body)
    target = load_target(name)
    cfg = target.deploy_config()
    assert body["type"] == "LOAD_BALANCER" and body["scaling"] == {"type": "REQUEST_COUNT", "requestCount": 4}
    assert body["workers"] == {"min": 0, "max": 3, "idleTimeout": 300} and body["flashboot"] == "FLASHBOOT"
    assert body["args"] == "run" and body["name"] == f"kiln-{name}"
    env = body["env"]
    assert env["PORT"] == str(cfg.server.port) and env["PORT_HEALTH"] == str(cfg.status.port)
    assert env["HEALTH_CHECK_PATH"] == "/ping" and env["KILN_API_KEY_SOURCE"] == "none"
    assert "KILN_API_KEY" not in env, "the engine's key is dropped: RunPod's key gates the endpoint"
    assert all(v.startswith("{{ RUNPOD_SECRET_") for k, v in env.items() if k in ("HF_TOKEN",))
    assert body["ports"] == [f"{cfg.server.port}/http", f"{cfg.status.port}/http"]
    assert body["gpu"] == {"pools": ["AMPERE_48"], "count": target.runpod.gpu_count,
                           "minCudaVersion": target.cuda_version}
    assert "RunPod's docs table puts NVIDIA A40 in AMPERE_48" in r.stderr
    for secret in SECRET_ENV.values():
        assert secret not in r.stdout + r.stderr


def test_the_docs_pool_table_maps_gpu_type_ids_and_refuses_to_guess():
    assert ep.docs_pools("NVIDIA A40") == ["AMPERE_48"] and ep.docs_pools("NVIDIA RTX A6000") == ["AMPERE_48"]
    assert ep.docs_pools("NVIDIA RTX 6000 Ada Generation") == ["ADA_48_PRO"]
    assert ep.docs_pools("NVIDIA L40S") == ["ADA_48_PRO"] and ep.docs_pools("NVIDIA H200") == ["HOPPER_141"]
    assert ep.docs_pools("NVIDIA B200") == []
    r = run_build("endpoint", "plan", "--target", "a40-llamacpp", "--allow-floating", "--pool", "ADA_24")
    assert r.returncode == 0 and json.loads(r.stdout)["gpu"]["pools"] == ["ADA_24"]


def test_a_cpu_target_needs_a_flavor_and_then_plans_a_cpu_endpoint():
    r = run_build("endpoint", "plan", "--target", "cpu-llamacpp")
    assert r.returncode == 2 and "give --cpu-flavor" in r.stderr
    r = run_build("endpoint", "plan", "--target", "cpu-llamacpp", "--cpu-flavor", "cpu3c", "--vcpu", "4")
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert body["cpu"] == [{"id": "cpu3c", "vcpuCount": 4}] and "gpu" not in body
    published("CreateEndpointRequest").validate(body)


@pytest.mark.parametrize("args,says", [
    (["--max-workers", "0"], "--max-workers 0: at least 1"),
    (["--idle-timeout", "3601"], "--idle-timeout 3601: RunPod takes 1..3600 seconds"),
    (["--request-count", "0"], "--request-count 0: at least 1"),
    (["--min-workers", "4"], "--max-workers 3: at least 1 and at least --min-workers 4"),
])
def test_scaling_out_of_range_is_refused_naming_the_option(args, says):
    r = run_build("endpoint", "plan", "--target", "a40-llamacpp", "--allow-floating", *args)
    assert r.returncode == 2 and says in r.stderr, r.stderr


@pytest.mark.parametrize("command,option", [
    ("plan", ["--wait"]), ("plan", ["--api", "http://x"]), ("plan", ["--network-volume", "v"]),
    ("status", ["--wait"]), ("status", ["--pool", "ADA_24"]), ("logs", ["--delete-volume"]),
    ("down", ["--min-workers", "1"]), ("up", ["--delete-volume"]),
])
def test_an_option_a_command_does_not_take_is_refused(command, option):
    r = run_build("endpoint", command, "--target", "a40-llamacpp", *option)
    assert r.returncode == 2 and "unrecognized arguments" in r.stderr, r.stderr


def test_contradicting_up_options_are_refused_before_any_key_or_request():
    for args, says in ((["--no-network-volume", "--data-center", "EU-RO-1"], "--no-network-volume cannot be"),
                       (["--timeout", "10"], "--timeout, --poll and --settle only go with --wait")):
        r = run_build("endpoint", "up", "--target", "a40-llamacpp", *args)
        assert r.returncode == 2 and says in r.stderr, r.stderr


def test_an_unknown_target_is_refused_naming_the_targets():
    r = run_build("endpoint", "plan", "--target", "nope")
    assert r.returncode == 2 and "is not a known target" in r.stderr and "a40-llamacpp" in r.stderr


def test_the_check_applies_the_endpoint_rules_runpods_handler_enforces_with_400():
    body = copy.deepcopy(plan_of("a40-llamacpp", pools=("AMPERE_48",)).body)
    both = dict(body, cpu=[{"id": "cpu3c", "vcpuCount": 2}])
    assert any("needs exactly one of gpu or cpu" in str(p) for p in schema.problems(both, "CreateEndpointRequest"))
    exact = copy.deepcopy(body)
    exact["gpu"]["allowedCudaVersions"] = ["12.8"]
    assert any("excludes minCudaVersion" in str(p) for p in schema.problems(exact, "CreateEndpointRequest"))
    queue = dict(body, scaling={"type": "QUEUE_DELAY", "queueDelay": 4})
    assert schema.problems(queue, "CreateEndpointRequest"), "a load-balancing endpoint scales on REQUEST_COUNT only"
    assert any("args: must start the supervisor" in str(p)
               for p in schema.problems(dict(body, args=""), "CreateEndpointRequest"))
    update = {"type": "LOAD_BALANCER"}
    assert any("'type'" in str(p) for p in schema.problems(update, "UpdateEndpointRequest")), "type cannot change"


# -- what `up` compares and restores --------------------------------------------------------------
def existing_of(plan, **changes):
    e = {"id": "ep1", **copy.deepcopy(plan.body), "createdAt": "2026-12-01T00:00:00Z", "timeout": 300000}
    e["gpu"] = {**e["gpu"], "allowedCudaVersions": []}
    e.update(changes)
    return e


def test_an_endpoint_that_matches_the_plan_needs_no_patch_even_with_its_secrets_resolved():
    plan = plan_of("a40-vllm")
    assert endpoints.differences(existing_of(plan), plan.body, plan.secret_keys) == {}
    resolved = existing_of(plan, env={**plan.body["env"], "HF_TOKEN": "hf_the_value_runpod_answered"})
    assert endpoints.differences(resolved, plan.body, plan.secret_keys) == {}
    missing = {k: v for k, v in plan.body["env"].items() if k != "HF_TOKEN"}
    assert endpoints.differences(existing_of(plan, env=missing), plan.body, plan.secret_keys) \
        == {"env": plan.body["env"]}


def test_a_changed_image_is_one_field_and_a_gpu_change_clears_an_exact_cuda_list():
    plan = plan_of("a40-vllm")
    old = existing_of(plan, image="ghcr.io/you/kiln:old")
    assert endpoints.differences(old, plan.body, plan.secret_keys) == {"image": plan.body["image"]}
    exact = existing_of(plan)
    exact["gpu"] = {**exact["gpu"], "minCudaVersion": None, "allowedCudaVersions": ["12.8"]}
    patch = endpoints.differences(exact, plan.body, plan.secret_keys)
    assert patch == {"gpu": {**plan.body["gpu"], "allowedCudaVersions": []}}
    published("UpdateEndpointRequest").validate(patch)


def test_restore_puts_back_the_release_fields_and_never_a_secret_value():
    plan = plan_of("a40-vllm")
    before = existing_of(plan, image="ghcr.io/you/kiln:good",
                         env={**plan.body["env"], "HF_TOKEN": "hf_value_runpod_answered", "OLD": "1"})
    change = endpoints.Change("updated", {"id": "ep1"}, {"image": plan.body["image"], "env": plan.body["env"],
                                                          "workers": {"min": 0, "max": 5, "idleTimeout": 300}},
                              before)
    refs = {k: plan.body["env"][k] for k in plan.secret_keys}
    body = endpoints.restore_body(change, plan.secret_keys, refs)
    assert body == {"image": "ghcr.io/you/kiln:good",
                    "env": {**plan.body["env"], "OLD": "1", "HF_TOKEN": "{{ RUNPOD_SECRET_hf_token }}"}}
    published("UpdateEndpointRequest").validate(body)
    assert change.new_release and not endpoints.Change("updated", {}, {"workers": {}}, before).new_release


def test_the_failure_line_is_the_supervisors_own_word():
    lines = ["state LOADING", "failure selftest_failed on rung cpu: selftest: fatal probe(s) failed: code-add",
             "x FAILED: selftest_failed: selftest: fatal probe(s) failed: code-add", "exiting"]
    assert rollout.failure_line(lines) == "selftest_failed: selftest: fatal probe(s) failed: code-add"
    release = ("E serverless worker: it can never serve (selftest_failed: a (b); c); /ping on port 8081 answers "
               "503 and the worker exits in 60 s ([serverless] exit_grace_s) so RunPod releases it")
    assert rollout.failure_line(lines + [release, "bye"]) == "selftest_failed: a (b); c"
    assert rollout.failure_line(lines[:2]) == "selftest_failed on rung cpu: selftest: fatal probe(s) failed: code-add"
    assert rollout.failure_line(["state SERVING"]) is None
    assert rollout.base_url({"id": "abc"}) == "https://abc.api.runpod.ai"
    assert rollout.health_url({"id": "abc", "requestUrls": {"base": "https://abc.api.runpod.ai",
                                                            "health": "https://abc.api.runpod.ai/ping"}}) \
        == "https://abc.api.runpod.ai/ping"


def test_an_unhealthy_worker_bills_until_it_is_stopped():
    # issue 37 item 6: `endpoint status` counted UNHEALTHY workers as $0.00/h
    from images.runpod.endpoints import billed

    workers = [{"status": s} for s in ("RUNNING", "IDLE", "INITIALIZING", "UNHEALTHY", "UNHEALTHY", "THROTTLED")]
    assert billed(workers) == 5


def release(version, image=None, by="user_a"):
    diff = [{"field": "template.imageName", "old": "r/k:before", "new": image}] if image else []
    return {"id": f"rel_{version}", "version": version, "source": "MANUAL", "createdByUserId": by, "workerCount": 0,
            "createdAt": "2026-12-05T10:00:00Z", "diff": diff}


def test_the_release_a_patch_made_is_told_from_one_made_at_the_same_time():
    # issue 50 item 3: `up` followed whatever release was latest; it tells its own by version.
    patch = {"image": "r/k:ours"}
    alone = {"endpointVersion": 3, "releases": [release(3, "r/k:ours"), release(2), release(1)]}
    assert endpoints.ours(alone, 2, patch) == endpoints.Ours(3)
    # a teammate's release landed between the read (v2) and the PATCH: ours is the one carrying our image
    raced = {"endpointVersion": 4, "releases": [release(4, "r/k:ours"), release(3, "r/k:team", by="user_b"), release(2)]}
    mine = endpoints.ours(raced, 2, patch)
    assert mine.version == 4 and [r["version"] for r in mine.earlier] == [3]
    # ... or right after ours: ours is v3, and the wait sees v4 replace it
    after = {"endpointVersion": 4, "releases": [release(4, "r/k:team", by="user_b"), release(3, "r/k:ours"), release(2)]}
    assert endpoints.ours(after, 2, patch) == endpoints.Ours(3)
    # two releases neither of which carries what was sent: it cannot tell, and says so
    blind = {"endpointVersion": 4, "releases": [release(4), release(3), release(2)]}
    unsure = endpoints.ours(blind, 2, patch)
    assert unsure.version is None and [r["version"] for r in unsure.unsure] == [3, 4]
    assert endpoints.describe(raced["releases"][1]) == ("v3 (MANUAL by user user_b, 2026-12-05T10:00:00Z, changed: "
                                                         "template.imageName)")
