"""README "Serve your own model", run as written (issues 48 and 49): every command of its shell block, in
order, against stand-ins for what a CPU machine with no network cannot reach. Each stand-in says what it
stands for: kiln_dev/runpod (RunPod's REST API v2 and its HTTP proxy; its catalog the document's own A40
example), kiln_dev/hub (huggingface.co, the real huggingface_hub client on both sides), and
tests/support/hw/nvml_shim (the pod's A40, as NVML reports it).

What cannot run here, and so is not run, said per command:
- `. .venv/bin/activate`: this test already runs in the venv;
- `python build.py --target a40-llamacpp-upstream ... --push`: a CUDA image is not built on a CPU machine
  with no registry to push to (docs/images.md; the CPU image's build runs in tests/e2e); the pod then runs
  this checkout's supervisor with the CPU llama-server (SupervisorRunner's image_paths), and `pods up`'s
  image check says ghcr.io could not be asked;
- the model is SmolLM2-135M-Instruct under the README's placeholder name; its pod's environment names
  its family (KILN_MODEL_FAMILY=smollm2), since a 135M model answers the generic probes too loosely.
The `curl` is made by this test with the pod's URL `pods up` printed, as the README says to."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kiln_dev.hub import HubServer
from kiln_dev.models import smollm2_gguf
from kiln_dev.runpod import RunPodStandIn, SupervisorRunner
from kiln_dev.supervised import http

pytestmark = pytest.mark.llama
ROOT = Path(__file__).resolve().parents[2]
SHIM = ROOT / "tests" / "support" / "hw" / "nvml_shim"
SERVER_KEY = "kiln-readme-walk-key-0c4"


def walkthrough() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Serve your own model", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_the_readmes_walkthrough_is_at_most_ten_commands():
    assert 1 <= len(walkthrough()) <= 10


def test_serve_your_own_model_as_the_readme_writes_it(tmp_path, prefix):
    lines = walkthrough()
    model = smollm2_gguf()
    plan_src = re.search(r"--model (hf://\S+)", lines[[i for i, ln in enumerate(lines) if " plan " in ln][0]]).group(1)
    parts = plan_src.removeprefix("hf://").split("/")
    repo, file = "/".join(parts[:2]), "/".join(parts[2:])
    with HubServer(tmp_path / "hub") as hub:
        hub.seed(repo, {file: model.read_bytes()})
        runner = SupervisorRunner(
            tmp_path / "pods", lambda pod, vol: "# the image's baked config: never served here\n",
            extra_env={"PYTHONPATH": f"{SHIM}{os.pathsep}{ROOT}", "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0",
                       "HF_HUB_DISABLE_TELEMETRY": "1", "KILN_MODEL_FAMILY": "smollm2"},
            image_paths={"/opt/kiln/engine/bin/llama-server": str(prefix / "bin" / "llama-server"),
                         "/opt/kiln/engine/share/kiln/llama-server.help.txt":
                         str(prefix / "share" / "kiln" / "llama-server.help.txt")})
        with RunPodStandIn("rpa_your_key", runner=runner, secrets={"kiln_api_key": SERVER_KEY,
                                                                    "hf_token": hub.token}) as standin:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "HF_", "RUNPOD_"))}
            env.update(RUNPOD_API_URL=standin.url, RUNPOD_PROXY_URL=standin.proxy_url, HF_ENDPOINT=hub.url,
                       HF_TOKEN=hub.token, HF_HUB_DISABLE_TELEMETRY="1")
            work = tmp_path / "work"
            work.mkdir()
            printed: dict[str, str] = {}
            for line in lines:
                argv = shlex.split(line)
                if argv[0] == "export":
                    name, _, value = argv[1].partition("=")
                    env[name] = SERVER_KEY if name == "KILN_API_KEY" else value      # the secret's value
                    continue
                if argv[0] == ".":                       # the venv: this test runs in it
                    continue
                if argv[0] == "curl":
                    pod_url = printed["pod_url"]
                    body = argv[argv.index("-d") + 1].encode()
                    code, out = http(pod_url + "/chat/completions", data=body, timeout=120,
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {env['KILN_API_KEY']}"})
                    assert code == 200, out
                    assert json.loads(out)["choices"][0]["message"]["content"].strip()
                    assert line.split()[2].startswith("https://POD_ID-8080.proxy.runpod.net/v1/")
                    continue
                assert argv[:2] == ["python", "build.py"], line
                if argv[2:3] == ["--target"] and "--push" in argv:      # the image build: not here (docstring)
                    continue
                r = subprocess.run([sys.executable, str(ROOT / "build.py"), *argv[2:]], cwd=work, env=env,
                                   capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
                assert r.returncode == 0, f"{line}\n{r.stdout}\n{r.stderr}"
                if argv[2] == "plan" and "--write-config" not in argv:
                    # the README's next command is the one plan printed under plan 1, word for word
                    first = r.stdout.split("\n2. ")[0]
                    write = next(ln.strip() for ln in first.splitlines() if "--write-config" in ln)
                    printed["write"] = write
                elif argv[2] == "plan":
                    assert line == printed["write"], (line, printed["write"])
                    deploy = r.stdout.split("deploy it with:\n", 1)[1].split()
                    readme_up = next(ln for ln in lines if " pods up " in ln)
                    assert shlex.join(deploy) in readme_up          # the README adds --image to it
                elif argv[2:4] == ["pods", "up"]:
                    assert "checked before renting" in r.stderr and "could NOT be checked" in r.stderr
                    printed["pod_url"] = re.search(r"API over RunPod's HTTP proxy.*?: (\S+)", r.stdout).group(1)
                    (pod,) = standin.pods.values()
                    assert pod["env"]["KILN_DEPLOY_CONFIG"] and pod["image"].startswith("ghcr.io/you/kiln:")
                elif argv[2:4] == ["pods", "down"]:
                    assert "terminated 1 pod(s)" in r.stdout and standin.pods == {}
            assert set(printed) == {"write", "pod_url"}
            assert standin.faults == []
