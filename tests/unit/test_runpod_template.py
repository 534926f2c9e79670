"""RunPod templates from targets (REST v2 CreateTemplateRequest): goldens byte for byte, RunPod's
published v2 schema (JSON Schema 2020-12, checked with the jsonschema library), an explicit start
command and ports, secrets only as references, and the [runpod] table's cross-checks."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from images.generate import golden
from images.pins.lock import load_lock, pins_for
from images.build.render import make_context, render_dockerfile
from images import runpod_schema as schema
from images.runpod import template
from images.runpod.cuda import cuda_floor
from images.target import load_target, parse_target, target_names
from supervisor import __version__
from supervisor.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CANARY = "kiln-canary-5e3f9d1b7a"
SECRET_ENV = {"KILN_API_KEY": CANARY + "-api", "HF_TOKEN": "hf_" + CANARY, "RUNPOD_API_KEY": "rp_" + CANARY}


def run_build(*args, env=None):
    full = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "build.py", *args], capture_output=True, text=True, cwd=ROOT, env=full)


def template_of(name):
    target = load_target(name)
    return template.build_template(target, pins_for(target, load_lock()))


def published(name):
    """RunPod's schema as published, for the jsonschema library alone (no Kiln rule on top):
    Draft 2020-12, the vendored document's components as the root its $refs resolve in."""
    doc = json.loads((ROOT / "images" / "schemas" / "runpod-rest-v2.json").read_text())
    return jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{name}", "components": doc["components"]})


@pytest.mark.parametrize("name", target_names())
def test_printed_template_matches_the_committed_golden_byte_for_byte(name):
    """Regenerate with `python build.py generate` after changing a target, the lock or images/runpod/."""
    r = run_build("template", "--target", name)
    assert r.returncode == 0, r.stderr
    committed = (ROOT / "images" / "rendered" / name / golden.TEMPLATE_FILE).read_text(encoding="utf-8")
    assert r.stdout == committed, f"images/rendered/{name}/{golden.TEMPLATE_FILE} drifted: run `python build.py generate`"
    assert golden.render_templates()[name] == committed


@pytest.mark.parametrize("name", target_names())
def test_every_printed_template_is_a_valid_v2_create_and_update_body(name):
    """Issue 12's done-when: `template` prints a v2 body that validates, for every target."""
    body = json.loads(run_build("template", "--target", name).stdout)
    published("CreateTemplateRequest").validate(body)
    assert schema.problems(body, "CreateTemplateRequest") == []
    # An update sends only what changed: every field Kiln sets is one UpdateTemplateRequest takes.
    published("UpdateTemplateRequest").validate(body)
    for key in body:
        published("UpdateTemplateRequest").validate({key: body[key]})
    # No v1 field survives (v2 renamed or dropped them all).
    assert not set(body) & {"imageName", "dockerEntrypoint", "dockerStartCmd", "containerDiskInGb", "volumeInGb",
                            "volumeMountPath", "isPublic", "isServerless", "readme", "containerRegistryAuthId"}


@pytest.mark.parametrize("name", target_names())
def test_args_start_the_supervisor_explicitly_from_the_images_own_cmd(name):
    """Never empty (the image default: the field notes' lost pod). v2 has no entrypoint field, so the
    image's ENTRYPOINT must be the supervisor for args to reach it."""
    target = load_target(name)
    body = template_of(name).body
    dockerfile = render_dockerfile(make_context(target, pins_for(target, load_lock()), allow_floating=True))
    entrypoint, cmd = template.exec_form(dockerfile)
    assert entrypoint[-2:] == ["-m", "supervisor"]
    assert body["args"] == " ".join(cmd) == "run"


@pytest.mark.parametrize("name", target_names())
def test_jupyter_and_ssh_are_off_explicitly_because_v2_defaults_them_on(name):
    body = template_of(name).body
    assert body["startJupyter"] is False and body["startSsh"] is False
    assert published("CreateTemplateRequest").schema["components"]["schemas"]["CreateTemplateRequest"][
        "allOf"][1]["properties"]["startJupyter"]["default"] is True


