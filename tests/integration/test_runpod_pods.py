"""`python build.py pods` against kiln_dev/runpod: a stand-in for RunPod's REST API v2 and its HTTP
proxy (not RunPod). Each stand-in pod runs a REAL Kiln supervisor with the real CPU llama-server and
a tiny real GGUF (a CPU cannot run the target's GPU image; the supervisor, its /status and /ready
are the real ones), reached through the stand-in's proxy, so `up` waits on a real /ready."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kiln_dev.runpod import RunPodStandIn, SupervisorRunner, gpu_type
from kiln_dev.hub import HubServer
from kiln_dev.supervised import config, http, wait_for

pytestmark = pytest.mark.llama
ROOT = Path(__file__).resolve().parents[2]
TARGET = "a40-vllm"            # a GPU target with resolved pins: 1x A40, CUDA floor 13.0 (torch cu13)
ACCOUNT_KEY = "rpa_kiln-account-canary-93b1"
SERVER_KEY = "kiln-server-key-canary-5d2e"
HF_CANARY = "hf_kilnCanaryNeverSent0000"
CANARIES = (ACCOUNT_KEY, SERVER_KEY, HF_CANARY)


def container_config(prefix: Path, tiny: Path | str, state: Path, *, hf: bool = False) -> str:
    """The deploy config the stand-in's container bakes: the CPU llama-server, a tiny model,
    the selftest off (a random model answers nothing right), a TCP relay like the target's."""
    text = config(binary=str(prefix / "bin/llama-server"), model=str(tiny), port=8080, status_port=8081,
                  state_dir=state, snapshot=str(prefix / "share/kiln/llama-server.help.txt"),
                  rungs='[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "512"]\n')
    text = text.replace("[server]\n", "[server]\ntcp_port = 8082\n", 1)
    if hf:
        text = text.replace(f'source = "{tiny}"', f'source = "{tiny}"\nentry = "tiny.gguf"\nfetch_stall_s = 20')
    return text


