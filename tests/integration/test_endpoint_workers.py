"""One URL that scales to zero, end to end: `python build.py endpoint` against the serverless
stand-in (kiln_dev/runpod/serverless.py, not RunPod) whose workers are REAL Kiln supervisors
serving SmolLM2 with the real CPU llama-server, each with PORT, PORT_HEALTH and HEALTH_CHECK_PATH
from the endpoint's env (a CPU cannot run the target's GPU image; the supervisor, its health path
and the selftest gate are the real ones). The load balancer routes only to a worker whose health
path answers 200, so a request reaches a model only after its selftest passed.

Two shared cores: at most three workers, one thread each, small selftests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from kiln_dev.damage import damage_gguf
from kiln_dev.hub import HubServer
from kiln_dev.models import make_tiny_gguf, smollm2_gguf
from kiln_dev.runpod import ServerlessStandIn, WorkerRunner
from kiln_dev.supervised import config, wait_for

pytestmark = [pytest.mark.llama, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
TARGET = "a40-vllm"           # a GPU target with resolved pins; its workers run the CPU config below
ACCOUNT_KEY = "rpa_kiln-endpoint-account-canary-8e21"
HF_CANARY = "hf_kilnEndpointWorkerCanary0000"
SERVER_KEY = "kiln-endpoint-server-key-canary-61b7"
CANARIES = (ACCOUNT_KEY, HF_CANARY, SERVER_KEY)
GOOD, DAMAGED = "r.example/kiln:good", "r.example/kiln:damaged"
SELFTEST = ('[selftest]\nprobes = "smollm2"\ndecode_tokens = 16\nprefill_tokens = 128\nrequest_wall_s = 60\n'
            'timeout_s = 300\n')
RUNG = '[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "2048"]\n'


def worker_config(prefix: Path, model: Path | str, state: Path, *, selftest: str = SELFTEST, hf: bool = False) -> str:
    """The deploy config the image bakes, as the CPU quickstart's: the real llama-server, one thread.
    Its ports are placeholders: RunPod's PORT and PORT_HEALTH set them on a worker."""
    text = config(binary=str(prefix / "bin/llama-server"), model=str(model), port=8080, status_port=8081,
                  state_dir=state, snapshot=str(prefix / "share/kiln/llama-server.help.txt"), rungs=RUNG,
                  selftest=selftest)
    if hf:
        text = text.replace(f'source = "{model}"', f'source = "{model}"\nentry = "tiny.gguf"\nfetch_stall_s = 20')
    return text


