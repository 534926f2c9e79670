"""RunPod templates from targets: goldens byte for byte, RunPod's published schema, explicit start
command and ports, secrets only as references, and the [runpod] table's cross-checks."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from images import golden, runpod, runpod_schema
from images.lock import load_lock, pins_for
from images.render import make_context, render_dockerfile
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
    return runpod.build_template(target, pins_for(target, load_lock()))


def published(name):
    """The schema as RunPod publishes it, for the jsonschema library (no Kiln strictness)."""
    return runpod_schema.schema(name)


@pytest.mark.parametrize("name", target_names())
def test_printed_template_matches_the_committed_golden_byte_for_byte(name):
    """Regenerate with `python -m images.golden` after changing a target, the lock or images/runpod.py."""
    r = run_build("--target", name, "--runpod-template")
    assert r.returncode == 0, r.stderr
    committed = (ROOT / "images" / "rendered" / name / golden.TEMPLATE_FILE).read_text(encoding="utf-8")
    assert r.stdout == committed, f"images/rendered/{name}/{golden.TEMPLATE_FILE} drifted: run `python -m images.golden`"
    assert golden.render_templates()[name] == committed


@pytest.mark.parametrize("name", target_names())
def test_every_template_is_valid_against_runpods_published_schema(name):
    body = json.loads((ROOT / "images" / "rendered" / name / golden.TEMPLATE_FILE).read_text())
    jsonschema.Draft7Validator(published("TemplateCreateInput")).validate(body)
    assert runpod_schema.problems(body, "TemplateCreateInput") == []
    # Every field Kiln sends is one RunPod lists: nothing invented.
    assert set(body) <= set(published("TemplateCreateInput")["properties"])
    # What an update sends (everything but the create-only fields) is a valid TemplateUpdateInput.
    update = {k: v for k, v in body.items() if k not in ("category", "isServerless")}
    jsonschema.Draft7Validator(published("TemplateUpdateInput")).validate(update)
    assert runpod_schema.problems(update, "TemplateUpdateInput") == []


@pytest.mark.parametrize("name", target_names())
def test_start_command_and_entrypoint_are_explicit_and_the_images_own(name):
    """Never [] (RunPod's 'use the image default'): the seed's pod ran the image default."""
    target = load_target(name)
    pins = pins_for(target, load_lock())
    body = template_of(name).body
    assert body["dockerStartCmd"] and body["dockerEntrypoint"]
    dockerfile = render_dockerfile(make_context(target, pins, allow_floating=True))
    assert f"ENTRYPOINT {json.dumps(body['dockerEntrypoint'])}" in dockerfile
    assert f"CMD {json.dumps(body['dockerStartCmd'])}" in dockerfile


@pytest.mark.parametrize("name", target_names())
def test_ports_volume_and_env_follow_the_target_and_its_deploy_config(name):
    target = load_target(name)
    cfg = target.deploy_config()
    body = template_of(name).body
    assert f"{cfg.server.port}/http" in body["ports"] and f"{cfg.status.port}/http" in body["ports"]
    tcp = [p for p in body["ports"] if p.endswith("/tcp")]
    assert tcp and all(int(p.split("/")[0]) not in (cfg.server.port, cfg.status.port) for p in tcp)
    assert body["env"]["KILN_SERVER_PORT"] == str(cfg.server.port)
    assert body["env"]["KILN_STATUS_PORT"] == str(cfg.status.port)
    assert body["containerDiskInGb"] == target.runpod.container_disk_gb
    assert body["volumeInGb"] == target.runpod.volume_gb
    assert body["volumeMountPath"] == target.runpod.volume_mount
    assert body["category"] == ("NVIDIA" if target.is_gpu else "CPU")
    assert body["isServerless"] is False
    assert "Terminate" in body["readme"] and "never Stop" in body["readme"]


@pytest.mark.parametrize("name", target_names())
def test_secrets_are_runpod_references_never_values(name):
    body = template_of(name).body
    assert body["env"]["KILN_API_KEY"] == "{{ RUNPOD_SECRET_kiln_api_key }}"
    if load_target(name).deploy_config().model.hf_repo:
        assert body["env"]["HF_TOKEN"] == "{{ RUNPOD_SECRET_hf_token }}"


def test_a_secret_canary_never_appears_in_the_printed_template_or_its_errors():
    for name in target_names():
        r = run_build("--target", name, "--runpod-template", env=SECRET_ENV)
        assert r.returncode == 0
        assert CANARY not in r.stdout + r.stderr
    # Nor in a refusal: a floating upsert without --allow-floating, and an upsert with no API reachable.
    r = run_build("--target", "a40-llamacpp", "--runpod-upsert", env=SECRET_ENV)
    assert r.returncode == 2 and "--allow-floating" in r.stderr
    assert CANARY not in r.stdout + r.stderr
    r = run_build("--target", "cpu-llamacpp", "--runpod-upsert", "--runpod-api", "http://127.0.0.1:9/v1",
                  env=SECRET_ENV)
    assert r.returncode == 2 and "RunPod API GET /templates" in r.stderr
    assert CANARY not in r.stdout + r.stderr


def test_a40_llamacpp_prints_valid_json_with_a_start_command_and_a_tcp_port_and_says_it_floats():
    """Issue 7's done-when. a40-llamacpp has unresolved pins: the template names the tag
    `build.py --allow-floating` would give the image, and says so on stderr and in its readme."""
    r = run_build("--target", "a40-llamacpp", "--runpod-template")
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert body["dockerStartCmd"] and all(body["dockerStartCmd"])
    assert any(p.endswith("/tcp") for p in body["ports"])
    assert body["imageName"] == f"ghcr.io/kiln-llm/kiln:a40-llamacpp-{__version__}-floating"
    assert "FLOATING" in r.stderr and "source.commit" in r.stderr
    assert "**FLOATING**" in body["readme"]
    assert run_build("--target", "a40-llamacpp", "--print-tag").stdout.strip() == body["imageName"]


def test_image_and_name_overrides_are_still_schema_checked():
    r = run_build("--target", "cpu-llamacpp", "--runpod-template", "--image", "registry.example/me/kiln",
                  "--runpod-template-name", "mine")
    body = json.loads(r.stdout)
    assert body["imageName"].startswith("registry.example/me/kiln:cpu-llamacpp-") and body["name"] == "mine"
    r = run_build("--target", "cpu-llamacpp", "--runpod-template", "--image", "Registry/Me:tag")
    assert r.returncode == 2 and "expected a repository" in r.stderr


# -- the kept schema and Kiln's validator -----------------------------------------------------------
def test_the_kept_schema_says_where_and_when_it_came_from():
    doc = runpod_schema.document()
    prov = doc["provenance"]
    assert "github.com/runpod/docs" in prov["copied_from"] and len(prov["repository_commit"]) == 40
    assert prov["retrieved"].startswith("20") and doc["verified"] and doc["unverified"]
    assert doc["paths"]["/templates"]["post"]["operationId"] == "CreateTemplate"
    assert "NVIDIA A40" in runpod_schema.gpu_types()


def test_validator_collects_every_problem_and_refuses_invented_fields():
    body = copy.deepcopy(template_of("cpu-llamacpp").body)
    body.update(args="--flag", containerDiskInGb="ten", ports=["8080/http", "8082/udp", 8083],
                env={"A": 1}, category="TPU")
    del body["imageName"]
    msgs = [str(p) for p in runpod_schema.problems(body, "TemplateCreateInput")]
    for part in ("TemplateCreateInput.args: is not a property the schema lists",
                 "TemplateCreateInput.containerDiskInGb: must be of type integer",
                 "TemplateCreateInput.ports[1]: must be [port number]/[protocol]",
                 "TemplateCreateInput.ports[2]: must be of type string",
                 "TemplateCreateInput.env.A: must be of type string",
                 "TemplateCreateInput.category: is not one of the values",
                 "TemplateCreateInput.imageName: is required"):
        assert any(part in m for m in msgs), (part, msgs)
    # The jsonschema library agrees on what RunPod itself publishes (types, enum, required).
    lib = jsonschema.Draft7Validator(published("TemplateCreateInput"))
    assert {e.validator for e in lib.iter_errors(body)} >= {"type", "enum", "required"}
    with pytest.raises(runpod_schema.RunPodSchemaError):
        runpod_schema.check(body, "TemplateCreateInput")


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
volume_gb = 0
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
    body = runpod.build_template(target, pins_for(target, load_lock())).body
    assert body["name"] == "my-coder"
    assert body["env"]["HF_TOKEN"] == "{{ RUNPOD_SECRET_my_hf }}"
    assert body["env"]["KILN_CONFIG"] == "/etc/kiln/profiles/code-editing.toml"
    assert "KILN_CONFIG=/etc/kiln/profiles/code-editing.toml" in body["readme"]