def pods_cli(standin: RunPodStandIn, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "RUNPOD_API_KEY": ACCOUNT_KEY, "RUNPOD_API_URL": standin.url,
           "RUNPOD_PROXY_URL": standin.proxy_url, "HF_TOKEN": HF_CANARY}
    return subprocess.run([sys.executable, str(ROOT / "build.py"), "pods", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


def no_canary(*texts: str) -> None:
    for text in texts:
        for canary in CANARIES:
            assert canary not in text, f"secret {canary[:12]}... leaked"


@pytest.fixture
def standin(tmp_path, prefix, tiny):
    runner = SupervisorRunner(tmp_path / "pods", lambda pod, vol: container_config(
        prefix, tiny, (vol or tmp_path / "state" / pod["id"]) / "kiln"))
    with RunPodStandIn(ACCOUNT_KEY, runner=runner, secrets={"kiln_api_key": SERVER_KEY, "hf_token": HF_CANARY}) as s:
        s.runner_ = runner
        yield s
    assert s.faults == [], "the stand-in answered something RunPod's schema does not allow"


def chat(url: str, key: str | None) -> int:
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    return http(url + "/chat/completions", data=body, headers=headers, timeout=60)[0]


def test_up_three_replicas_all_ready_a_second_up_creates_nothing_down_leaves_nothing(standin):
    up = pods_cli(standin, "up", "--target", TARGET, "--replicas", "3", "--poll", "0.2", "--timeout", "180")
    assert up.returncode == 0, up.stdout + up.stderr
    assert up.stdout.count("): ready: SERVING") == 3, up.stdout
    ids = sorted(standin.pods)
    assert len(ids) == 3 and sorted(p["name"] for p in standin.pods.values()) == \
        [f"kiln-{TARGET}-{n}" for n in (1, 2, 3)]
    for pid in ids:
        assert standin.history[pid] == ["PROVISIONING", "STARTING", "RUNNING"]
        assert (pid, 8081, "/ready") in standin.proxy.forwarded, "up waited on the real /ready, through the proxy"
    create = [r["body"] for r in standin.requests if r["method"] == "POST" and r["path"] == "/v2/pods"]
    assert len(create) == 3 and all(b["gpu"] == {"id": "NVIDIA A40", "count": 1, "minCudaVersion": "13.0"}
                                    for b in create)
    assert "catalog: NVIDIA A40 hosts with CUDA 13.0 have capacity" in up.stderr
    assert "value of your RunPod secret 'kiln_api_key'" in up.stdout

    # The printed endpoints serve, with the key: over the proxy, and over the TCP port.
    http_url = re.search(r"over RunPod's HTTP proxy.*?: (\S+)", up.stdout).group(1)
    tcp_url = re.search(r"over TCP \(no proxy limit\): (http://127\.0\.0\.1:\d+/v1)", up.stdout).group(1)
    assert chat(http_url, SERVER_KEY) == 200 and chat(http_url, None) == 401
    assert chat(tcp_url, SERVER_KEY) == 200

    # Idempotent: the template is unchanged and the three live replicas are kept, nothing written.
    writes = standin.writes()
    again = pods_cli(standin, "up", "--target", TARGET, "--replicas", "3", "--poll", "0.2", "--timeout", "60")
    assert again.returncode == 0, again.stderr
    assert standin.writes() == writes and "3 pod(s) already live" in again.stderr and "unchanged" in again.stderr

    status = pods_cli(standin, "status", "--target", TARGET)
    assert status.returncode == 0 and status.stdout.count("supervisor: SERVING") == 3 and "3 pod(s), $1.32/h" \
        in status.stdout       # the stand-in bills the document's example 0.44/GPU/h

    logs = pods_cli(standin, "logs", ids[0], "--tail", "200", "--idle", "1")
    assert logs.returncode == 0 and "state SERVING" in logs.stdout and "system: status RUNNING" in logs.stdout

    down = pods_cli(standin, "down", "--target", TARGET)
    assert down.returncode == 0 and "terminated 3 pod(s)" in down.stdout, down.stderr
    assert standin.pods == {} and sorted(standin.terminated) == ids
    assert all(c.exited() for c in standin.runner_.started), "every container stopped"
    assert pods_cli(standin, "status").stdout.strip() == "no Kiln pods"
    assert not standin.stopped and not [r for r in standin.requests if r["path"].endswith("/action")]

    container_logs = "".join(c.log_path.read_text() for c in standin.runner_.started)
    no_canary(up.stdout, up.stderr, again.stdout, again.stderr, status.stdout, logs.stdout, down.stdout,
              down.stderr, standin.log_text(), container_logs)
    assert HF_CANARY not in json.dumps([r.get("body") for r in standin.requests])


def test_a_network_volume_keeps_the_model_for_the_next_pod(tmp_path, prefix, tiny):
    """The first pod downloads the model into the network volume; after `down`, the next pod of
    the same name finds it there and downloads no file again."""
    with HubServer(tmp_path / "hub") as hub:
        hub.seed("kiln-test/tiny", {"tiny.gguf": tiny.read_bytes()})
        runner = SupervisorRunner(
            tmp_path / "pods",
            lambda pod, vol: container_config(prefix, "hf://kiln-test/tiny", (vol or tmp_path / pod["id"]) / "kiln",
                                              hf=True),
            extra_env={"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "0"})
        with RunPodStandIn(ACCOUNT_KEY, runner=runner, secrets={"kiln_api_key": SERVER_KEY,
                                                                 "hf_token": hub.token}) as standin:
            args = ("up", "--target", TARGET, "--network-volume", "kiln-models", "--data-center", "EU-RO-1",
                    "--network-volume-gb", "20", "--poll", "0.2", "--timeout", "120")
            first = pods_cli(standin, *args)
            assert first.returncode == 0, first.stdout + first.stderr
            (vol,) = standin.volumes.values()
            assert vol == {"id": vol["id"], "name": "kiln-models", "size": 20, "dataCenter": "EU-RO-1", "type": "STANDARD"}
            (pod,) = standin.pods.values()
            assert pod["mounts"] == {"network": [{"volumeId": vol["id"], "path": "/workspace"}]}
            assert pod["env"]["KILN_STATE_DIR"] == f"/workspace/kiln/pods/kiln-{TARGET}-1"
            downloads = hub.counts["resolve_get"]
            assert downloads >= 1
            assert "network volume kiln-models: created" in first.stderr

            down = pods_cli(standin, "down", "--target", TARGET)
            assert down.returncode == 0 and "network volumes kept" in down.stdout and "kiln-models" in down.stdout

            second = pods_cli(standin, *args)
            assert second.returncode == 0, second.stdout + second.stderr
            assert "network volume kiln-models: reused" in second.stderr and len(standin.volumes) == 1
            (pod2,) = standin.pods.values()
            assert pod2["id"] != pod["id"] and pod2["name"] == pod["name"]
            assert hub.counts["resolve_get"] == downloads, "the successor downloaded the model again"
            assert pods_cli(standin, "down", "--all").returncode == 0
            no_canary(first.stdout, first.stderr, second.stdout, second.stderr, standin.log_text())
            assert hub.token not in first.stdout + first.stderr + second.stdout + standin.log_text()
            assert standin.faults == []


# -- refusals: no supervisor needed (the stand-in's containers run nothing) ---------------------------
@pytest.fixture
def bare():
    with RunPodStandIn(ACCOUNT_KEY) as s:
        yield s
    assert s.faults == []


@pytest.mark.parametrize("catalog,says", [
    ([gpu_type("NVIDIA A40", cuda=(("12.4", True), ("12.8", True), ("12.6", False)))],
     "no NVIDIA A40 host (1x, SECURE cloud) reports a CUDA version this image runs on (>= 13.0); "
     "on offer: 12.4 (available), 12.8 (available), 12.6 (full)"),
    ([gpu_type("NVIDIA A40", cuda=(("12.8", False), ("13.0", False)))], "exist (1x, SECURE cloud) but are all full now"),
    ([gpu_type("NVIDIA A40", cuda=())], "on offer: no CUDA version reported"),
    ([gpu_type("NVIDIA GeForce RTX 4090")], "lists no GPU type 'NVIDIA A40' for pods (1x, SECURE cloud); "
                                            "on offer: NVIDIA GeForce RTX 4090"),
])
def test_no_host_with_a_cuda_the_image_runs_on_is_refused_before_anything_is_created(bare, catalog, says):
    bare.catalog[:] = catalog
    r = pods_cli(bare, "up", "--target", TARGET, "--replicas", "3")
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert bare.writes() == [] and bare.templates == {} and bare.pods == {}
    assert [(q["method"], q["path"]) for q in bare.requests] == [("GET", "/v2/catalog/gpus")]
    assert "include=AVAILABILITY&product=POD" in bare.requests[0]["query"]
    no_canary(r.stdout, r.stderr)


def test_a_data_center_without_capacity_is_refused_naming_those_with_some(bare):
    bare.catalog[:] = [gpu_type("NVIDIA A40", data_centers=(("EU-RO-1", "HIGH"), ("US-TX-3", "NONE")))]
    r = pods_cli(bare, "up", "--target", TARGET, "--data-center", "US-TX-3")
    assert r.returncode == 2 and "no capacity in US-TX-3; data centers with capacity: EU-RO-1 (HIGH)" in r.stderr
    assert bare.writes() == []


def test_a_pod_request_that_breaks_the_schema_never_leaves_the_machine(bare):
    # A CPU pod with 1 vCPU: CreateCpuConfig says at least 2. Refused before POST /v2/pods is sent.
    r = pods_cli(bare, "up", "--target", "cpu-llamacpp", "--cpu-flavor", "cpu3c", "--vcpu", "1")
    assert r.returncode == 2 and "CreatePodRequest.cpu.vcpuCount: 1 is less than the minimum of 2" in r.stderr
    assert "nothing was sent" in r.stderr
    assert ("POST", "/v2/pods") not in bare.writes() and bare.pods == {}


def test_terminate_on_failure_reaches_the_pods_env_and_the_template_is_untouched(bare):
    r = pods_cli(bare, "up", "--target", TARGET, "--terminate-on-failure", "--timeout", "0", "--poll", "0.1")
    (pod,) = bare.pods.values()
    assert pod["env"]["KILN_RUNPOD_TERMINATE_ON_TERMINAL_FAILURE"] == "true"
    (tpl,) = bare.templates.values()
    assert "KILN_RUNPOD_TERMINATE_ON_TERMINAL_FAILURE" not in tpl["env"]
    assert r.returncode == 1 and "NOT READY" in r.stdout          # nothing serves in a bare pod
    assert pods_cli(bare, "down", "--pod", pod["id"]).returncode == 0 and bare.pods == {}


def test_commands_without_a_key_say_how_to_get_one(bare):
    env = {k: v for k, v in os.environ.items() if k != "RUNPOD_API_KEY"}
    r = subprocess.run([sys.executable, str(ROOT / "build.py"), "pods", "status", "--api", bare.url],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 2 and "RUNPOD_API_KEY is not set" in r.stderr and "Settings > API Keys" in r.stderr


# -- whose pods: a target's own, never another's whose name begins the same (issue 24, item 1) ---------
SHORT, LONGER = "a40-llamacpp", "a40-llamacpp-upstream"     # kiln-a40-llamacpp- begins both targets' pod names


def bare_up(standin: RunPodStandIn, target: str, *args: str) -> subprocess.CompletedProcess:
    """`pods up` that creates and does not wait (a bare pod runs no supervisor: NOT READY, exit 1)."""
    extra = ("--allow-floating",) if target == SHORT else ()     # its fork's pins are unresolved
    r = pods_cli(standin, "up", "--target", target, "--timeout", "0", "--poll", "0.1", *extra, *args)
    assert r.returncode == 1 and "NOT READY" in r.stdout, r.stdout + r.stderr
    return r


def test_down_status_and_up_of_a_target_never_touch_the_pods_of_a_target_whose_name_begins_the_same(bare):
    # The reproduction: `down --target a40-llamacpp` matched the name prefix kiln-a40-llamacpp-,
    # and terminated a40-llamacpp-upstream's pods (their weights with them); `up` counted them.
    from images.runpod.api import RunPodAPI

    bare_up(bare, LONGER, "--replicas", "2")
    # A pod made before Kiln put KILN_TARGET in its pods' env: known by its whole name alone.
    RunPodAPI(ACCOUNT_KEY, bare.url).create_pod({"name": f"kiln-{LONGER}-3", "image": "x", "gpu": {"id": "NVIDIA A40"}})
    theirs = set(bare.pods)
    assert len(theirs) == 3

    mine = bare_up(bare, SHORT)
    assert "already live" not in mine.stderr and "beyond --replicas" not in mine.stderr, mine.stderr
    (my_id,) = set(bare.pods) - theirs
    assert bare.pods[my_id]["name"] == f"kiln-{SHORT}-1" and bare.pods[my_id]["env"]["KILN_TARGET"] == SHORT
    assert {bare.pods[i]["env"].get("KILN_TARGET") for i in theirs} == {LONGER, None}

    status = pods_cli(bare, "status", "--target", SHORT, "--no-probe")
    assert status.returncode == 0 and my_id in status.stdout and "1 pod(s)" in status.stdout, status.stdout
    assert not [i for i in theirs if i in status.stdout]
    everything = pods_cli(bare, "status", "--no-probe")
    assert "4 pod(s)" in everything.stdout and all(i in everything.stdout for i in theirs | {my_id})

    again = pods_cli(bare, "up", "--target", SHORT, "--allow-floating", "--timeout", "0", "--poll", "0.1")
    assert "1 pod(s) already live" in again.stderr and set(bare.pods) == theirs | {my_id}, again.stderr

    down = pods_cli(bare, "down", "--target", SHORT)
    assert down.returncode == 0 and "terminated 1 pod(s)" in down.stdout, down.stdout + down.stderr
    assert set(bare.pods) == theirs and list(bare.terminated) == [my_id]

    down = pods_cli(bare, "down", "--target", LONGER)
    assert down.returncode == 0 and "terminated 3 pod(s)" in down.stdout and bare.pods == {}


# -- typos that bill, and an interrupted up (issue 24, item 7) ------------------------------------------
def test_a_target_or_pod_that_does_not_exist_is_exit_2_naming_what_does_and_nothing_is_terminated(bare):
    # Was: `down --target <typo>` printed "nothing to terminate" and `--pod <typo>` "already gone",
    # both exit 0, while the real pods ran on.
    bare_up(bare, LONGER, "--replicas", "2")
    ids = sorted(bare.pods)
    typo = pods_cli(bare, "down", "--target", "a40-llamacpp-upstrem")
    assert typo.returncode == 2 and "'a40-llamacpp-upstrem' is not a target (did you mean " \
        "'a40-llamacpp-upstream'?)" in typo.stderr and "cpu-llamacpp" in typo.stderr, typo.stderr
    status = pods_cli(bare, "status", "--target", "a40-llamacpp-upstrem", "--no-probe")
    assert status.returncode == 2 and "is not a target" in status.stderr

    pod = pods_cli(bare, "down", "--pod", ids[0], "--pod", "00005a17ff")
    assert pod.returncode == 2 and "--pod 00005a17ff (nothing was terminated): no such pod" in pod.stderr
    assert all(f"{i} (kiln-{LONGER}-" in pod.stderr for i in ids), pod.stderr       # Kiln's pods, id and name
    logs = pods_cli(bare, "logs", "kiln-a40-llamacpp-upstream-9", "--idle", "0.2")
    assert logs.returncode == 2 and "no such pod" in logs.stderr and ids[1] in logs.stderr
    assert sorted(bare.pods) == ids and not bare.terminated
    assert not [w for w in bare.writes() if w[0] == "DELETE"]

    # A target that exists and has no pods: a true "nothing to terminate".
    none = pods_cli(bare, "down", "--target", "cpu-llamacpp")
    assert none.returncode == 0 and none.stdout.startswith("nothing to terminate")
    assert pods_cli(bare, "down", "--pod", ids[0], "--pod", ids[1]).returncode == 0 and bare.pods == {}


def test_ctrl_c_during_up_says_which_pods_it_created_and_the_down_that_removes_them(bare):
    # Was: "interrupted", and the pods it had just created billed on, their ids nowhere.
    env = {**os.environ, "RUNPOD_API_KEY": ACCOUNT_KEY, "RUNPOD_API_URL": bare.url,
           "RUNPOD_PROXY_URL": bare.proxy_url}
    proc = subprocess.Popen([sys.executable, str(ROOT / "build.py"), "pods", "up", "--target", TARGET,
                             "--replicas", "2", "--poll", "0.1", "--timeout", "600"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                            # a terminal's Ctrl-C reaches a process whose SIGINT is at its default; a test
                            # run started from a script's background job (`cmd &`) inherits it ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # Both pods created, and `up` told so: it waits on each (GET /v2/pods/{id}).
        def waiting_on_both():
            with bare.lock:
                asked = {r["path"] for r in bare.requests if r["method"] == "GET"}
                return len(bare.pods) == 2 and all(f"/v2/pods/{pid}" in asked for pid in bare.pods)
        wait_for(waiting_on_both, 60, "up waiting on its two pods")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    made = sorted(bare.pods, key=lambda i: bare.pods[i]["name"])
    assert f"after creating 2 pod(s), which bill until terminated: kiln-{TARGET}-1 ({made[0]}), " \
           f"kiln-{TARGET}-2 ({made[1]})" in err, err
    (down,) = [line.strip() for line in err.splitlines() if line.strip().startswith("python build.py pods down")]
    assert down == f"python build.py pods down --pod {made[0]} --pod {made[1]}"
    assert err.rstrip().endswith("interrupted") and "Traceback" not in err
    gone = pods_cli(bare, *shlex.split(down)[3:])
    assert gone.returncode == 0 and "terminated 2 pod(s)" in gone.stdout and bare.pods == {}
    no_canary(out, err)