@pytest.mark.parametrize("name", target_names())
def test_ports_disk_volume_cuda_and_env_follow_the_target_and_its_deploy_config(name):
    target = load_target(name)
    cfg = target.deploy_config()
    body = template_of(name).body
    assert f"{cfg.server.port}/http" in body["ports"] and f"{cfg.status.port}/http" in body["ports"]
    tcp = [p for p in body["ports"] if p.endswith("/tcp")]
    assert tcp and all(int(p.split("/")[0]) not in (cfg.server.port, cfg.status.port) for p in tcp)
    assert body["env"]["KILN_SERVER_PORT"] == str(cfg.server.port)
    assert body["env"]["KILN_STATUS_PORT"] == str(cfg.status.port)
    assert body["disk"] == target.runpod.container_disk_gb
    if target.runpod.volume_gb:
        assert body["mounts"] == {"persistent": {"size": target.runpod.volume_gb, "path": target.runpod.volume_mount}}
    else:
        assert "mounts" not in body
    assert body["category"] == ("NVIDIA" if target.is_gpu else "CPU")
    assert body.get("allowedCudaVersions") == ([cuda_floor(target)] if target.is_gpu else None)
    assert body["serverless"] is False and body["public"] is False


def test_cuda_floor_is_the_declared_cuda_version_until_images_record_a_measured_one():
    assert cuda_floor(load_target("a40-llamacpp")) == "12.8"
    assert cuda_floor(load_target("cpu-llamacpp")) is None


@pytest.mark.parametrize("name", target_names())
def test_secrets_are_runpod_references_never_values(name):
    body = template_of(name).body
    assert body["env"]["KILN_API_KEY"] == "{{ RUNPOD_SECRET_kiln_api_key }}"
    if load_target(name).deploy_config().model.hf_repo:
        assert body["env"]["HF_TOKEN"] == "{{ RUNPOD_SECRET_hf_token }}"


def test_a_secret_canary_never_appears_in_the_printed_template_or_its_errors():
    for name in target_names():
        r = run_build("template", "--target", name, env=SECRET_ENV)
        assert r.returncode == 0
        assert CANARY not in r.stdout + r.stderr
    # Nor in a refusal: a floating upsert without --allow-floating, and an upsert with no API reachable.
    r = run_build("template", "--upsert", "--target", "a40-llamacpp", env=SECRET_ENV)
    assert r.returncode == 2 and "--allow-floating" in r.stderr
    assert CANARY not in r.stdout + r.stderr
    r = run_build("template", "--upsert", "--target", "cpu-llamacpp", "--api", "http://127.0.0.1:9/v2",
                  env=SECRET_ENV)
    assert r.returncode == 2 and "RunPod API GET /templates" in r.stderr
    assert CANARY not in r.stdout + r.stderr


def test_a40_llamacpp_prints_valid_json_with_a_start_command_and_a_tcp_port_and_says_it_floats():
    """Issue 7's done-when, in v2 terms. a40-llamacpp has unresolved pins: the template names the
    tag `build.py --allow-floating` would give the image, and says so on stderr."""
    r = run_build("template", "--target", "a40-llamacpp")
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert body["args"] == "run"
    assert any(p.endswith("/tcp") for p in body["ports"])
    assert body["image"] == f"ghcr.io/kiln-llm/kiln:a40-llamacpp-{__version__}-floating"
    assert "FLOATING" in r.stderr and "source.commit" in r.stderr
    assert run_build("tag", "--target", "a40-llamacpp").stdout.strip() == body["image"]


def test_image_name_and_registry_overrides_are_still_schema_checked():
    r = run_build("template", "--target", "cpu-llamacpp", "--image", "registry.example/me/kiln",
                  "--name", "mine", "--registry-auth", "reg_123")
    body = json.loads(r.stdout)
    assert body["image"].startswith("registry.example/me/kiln:cpu-llamacpp-") and body["name"] == "mine"
    assert body["registry"] == "reg_123"
    r = run_build("template", "--target", "cpu-llamacpp", "--image", "Registry/Me:tag")
    assert r.returncode == 2 and "expected a repository" in r.stderr


