"""`pods up --target T --replicas 2 --router` against kiln_dev/runpod (a stand-in for RunPod's REST API
v2 and its HTTP proxy, not RunPod): two replica pods, each a real Kiln supervisor with the real CPU
llama-server, and a CPU router pod running the real router (smg) under its own real supervisor,
which reaches the replicas over their TCP port and asks their /ready through the proxy. One URL and
one key for both; `status` shows the router and what it routes to; a second `up --router` keeps
it; `down` removes it with the replicas."""

from __future__ import annotations

import json
import re

import pytest

from kiln_dev.router import router_python
from kiln_dev.runpod import RunPodStandIn, SupervisorRunner
from kiln_dev.supervised import free_port, http

from test_runpod_pods import ACCOUNT_KEY, CANARIES, SERVER_KEY, TARGET, container_config, no_canary, pods_cli

OPERATOR_KEY = "kiln-operator-key-canary-6b1"

pytestmark = [pytest.mark.llama, pytest.mark.slow]


def router_container_config(state) -> str:
    """The router image's deploy config (images/deploy/router.toml) with this machine's Python for smg
    and a quicker poll; its replicas come from the pod's environment, as in a real pod."""
    return f"""engine = "router"
state_dir = "{state}"
[server]
port = 8080
tcp_port = 8082
host = "127.0.0.1"
binary = "{router_python()}"
[status]
host = "127.0.0.1"
port = 8081
[router]
poll_s = 0.5
metrics_port = {free_port()}
engine_port = {free_port()}
"""


@pytest.fixture
def standin(tmp_path, prefix, tiny):
    router_python()

    def config_for(pod, vol):
        state = (vol or tmp_path / "state" / pod["id"]) / "kiln"
        if pod["name"].endswith("-router"):
            return router_container_config(state)
        return container_config(prefix, tiny, state)

    runner = SupervisorRunner(tmp_path / "pods", config_for)
    with RunPodStandIn(ACCOUNT_KEY, runner=runner, secrets={"kiln_api_key": SERVER_KEY,
                                                             "kiln_operator_key": OPERATOR_KEY}) as s:
        s.runner_ = runner
        yield s
    assert s.faults == [], "the stand-in answered something RunPod's schema does not allow"


def test_up_with_a_router_gives_one_url_status_shows_its_routes_down_removes_it(standin):
    up = pods_cli(standin, "up", "--target", TARGET, "--replicas", "2", "--router", "--poll", "0.2",
                  "--timeout", "180")
    assert up.returncode == 0, up.stdout + up.stderr
    pods = {p["name"]: p for p in standin.pods.values()}
    assert sorted(pods) == [f"kiln-{TARGET}-1", f"kiln-{TARGET}-2", f"kiln-{TARGET}-router"]
    router = pods[f"kiln-{TARGET}-router"]
    assert router["cpu"]["id"] == "cpu5c" and router["cpu"]["vcpuCount"] == 2 and "gpu" not in router
    entries = router["env"]["KILN_ROUTER_REPLICAS"].split()
    for n in (1, 2):                 # each replica: API over its TCP port | its /ready over the proxy
        rep = pods[f"kiln-{TARGET}-{n}"]
        tcp = next(p for p in rep["runtime"]["ports"] if p["private"] == 8082)
        assert f"http://127.0.0.1:{tcp['public']}|" in router["env"]["KILN_ROUTER_REPLICAS"]
        assert any(e.endswith(f"{rep['id']}-8081/ready") for e in entries), entries
    assert "router ready, routes to 2 of 2 replica(s)" in up.stdout, up.stdout

    url = re.search(r"one URL for all replicas, over RunPod's HTTP proxy.*?: (\S+)", up.stdout).group(1)
    code, body = http(url + "/models")
    model = json.loads(body)["data"][0]["id"]
    ask = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()

    def chat(key):
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        return http(url + "/chat/completions", data=ask, headers=headers, timeout=60)[0]

    assert chat(SERVER_KEY) == 200 and chat(None) == 401 and chat("WRONG") == 401

    status = pods_cli(standin, "status", "--target", TARGET)
    assert status.returncode == 0 and status.stdout.count("supervisor: SERVING") == 3, status.stdout
    assert f"router: routes to 2 of 2 replica(s): kiln-{TARGET}-1, kiln-{TARGET}-2" in status.stdout

    writes = standin.writes()
    again = pods_cli(standin, "up", "--target", TARGET, "--replicas", "2", "--router", "--poll", "0.2",
                     "--timeout", "60")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already live in front of these replicas" in again.stderr and standin.writes() == writes

    down = pods_cli(standin, "down", "--target", TARGET)
    assert down.returncode == 0 and "terminated 3 pod(s)" in down.stdout, down.stdout + down.stderr
    assert standin.pods == {} and all(c.exited() for c in standin.runner_.started)
    logs = "".join(c.log_path.read_text() for c in standin.runner_.started)
    no_canary(up.stdout, up.stderr, status.stdout, again.stderr, down.stdout, standin.log_text(), logs)
    assert all(c not in json.dumps(router["env"]) for c in CANARIES)


