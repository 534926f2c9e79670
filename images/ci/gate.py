"""The selftest gate CI runs on a GPU before promoting a staging image.

The supervisor's /ready turns 200 only after its selftest passed (answers at temperature 0,
decode and prefill measured); /status says why not. The gate starts the staging image where a GPU
is, waits for that verdict, and always cleans up:

    local   a self-hosted runner with a GPU: `docker run --gpus all`, then `docker rm -f`
    runpod  a RunPod pod from a staging template, through the same REST v2 code as
            `python build.py pods up` (catalog check, upsert, create by templateId), then
            terminated, never stopped (a stopped pod's volume bills at twice the running rate)

Passing means /status reports ready *and* a selftest that passed: an image whose selftest was
switched off does not pass the gate.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import requests

from supervisor.errors import KilnError

from ..fleet.probe import read_status
from ..runpod import pods
from ..runpod.api import RunPodAPI
from ..runpod.cuda import cuda_floor
from ..runpod.template import RunPodTemplate, upsert
from ..target import Target

# Passed by name only (`docker run -e NAME`): values never appear in an argv.
SECRET_ENV = ("KILN_API_KEY", "HF_TOKEN")


class GateFailed(KilnError):
    pass


@dataclass(frozen=True)
class GateResult:
    """The gate's answer for one staging image: passed or not, the supervisor's last state, and why; the
    GPUs the pod's /status reported (hardware.gpus[].name) and their driver, for the signed verdict
    (images/attest/verdict.py)."""
    passed: bool
    state: str
    reason: str
    selftest: dict[str, Any] | None = None
    gpus: tuple[str, ...] = ()
    driver: str | None = None


def _hardware(snap: dict[str, Any]) -> dict[str, Any]:
    hw = snap.get("hardware") if isinstance(snap.get("hardware"), dict) else {}
    gpus = tuple(str(g["name"]) for g in hw.get("gpus") or [] if isinstance(g, dict) and g.get("name"))
    driver = hw.get("driver") if isinstance(hw.get("driver"), str) else None
    return {"gpus": gpus, "driver": driver}


def judge(snap: dict[str, Any]) -> GateResult | None:
    """A final verdict from one /status snapshot, or None to keep waiting."""
    state = str(snap.get("state"))
    selftest = snap.get("selftest") if isinstance(snap.get("selftest"), dict) else None
    if snap.get("ready") is True:
        if selftest and selftest.get("passed") is True:
            return GateResult(True, state, "ready, selftest passed", selftest, **_hardware(snap))
        return GateResult(False, state, "ready without a passing selftest (is [selftest] enabled?)", selftest,
                          **_hardware(snap))
    if state == "FAILED":
        failure = snap.get("last_failure") or {}
        why = failure.get("message") or failure.get("class") or "see /status"
        return GateResult(False, state, f"FAILED: {why}", selftest, **_hardware(snap))
    return None


def wait_verdict(status_url: str, *, timeout_s: float, poll_s: float = 10.0,
                 session: requests.Session | None = None, say: Callable[[str], None] | None = None,
                 alive: Callable[[], bool] | None = None) -> GateResult:
    """Poll /status until a verdict, the deadline, or `alive()` says the container is gone."""
    s = session or requests.Session()
    say = say or (lambda m: print(m, file=sys.stderr, flush=True))
    deadline = time.monotonic() + timeout_s
    last = "nothing answered yet"
    while time.monotonic() < deadline:
        snap = read_status(status_url, s)
        if snap is not None:
            verdict = judge(snap)
            if verdict:
                return verdict
            if snap.get("state") != last:
                last = str(snap.get("state"))
                say(f"gate: state {last}")
        if alive is not None and not alive():
            return GateResult(False, last, "the container exited before a verdict")
        time.sleep(poll_s)
    return GateResult(False, last, f"no verdict within {timeout_s:.0f} s (last state: {last})")


# -- local: a GPU runner -------------------------------------------------------------------
def gate_local(image: str, target: Target, *, timeout_s: float, volume: str | None = None,
               docker: str = "docker", gpus: str = "all") -> GateResult:
    cfg = target.deploy_config()
    name = f"kiln-gate-{target.name}-{os.getpid()}"
    argv = [docker, "run", "-d", "--name", name, "-p", f"127.0.0.1::{cfg.status.port}"]
    if gpus:
        argv += ["--gpus", gpus]
    for key in SECRET_ENV:
        if os.environ.get(key):
            argv += ["-e", key]
    if volume:
        argv += ["-v", f"{volume}:{target.runpod.volume_mount}"]
    argv.append(image)
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise GateFailed(f"docker run {image} failed: {r.stderr.strip()[:300]}")
    try:
        published = subprocess.run([docker, "port", name, str(cfg.status.port)], capture_output=True, text=True,
                                   check=False)
        if published.returncode != 0 or not published.stdout.split():
            # The container exited at once (an image with no supervisor) or the engine publishes no ports.
            _print_logs(docker, name)
            return GateResult(False, "", f"no status port {cfg.status.port} to read the verdict from: "
                              f"{published.stderr.strip()[:300] or 'docker port printed nothing'}")
        port = published.stdout.split()[0].rsplit(":", 1)[1]

        def alive() -> bool:
            out = subprocess.run([docker, "inspect", "-f", "{{.State.Running}}", name], capture_output=True,
                                 text=True, check=False)
            return out.stdout.strip() == "true"

        verdict = wait_verdict(f"http://127.0.0.1:{port}", timeout_s=timeout_s, alive=alive)
        if not verdict.passed:
            _print_logs(docker, name)
        return verdict
    finally:
        subprocess.run([docker, "rm", "-f", name], capture_output=True, check=False)


def _print_logs(docker: str, name: str) -> None:
    logs = subprocess.run([docker, "logs", "--tail", "100", name], capture_output=True, text=True, check=False)
    print(logs.stdout + logs.stderr, file=sys.stderr)


# -- runpod: a pod from a staging template ------------------------------------------------
def gate_runpod(api: RunPodAPI, template: RunPodTemplate, target: Target, *, timeout_s: float,
                pod_name: str, proxy: str | None = None, cloud: str = "SECURE") -> GateResult:
    """Check the catalog, upsert the staging template, create one pod from it, wait, terminate."""
    cfg = target.deploy_config()
    placement = pods.Placement.of(target, cloud=cloud) if target.is_gpu else None
    if placement is None:
        raise GateFailed(f"{target.name} is a CPU target: the RunPod gate runs GPU images")
    floor = cuda_floor(target)
    if floor:
        pods.check_catalog(api, placement, floor)
    result = upsert(api, template.body)
    print(f"gate: template {result.name} {result.action} ({result.template_id})", file=sys.stderr)
    req = pods.UpRequest(target=target, template=template, placement=placement, proxy=proxy)
    pod = api.create_pod(pods.pod_body(req, pod_name[:191], result.template_id, None))
    pod_id = str(pod.get("id") or "")
    if not pod_id:
        raise GateFailed("POST /v2/pods answered without a pod id")
    print(f"gate: pod {pod_id} created from template {result.template_id}", file=sys.stderr)
    try:
        return wait_verdict(pods.proxy_url(pod_id, cfg.status.port, proxy), timeout_s=timeout_s)
    finally:
        api.terminate_pod(pod_id)
        print(f"gate: pod {pod_id} terminated", file=sys.stderr)