def test_no_code_speaks_runpods_retired_rest_v1():
    """Issue 12's done-when: RunPod's v1 base URL appears nowhere in code (v1 is retired)."""
    retired = "rest.runpod.io" + "/v1"        # spelt in two parts, so this file does not match itself
    out = subprocess.run(["git", "grep", "--untracked", "-l", retired, "--", "*.py", "*.yml", "*.yaml", "*.sh",
                          "*.toml", "*.json", "*.j2"], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "", out.stdout


# -- the vendored schema and Kiln's check -----------------------------------------------------------
def test_the_vendored_v2_document_says_where_and_when_it_came_from():
    doc = schema.document()
    prov = doc["provenance"]
    assert prov["repository"] == "https://github.com/runpod/docs" and prov["path"] == "api-reference-v2/openapi.json"
    assert len(prov["commit"]) == 40 and prov["commit"] in prov["copied_from"] and len(prov["document_sha256"]) == 64
    assert doc["openapi"].startswith("3.1") and doc["servers"][0]["url"] == "https://api.runpod.io"
    assert doc["verified"] and doc["unresolved"] and doc["kiln_reading"]
    assert doc["paths"]["/v2/templates"]["post"]["operationId"] == "createTemplate"
    assert doc["paths"]["/v2/pods/{id}"]["delete"]["summary"] == "Terminate a pod"
    assert "NVIDIA A40" in schema.gpu_types()


def test_the_vendored_excerpt_is_closed_every_ref_resolves_inside_it():
    doc = schema.document()
    refs = set()

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                refs.add(v) if k == "$ref" else walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk({"paths": doc["paths"], "components": doc["components"]})
    for ref in refs:
        _, section, name = ref.removeprefix("#/").split("/")
        assert name in doc["components"][section], ref


def test_the_check_collects_every_problem_and_refuses_invented_fields():
    body = copy.deepcopy(template_of("cpu-llamacpp").body)
    body.update(dockerStartCmd=["run"], disk="ten", ports=["8080/http", "8082/udp", 8083], env={"A": 1},
                category="TPU", args="")
    del body["image"]
    msgs = [str(p) for p in schema.problems(body, "CreateTemplateRequest")]
    for part in ("CreateTemplateRequest: 'dockerStartCmd': not a property the schema lists",
                 "CreateTemplateRequest.disk: 'ten' is not of type 'integer'",
                 "CreateTemplateRequest.ports[1]: must be [port number]/[protocol]",
                 "CreateTemplateRequest.ports[2]: 8083 is not of type 'string'",
                 "CreateTemplateRequest.env.A: 1 is not of type 'string'",
                 "CreateTemplateRequest.category: 'TPU' is not one of",
                 "'image' is a required property",
                 "CreateTemplateRequest.args: must start the supervisor explicitly"):
        assert any(part in m for m in msgs), (part, msgs)
    assert not any("'name'" in m or "'ports'" in m for m in msgs), "only invented fields are named as such"
    with pytest.raises(schema.RunPodSchemaError, match="nothing was sent"):
        schema.check(body, "CreateTemplateRequest")


def test_the_check_applies_the_pod_rules_runpods_handler_enforces_with_400():
    base = {"name": "kiln-x-1", "templateId": "tpl"}
    gpu = {"id": "NVIDIA A40", "count": 1}
    cases = {
        "needs exactly one of gpu or cpu": dict(base),
        "excludes minCudaVersion": dict(base, gpu=dict(gpu, allowedCudaVersions=["12.8"], minCudaVersion="12.8")),
        "holds both persistent and network": dict(base, gpu=gpu, mounts={"persistent": {"size": 20, "path": "/w"},
                                                                          "network": [{"volumeId": "v", "path": "/w"}]}),
        "is invalid on a CPU pod": dict(base, cpu={"id": "cpu3c", "vcpuCount": 2},
                                        mounts={"persistent": {"size": 20, "path": "/w"}}),
    }
    for message, body in cases.items():
        assert any(message in str(p) for p in schema.problems(body, "CreatePodRequest")), message
    ok = dict(base, gpu=dict(gpu, minCudaVersion="12.8", allowedCudaVersions=[]))
    assert schema.problems(ok, "CreatePodRequest") == []     # an explicit [] may accompany a floor
    assert any("'image' is a required property" in str(p)
               for p in schema.problems({"name": "x", "gpu": gpu}, "CreatePodRequest"))


# -- the [runpod] table ----------------------------------------------------------------------------
BASE = """
name = "x"
engine = "llamacpp"
description = "d"
image = "ghcr.io/you/kiln"
[base]
build = "nvidia/cuda:12.8.1-devel-ubuntu24.04"
runtime = "nvidia/cuda:12.8.1-runtime-ubuntu24.04"
[cuda]
version = "12.8"
archs = ["86"]
[source]
kind = "git"
url = "https://github.com/ggml-org/llama.cpp"
branch = "master"
[deploy]
config = "deploy/kimi-k3-2xa40.toml"
"""


def test_runpod_table_is_checked_against_the_deploy_config_every_problem_at_once(tmp_path):
    text = BASE + """
[runpod]
gpu_type = "NVIDIA A4O"
gpu_count = 1
volume_gb = 5
volume_mount = "/data"
ports = ["8080/http", "8080/tcp", "9000/http"]
[runpod.env]
KILN_SERVER_PORT = "9999"
KILN_MODEL_REVISON = "abc"
HF_TOKEN = "hf_value"
[runpod.secrets]
KILN_API_KEY = "bad-name!"
"""
    with pytest.raises(ConfigError) as e:
        parse_target(text, tmp_path / "x.toml")
    msg = str(e.value)
    for part in ("runpod.ports: port 8080 is listed more than once",
                 "runpod.ports: the status page (deploy config status.port) listens on 8081",
                 "runpod.ports: needs a TCP port",
                 "runpod.gpu_type: is not a RunPod GPU type id; did you mean 'NVIDIA A40'?",
                 "runpod.volume_gb: RunPod's persistent volume is at least 10 GB",
                 "runpod.gpu_count: the deploy config's [hardware] expects exactly 2 GPU(s)",
                 "runpod.volume_gb: the model is downloaded from the Hub",
                 "runpod.env.KILN_SERVER_PORT: is set by Kiln from the deploy config",
                 "runpod.env.KILN_MODEL_REVISON: is not an environment variable the supervisor reads; "
                 "did you mean 'KILN_MODEL_REVISION'?",
                 "runpod.env.HF_TOKEN: looks like a secret",
                 "runpod.secrets.KILN_API_KEY: is not a RunPod secret name"):
        assert part in msg, (part, msg)


def test_runpod_table_accepts_renamed_secrets_env_overrides_and_a_profile(tmp_path):
    text = BASE.replace("kimi-k3-2xa40", "qwen3-coder-a40") + """
[deploy.profiles]
code-editing = "deploy/qwen3-coder-a40-code-editing.toml"

[runpod]
gpu_type = "NVIDIA A40"
gpu_count = 1
volume_gb = 40
template_name = "my-coder"
ports = ["8080/http", "8081/http", "8082/tcp"]
[runpod.env]
KILN_CONFIG = "/etc/kiln/profiles/code-editing.toml"
KILN_MODEL_SOURCE = "hf://someone/awq"
[runpod.secrets]
HF_TOKEN = "my_hf"
"""
    target = parse_target(text, tmp_path / "x.toml")
    body = template.build_template(target, pins_for(target, load_lock())).body
    assert body["name"] == "my-coder"
    assert body["env"]["HF_TOKEN"] == "{{ RUNPOD_SECRET_my_hf }}"
    assert body["env"]["KILN_CONFIG"] == "/etc/kiln/profiles/code-editing.toml"