def test_the_router_target_is_not_deployed_alone(standin):
    r = pods_cli(standin, "up", "--target", "router")
    assert r.returncode == 2 and "runs in front of another target's replicas" in r.stderr
    assert standin.writes() == []


def test_a_router_given_other_replicas_keeps_its_pod_and_its_url(standin, monkeypatch):
    """Issue 37 item 9: `up --router` again with another replica list terminated the router pod and made
    a new one (a new URL, the old one 404, requests in flight cut). Now the live router takes the new
    list in place, with its OPERATOR key (issue 50: never the clients'); without it `up` refuses before renting
    a replica (was: the replica was rented first), the router untouched."""
    monkeypatch.delenv("KILN_OPERATOR_KEY", raising=False)
    monkeypatch.setenv("KILN_API_KEY", SERVER_KEY)           # the clients' key changes nothing
    first = pods_cli(standin, "up", "--target", TARGET, "--replicas", "1", "--router", "--poll", "0.2",
                     "--timeout", "180")
    assert first.returncode == 0, first.stdout + first.stderr
    router = next(p for p in standin.pods.values() if p["name"] == f"kiln-{TARGET}-router")
    url = re.search(r"one URL for all replicas, over RunPod's HTTP proxy.*?: (\S+)", first.stdout).group(1)
    model = json.loads(http(url + "/models")[1])["data"][0]["id"]
    ask = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {SERVER_KEY}"}

    pods_before = set(standin.pods)
    refused = pods_cli(standin, "up", "--target", TARGET, "--replicas", "2", "--router", "--poll", "0.2",
                       "--timeout", "180")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "export KILN_OPERATOR_KEY" in refused.stderr and "kiln_operator_key" in refused.stderr, refused.stderr
    assert "Nothing was created" in refused.stderr and set(standin.pods) == pods_before
    assert router["id"] in standin.pods and standin.pods[router["id"]]["status"] == "RUNNING"

    monkeypatch.setenv("KILN_OPERATOR_KEY", OPERATOR_KEY)
    again = pods_cli(standin, "up", "--target", TARGET, "--replicas", "2", "--router", "--poll", "0.2",
                     "--timeout", "180")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "its replicas changed in place (2 now); its URL stays" in again.stderr, again.stderr
    routers = [p for p in standin.pods.values() if p["name"] == f"kiln-{TARGET}-router"]
    assert [p["id"] for p in routers] == [router["id"]]                     # the same pod: the same URL
    assert "router ready, routes to 2 of 2 replica(s)" in again.stdout, again.stdout
    assert http(url + "/chat/completions", data=ask, headers=headers, timeout=60)[0] == 200
    status = pods_cli(standin, "status", "--target", TARGET)
    assert f"router: routes to 2 of 2 replica(s): kiln-{TARGET}-1, kiln-{TARGET}-2" in status.stdout, status.stdout
    no_canary(first.stdout, first.stderr, refused.stdout, refused.stderr, again.stdout, again.stderr, status.stdout)