def endpoint_cli(standin, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "RUNPOD_API_KEY": ACCOUNT_KEY, "RUNPOD_API_URL": standin.url, "HF_TOKEN": HF_CANARY,
           "KILN_API_KEY": SERVER_KEY}
    return subprocess.run([sys.executable, str(ROOT / "build.py"), "endpoint", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=timeout)


def chat_stream(base: str, text: str = "Say hello.", max_tokens: int = 12, timeout: float = 300):
    """A streaming chat completion through the endpoint's URL: (status, worker id, SSE data lines)."""
    r = requests.post(base + "/v1/chat/completions", stream=True, timeout=timeout,
                      headers={"Authorization": f"Bearer {ACCOUNT_KEY}"},
                      json={"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                            "stream": True, "temperature": 0})
    with r:
        lines = [ln for ln in r.iter_lines(decode_unicode=True) if ln.startswith("data:")]
    return r.status_code, r.headers.get("X-Runpod-Worker-Id"), lines


def no_canary(*texts: str) -> None:
    for text in texts:
        for canary in CANARIES:
            assert canary not in text, f"secret {canary[:12]}... leaked"


def everything_recorded(standin: ServerlessStandIn) -> str:
    logs = [w.container.log_path.read_text(errors="replace") for w in standin.started_workers]
    system = [json.dumps(w.system) for w in standin.started_workers]
    return standin.log_text() + "".join(logs) + "".join(system)


@pytest.fixture(scope="module")
def smol() -> Path:
    return smollm2_gguf()


@pytest.fixture(scope="module")
def damaged(tmp_path_factory, smol) -> Path:
    """SmolLM2 with every layer's attention output and FFN down projection zeroed: it loads like the
    original and answers nothing useful, which only the selftest can tell."""
    dst = tmp_path_factory.mktemp("models") / "smollm2-damaged.gguf"
    damage_gguf(smol, dst, tensors=r"(attn_output|ffn_down)\.weight$", how="zeros")
    return dst


@pytest.fixture
def standin(tmp_path, prefix, smol, damaged):

    def config_for(endpoint, worker_id, volume):
        model = damaged if str(endpoint.get("image", "")).endswith(":damaged") else smol
        return worker_config(prefix, model, (volume or tmp_path / "disk" / worker_id) / "kiln")

    runner = WorkerRunner(tmp_path / "rp", config_for, extra_env={"KILN_SERVERLESS_EXIT_GRACE_S": "2"})
    with ServerlessStandIn(ACCOUNT_KEY, workers=runner, no_worker_limit_s=240, worker_stop_grace_s=10,
                           secrets={"hf_token": HF_CANARY, "kiln_api_key": SERVER_KEY}) as s:
        yield s
    assert s.faults == [], "the stand-in answered something RunPod's schema does not allow"


def live(standin, eid: str) -> list:
    with standin.lock:
        return list(standin.workers.get(eid, {}).values())


def test_a_cold_request_waits_streams_then_sixteen_streams_spread_over_three_workers_and_it_scales_to_zero(standin):
    up = endpoint_cli(standin, "up", "--target", TARGET, "--image-ref", GOOD, "--no-network-volume",
                      "--idle-timeout", "2", "--request-count", "5")
    assert up.returncode == 0, up.stdout + up.stderr
    (e,) = standin.endpoints.values()
    base = e["requestUrls"]["base"]
    assert live(standin, e["id"]) == [], "min 0: nothing runs before a request"

    # A request at zero workers: it waits for a cold worker, which takes it only once healthy.
    status, worker, lines = chat_stream(base)
    assert status == 200 and lines[-1] == "data: [DONE]" and len(lines) >= 3, lines
    assert json.loads(lines[0][5:])["object"] == "chat.completion.chunk"
    (w1,) = standin.started_workers
    assert worker == w1.id and standin.balancer.routed[0][:3] == (e["id"], w1.id, "/v1/chat/completions")
    became = [line for _, line in w1.system if "-> IDLE (health 200)" in line]
    assert became, w1.system
    environ = Path(f"/proc/{w1.container.proc.pid}/environ").read_bytes().split(b"\0")
    assert f"HF_TOKEN={HF_CANARY}".encode() in environ, "the secret reference was resolved into the worker"
    assert f"RUNPOD_ENDPOINT_ID={e['id']}".encode() in environ
    st = requests.get(f"http://127.0.0.1:{w1.health_port}/status", timeout=5).json()
    assert st["selftest"]["passed"] is True and st["state"] == "SERVING"
    assert requests.get(f"http://127.0.0.1:{w1.health_port}/ping", timeout=5).status_code == 200

    # Three warm workers (min 3: a PATCH of `workers`, no new release), then 16 streams at once.
    warm = endpoint_cli(standin, "up", "--target", TARGET, "--image-ref", GOOD, "--no-network-volume",
                        "--idle-timeout", "2", "--request-count", "5", "--min-workers", "3", "--wait", "--poll", "0.5",
                        "--settle", "2")
    assert warm.returncode == 0, warm.stdout + warm.stderr
    assert "changed: workers" in warm.stderr and standin.releases[e["id"]][0]["diff"][0]["field"] == "workers"
    wait_for(lambda: sum(w.status == "IDLE" for w in live(standin, e["id"])) == 3, 400, "three healthy workers")
    results: list = []
    threads = [threading.Thread(target=lambda i=i: results.append(chat_stream(base, f"Count to {i}.")))
               for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(400)
    assert len(results) == 16 and all(s == 200 and ln[-1] == "data: [DONE]" for s, _, ln in results), results
    by_worker = {wid for _, wid, _ in results}
    assert len(by_worker) == 3, f"16 streams went to {by_worker}"

    # (a stream's last byte reaches the client before the load balancer counts its request done)
    wait_for(lambda: sum(w.status == "IDLE" for w in live(standin, e["id"])) == 3, 30, "three idle workers")
    status = endpoint_cli(standin, "status", "--target", TARGET)
    assert status.returncode == 0 and "workers: 3 (running 0, idle 3" in status.stdout, status.stdout
    logs = endpoint_cli(standin, "logs", "--target", TARGET, w1.id, "--tail", "400", "--idle", "1")
    assert logs.returncode == 0 and "state SERVING" in logs.stdout and "system: worker" in logs.stdout

    # Back to zero: min 0, and every idle worker is released after idleTimeout.
    zero = endpoint_cli(standin, "up", "--target", TARGET, "--image-ref", GOOD, "--no-network-volume",
                        "--idle-timeout", "2", "--request-count", "5")
    assert zero.returncode == 0, zero.stderr
    wait_for(lambda: live(standin, e["id"]) == [], 120, "scale to zero")
    wait_for(lambda: all(w.container.exited() for w in standin.started_workers), 60, "every worker process ended")
    assert "workers: 0 (" in endpoint_cli(standin, "status", "--target", TARGET).stdout

    down = endpoint_cli(standin, "down", "--target", TARGET)
    assert down.returncode == 0 and standin.endpoints == {}
    no_canary(up.stdout, up.stderr, warm.stdout, warm.stderr, status.stdout, logs.stdout, zero.stderr,
              down.stdout, everything_recorded(standin))


def test_a_damaged_release_never_takes_a_request_and_is_rolled_back(standin):
    good = endpoint_cli(standin, "up", "--target", TARGET, "--image-ref", GOOD, "--no-network-volume",
                        "--idle-timeout", "120", "--wait", "--poll", "0.5", "--settle", "3")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "is healthy: ready, and still ready 3 s later at every read; its selftest passed (probe set smollm2" \
        in good.stderr, good.stderr
    (e,) = standin.endpoints.values()
    first = [w.id for w in standin.started_workers]

    # The damaged release rolls out; once its worker runs and the old one is gone, a client asks.
    cli = subprocess.Popen([sys.executable, str(ROOT / "build.py"), "endpoint", "up", "--target", TARGET,
                            "--image-ref", DAMAGED, "--no-network-volume", "--idle-timeout", "120", "--wait",
                            "--poll", "0.5", "--timeout", "300"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env={**os.environ, "RUNPOD_API_KEY": ACCOUNT_KEY,
                                                        "RUNPOD_API_URL": standin.url, "HF_TOKEN": HF_CANARY})
    try:
        wait_for(lambda: standin.endpoints[e["id"]]["image"] == DAMAGED
                 and all(w.stopping or w.image == DAMAGED for w in live(standin, e["id"])), 120,
                 "the damaged release current, the good worker on its way out")
        asked: list = []
        client = threading.Thread(target=lambda: asked.append(chat_stream(e["requestUrls"]["base"])))
        client.start()
        out, err = cli.communicate(timeout=400)
    finally:
        if cli.poll() is None:
            cli.kill()
    damaged = subprocess.CompletedProcess(cli.args, cli.returncode, out, err)
    assert damaged.returncode == 3, damaged.stdout + damaged.stderr
    assert "NOT HEALTHY: selftest_failed" in damaged.stdout, damaged.stdout
    assert "restored the previous release's image" in damaged.stdout
    assert standin.endpoints[e["id"]]["image"] == GOOD
    versions = [(r["version"], [d["field"] for d in r["diff"]]) for r in standin.releases[e["id"]]]
    assert versions[:2] == [(3, ["template.imageName"]), (2, ["template.imageName"])], versions
    bad_workers = [w for w in standin.started_workers if w.image == DAMAGED]
    assert bad_workers, "the damaged release started a worker"
    assert all(w.status != "IDLE" for w in bad_workers)
    routed_to = {wid for _, wid, _, _ in standin.balancer.routed}
    assert not routed_to & {w.id for w in bad_workers}, "a worker serving a damaged model received a request"

    # The client's request waited through the damaged release: a fresh worker of the restored one
    # answered it, and answers the next.
    client.join(400)
    restored = {w.id for w in standin.started_workers if w.image == GOOD and w.id not in first}
    assert asked and asked[0][0] == 200 and asked[0][1] in restored, (asked, restored)
    status, worker, lines = chat_stream(e["requestUrls"]["base"])
    assert status == 200 and worker in restored, (worker, restored)
    no_canary(good.stdout, good.stderr, damaged.stdout, damaged.stderr, everything_recorded(standin))


def test_two_workers_cold_starting_on_one_volume_download_the_model_once(tmp_path, prefix):
    tiny = make_tiny_gguf(tmp_path / "tiny.gguf")
    with HubServer(tmp_path / "hub") as hub:
        hub.seed("kiln-test/tiny", {"tiny.gguf": tiny.read_bytes()})
        runner = WorkerRunner(
            tmp_path / "rp", lambda e, wid, vol: worker_config(prefix, "hf://kiln-test/tiny", vol / "kiln",
                                                              selftest="[selftest]\nenabled = false\n", hf=True),
            extra_env={"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "0"})
        with ServerlessStandIn(ACCOUNT_KEY, workers=runner, worker_stop_grace_s=10,
                               secrets={"hf_token": hub.token, "kiln_api_key": SERVER_KEY}) as standin:
            up = endpoint_cli(standin, "up", "--target", TARGET, "--image-ref", GOOD, "--min-workers", "2",
                              "--data-center", "EU-RO-1", "--network-volume", "kiln-models", "--wait", "--poll", "0.5",
                              "--settle", "2")
            assert up.returncode == 0, up.stdout + up.stderr
            (e,) = standin.endpoints.values()
            wait_for(lambda: sum(w.status == "IDLE" for w in live(standin, e["id"])) == 2, 300, "two healthy workers")
            w1, w2 = standin.started_workers
            assert w1.container is not w2.container and runner.volume_dir(e) is not None
            got = [r for r in hub.log if r.route == "resolve_get" and r.path.endswith("/tiny.gguf")]
            ranges = [tuple(map(int, (r.range or f"bytes=0-{tiny.stat().st_size - 1}")[6:].split("-"))) for r in got]
            assert sum(b - a + 1 for a, b in ranges) == tiny.stat().st_size, f"downloaded more than once: {got}"
            assert endpoint_cli(standin, "down", "--target", TARGET).returncode == 0
            assert hub.token not in everything_recorded(standin) + up.stdout + up.stderr
            no_canary(up.stdout, up.stderr, everything_recorded(standin))
            assert standin.faults == []
