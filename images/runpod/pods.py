"""Pods from a target's template: up, status, logs, down. Nothing here stops a pod.

    up       read the catalog first: refuse, naming what is on offer, when no host of the GPU
             type reports a CUDA version the image runs on (cuda_floor) -- before anything is
             created. Then upsert the template, create or reuse the network volume, create the
             missing replicas (kiln-<target>-<n>), and wait on each pod's supervisor through
             RunPod's proxy (/status for progress, /ready for the verdict).
             Interrupted, it says which pods it created and the `down` that removes them (billed_lines).
    status   Kiln's pods (owner(): the target each belongs to), what each supervisor says, what it costs.
    logs     a pod's log lines (RunPod's SSE stream).
    down     terminate (DELETE /v2/pods/{id}), never stop: a stopped pod's volume bills at twice
             the running rate and pins the pod to its host (field notes § "Terminate, never stop").

Idempotent: a second `up` with the same replicas finds them live and creates nothing.

Which pods are a target's (owner): the KILN_TARGET=<target> that `up` puts in each pod's env at
creation (RunPod's Pod object returns its env: `Pod` requires `env` in the vendored v2 schema);
a pod without it (made before Kiln set it) by its whole name, kiln-<target>-<n>, n a positive
integer. Never a name prefix: kiln-a40-llamacpp- also begins every pod of a40-llamacpp-upstream.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import requests

from supervisor import deploy_env
from supervisor.errors import KilnError

from ..deployment import carried_text
from ..fleet import probe
from ..target import Target
from . import volumes
from .api import RunPodAPI
from .cuda import compatible, cuda_floor
from .template import RunPodTemplate, UpsertResult, upsert

NAME_PREFIX = "kiln-"
# kiln-<target>-<n>: the target is everything between, so a40-llamacpp-upstream-1 is never a40-llamacpp's
POD_NAME = re.compile(r"kiln-(?P<target>.+)-(?P<n>[1-9][0-9]*)")
TARGET_ENV = "KILN_TARGET"      # in each pod's env, set at creation: the target it belongs to
LIVE = ("PROVISIONING", "STARTING", "RUNNING")
CLOUDS = ("SECURE", "COMMUNITY")
# RunPod's HTTP proxy (docs: pods/configuration/expose-ports). $RUNPOD_PROXY_URL replaces it
# (tests route it to supervisors on loopback); {pod_id} and {port} are filled in.
PROXY_URL = "https://{pod_id}-{port}.proxy.runpod.net"

Say = Callable[[str], None]


class NoMatchingHost(KilnError):
    """RunPod's catalog offers no host the image can run on: nothing was created."""


def pod_name(target_name: str, n: int) -> str:
    return f"{NAME_PREFIX}{target_name}-{n}"


def pod_prefix(target_name: str) -> str:
    """kiln-<target>-: the start of every pod name of a target (never enough alone to own a pod: owner)."""
    return f"{NAME_PREFIX}{target_name}-"


def owner(pod: dict[str, Any]) -> str | None:
    """The target a pod belongs to, or None when it is not Kiln's: its env's KILN_TARGET, else
    (a pod made before Kiln set it) its whole name kiln-<target>-<n>."""
    env = pod.get("env")
    marker = env.get(TARGET_ENV) if isinstance(env, dict) else None
    if isinstance(marker, str) and marker:
        return marker
    m = POD_NAME.fullmatch(str(pod.get("name", "")))
    return m.group("target") if m else None


def is_router(pod: dict[str, Any]) -> bool:
    """kiln-<target>-router: the router in front of a target's replicas (its KILN_TARGET is theirs)."""
    return str(pod.get("name", "")).endswith("-router")


def is_replica(pod: dict[str, Any], target_name: str) -> bool:
    """One of the target's serving pods (kiln-<target>-<n>), not the router in front of them."""
    return owner(pod) == target_name and not is_router(pod)


def proxy_url(pod_id: str, port: int, base: str | None = None) -> str:
    return (base or os.environ.get("RUNPOD_PROXY_URL") or PROXY_URL).format(pod_id=pod_id, port=port)


@dataclass(frozen=True)
class Placement:
    """What `up` rents: a GPU type and count (or a CPU flavor), the cloud, preferred data centers."""
    gpu_id: str | None
    gpu_count: int = 1
    cloud: str = "SECURE"
    data_centers: tuple[str, ...] = ()
    cpu_flavor: str | None = None
    vcpu: int | None = None

    @classmethod
    def of(cls, target: Target, *, gpu_id: str | None = None, gpu_count: int | None = None,
           cloud: str = "SECURE", data_centers: tuple[str, ...] = (), cpu_flavor: str | None = None,
           vcpu: int | None = None) -> "Placement":
        if cloud not in CLOUDS:
            raise KilnError(f"--cloud {cloud!r}: RunPod's clouds are {', '.join(CLOUDS)}")
        if target.is_gpu:
            if cpu_flavor:
                raise KilnError(f"--cpu-flavor: {target.name} is a GPU target ([cuda] is set)")
            count = target.runpod.gpu_count if gpu_count is None else gpu_count
            if count < 1:
                raise KilnError(f"--gpu-count {count}: a GPU pod has at least 1 GPU")
            return cls(gpu_id or target.runpod.gpu_type, count, cloud, data_centers)
        if gpu_id:
            raise KilnError(f"--gpu: {target.name} is a CPU target ([cuda] unset): it rents no GPU")
        if not cpu_flavor or not vcpu:
            raise KilnError(f"{target.name} is a CPU target: give --cpu-flavor (an id from RunPod's CPU catalog, "
                            "GET /v2/catalog/cpus) and --vcpu (a power of two, at least 2)")
        return cls(None, 0, cloud, data_centers, cpu_flavor, vcpu)


@dataclass(frozen=True)
class Offer:
    """The catalog's answer for a placement: the CUDA versions usable now and the list price."""
    gpu_id: str
    cuda_versions: tuple[str, ...]      # host versions >= the floor with free capacity now
    price_per_gpu_hour: float | None    # catalog list price for the cloud (the billed rate is the pod's cost)


def _describe_offer(entry: dict[str, Any]) -> str:
    offered = entry.get("cudaVersions") or []
    if not offered:
        return "no CUDA version reported"
    return ", ".join(f"{v.get('version')} ({'available' if v.get('available') else 'full'})" for v in offered)


def check_catalog(api: RunPodAPI, placement: Placement, floor: str) -> Offer:
    """Refuse, naming what is on offer, unless a host of the GPU type reports a CUDA version >= floor
    with capacity now (in the wanted data centers, when given)."""
    gpus = api.gpu_types(count=placement.gpu_count, cloud=placement.cloud)
    entry = next((g for g in gpus if g.get("id") == placement.gpu_id), None)
    where = f"{placement.gpu_count}x, {placement.cloud} cloud"
    if entry is None:
        ids = sorted(str(g.get("id")) for g in gpus)
        raise NoMatchingHost(f"RunPod's catalog lists no GPU type {placement.gpu_id!r} for pods ({where}); "
                             f"on offer: {', '.join(ids) or 'nothing'}")
    usable = compatible(entry.get("cudaVersions") or [], floor)
    if not usable:
        raise NoMatchingHost(f"no {placement.gpu_id} host ({where}) reports a CUDA version this image runs on "
                             f"(>= {floor}); on offer: {_describe_offer(entry)}. Nothing was created: choose "
                             "another --gpu or --cloud, or an image built for an older CUDA")
    available = [str(v["version"]) for v in usable if v.get("available")]
    if not available:
        raise NoMatchingHost(f"{placement.gpu_id} hosts with CUDA >= {floor} exist ({where}) but are all full now; "
                             f"on offer: {_describe_offer(entry)}. Nothing was created: retry later, or another "
                             "--gpu or --cloud")
    if placement.data_centers:
        centres = {str(d.get("id")): str(d.get("availability")) for d in entry.get("dataCenters") or []}
        if not any(centres.get(dc, "NONE") != "NONE" for dc in placement.data_centers):
            offered = ", ".join(f"{k} ({v})" for k, v in sorted(centres.items()) if v != "NONE") or "none"
            raise NoMatchingHost(f"{placement.gpu_id} ({where}) has no capacity in {', '.join(placement.data_centers)}; "
                                 f"data centers with capacity: {offered}. Nothing was created")
    price = (entry.get("price") or {}).get(placement.cloud.lower())
    return Offer(str(entry["id"]), tuple(available), float(price) if isinstance(price, (int, float)) else None)


@dataclass(frozen=True)
class UpRequest:
    target: Target
    template: RunPodTemplate
    placement: Placement
    replicas: int = 1
    network_volume: str | None = None        # name: created (in the one data center) or reused
    network_volume_gb: int = 0
    terminate_on_failure: bool = False       # the pods' supervisors terminate themselves when FAILED
    timeout_s: float = 3600.0
    poll_s: float = 5.0
    proxy: str | None = None
    # The deploy config the pods serve when it is not the image's own (`up --config FILE`): its text,
    # put in each pod's env as KILN_DEPLOY_CONFIG (deployment.py); None: the image's baked default.
    config_text: str | None = None
    replace: bool = False                    # live pods of another image or config are terminated first


@dataclass
class PodReport:
    id: str
    name: str
    ready: bool = False
    line: str = ""                 # the last progress line
    failure: str | None = None
    pod: dict[str, Any] = field(default_factory=dict)


@dataclass
class Made:
    """What an `up` has created so far, kept as it goes: an interrupted `up` says what bills and how
    to end it (billed_lines), since nothing else would remember the pods it just rented."""
    pods: list[tuple[str, str]] = field(default_factory=list)     # (id, name), in creation order
    creating: str | None = None                                   # a pod whose create request was in flight
    volume: volumes.Volume | None = None                          # a network volume this `up` created


def billed_lines(made: Made, target: str, prog: str = "python build.py") -> list[str]:
    """What an interrupted `up` created that bills, and the exact commands that remove it."""
    lines = []
    if made.pods:
        lines.append(f"`up` was interrupted after creating {len(made.pods)} pod(s), which bill until terminated: "
                     + ", ".join(f"{name} ({pid})" for pid, name in made.pods))
        lines.append("  " + " ".join([prog, "pods", "down", *(f"--pod {pid}" for pid, _ in made.pods)]))
    if made.creating:
        lines.append(f"pod {made.creating} was being created when `up` was interrupted: "
                     f"`{prog} pods status --target {target}` shows whether it exists")
    if made.volume is not None:
        lines.append(f"network volume {made.volume.name} ({made.volume.id}) was created and bills while it exists: "
                     f"`{prog} pods volumes --delete {made.volume.id}` removes it and its data")
    if not lines:
        lines.append("`up` was interrupted before it created a pod: nothing of it bills")
    return lines


@dataclass
class UpResult:
    template: UpsertResult
    created: list[str]
    reused: list[str]
    volume: volumes.Volume | None
    pods: list[PodReport]

    @property
    def ok(self) -> bool:
        return all(p.ready for p in self.pods)


def pod_body(req: UpRequest, name: str, template_id: str, volume: volumes.Volume | None) -> dict[str, Any]:
    """The CreatePodRequest for one replica, deployed by templateId."""
    p, target = req.placement, req.target
    body: dict[str, Any] = {"name": name, "templateId": template_id, "cloud": p.cloud}
    floor = cuda_floor(target)
    if p.gpu_id:
        body["gpu"] = {"id": p.gpu_id, "count": p.gpu_count}
        if floor:
            body["gpu"]["minCudaVersion"] = floor       # replaces the template's exact list: any newer host
    else:
        body["cpu"] = {"id": p.cpu_flavor, "vcpuCount": p.vcpu}
    data_centers = (volume.data_center,) if volume else p.data_centers
    if data_centers:
        body["dataCenterIds"] = list(data_centers)
    env: dict[str, str] = {TARGET_ENV: target.name}
    if req.config_text is not None:
        env[deploy_env.ENV] = deploy_env.encode(req.config_text)
    if volume:
        mount = target.runpod.volume_mount
        body["mounts"] = {"network": [{"volumeId": volume.id, "path": mount}]}
        # Each replica its own state directory on the shared volume: the next pod of the same
        # name finds its model cache, and no two live supervisors write one directory.
        env["KILN_STATE_DIR"] = f"{target.deploy_config().state_dir.rstrip('/')}/pods/{name}"
    if req.terminate_on_failure:
        env["KILN_RUNPOD_TERMINATE_ON_TERMINAL_FAILURE"] = "true"
    body["env"] = env
    return body


def kiln_pods(listed: list[dict[str, Any]], target: str | None = None) -> list[dict[str, Any]]:
    """Of the account's pods (api.pods()), Kiln's (each with an owner), or only `target`'s."""
    return sorted((p for p in listed if (owner(p) == target if target else owner(p) is not None)),
                  key=lambda p: str(p.get("name")))


def _volume_for(api: RunPodAPI, req: UpRequest, say: Say) -> volumes.Volume | None:
    if not req.network_volume:
        return None
    if not req.target.deploy_config().state_dir.startswith(req.target.runpod.volume_mount.rstrip("/") + "/"):
        raise KilnError(f"--network-volume: the deploy config's state_dir is not under volume_mount "
                        f"{req.target.runpod.volume_mount}: the model cache would not be on the volume")
    size = req.network_volume_gb or req.target.runpod.volume_gb or volumes.MIN_GB
    vol = volumes.ensure(api, req.network_volume, size, req.placement.data_centers)
    say(f"network volume {vol.name}: {vol.action} ({vol.id}, {vol.size_gb} GB in {vol.data_center}); it bills "
        "while it exists, pods or not")
    return vol


def up(api: RunPodAPI, req: UpRequest, say: Say, session: requests.Session | None = None,
       made: Made | None = None) -> UpResult:
    """`made` is filled as pods (and a volume) are created, for a caller interrupted meanwhile."""
    made = Made() if made is None else made
    target = req.target
    if req.replicas < 1:
        raise KilnError(f"--replicas {req.replicas}: at least 1")
    floor = cuda_floor(target)
    offer = check_catalog(api, req.placement, floor) if req.placement.gpu_id and floor else None
    if offer:
        rate = f", list price ${offer.price_per_gpu_hour:.2f}/GPU/h" if offer.price_per_gpu_hour is not None else ""
        say(f"catalog: {offer.gpu_id} hosts with CUDA {', '.join(offer.cuda_versions)} have capacity "
            f"(image needs >= {floor}){rate}")
    everything = api.pods()
    existing = [p for p in kiln_pods(everything, target.name) if not is_router(p)]
    live = [p for p in existing if p.get("status") in LIVE]
    other = {str(p["id"]): why for p in live if (why := _differs(p, req))}
    if other and not req.replace:          # before anything is created or changed
        raise KilnError("live pods of " + target.name + " serve something else than this `up` asks for: "
                        + "; ".join(f"{_pod_label(p)} {other[str(p['id'])]}" for p in live if str(p["id"]) in other)
                        + ". Nothing was created or changed. Fix: `up ... --replace` terminates them and creates "
                        f"new ones, or `python build.py pods down --target {target.name}` first")
    tpl = upsert(api, req.template.body)
    say(f"template {tpl.name}: {tpl.action} ({tpl.template_id})")
    vol = _volume_for(api, req, say)
    if vol is not None and vol.action == "created":
        made.volume = vol
    if other:
        replaced = [p for p in live if str(p["id"]) in other]
        for p in replaced:
            say(f"pod {_pod_label(p)} {other[str(p['id'])]}: --replace terminates it")
        terminate(api, replaced, say)
        live = [p for p in live if str(p["id"]) not in other]
    for p in existing:
        if p.get("status") not in LIVE:
            say(f"pod {p.get('name')} ({p.get('id')}) is {p.get('status')}: not counted; it may still bill for "
                f"storage: `down --pod {p.get('id')}` terminates it")
    reused = [str(p["id"]) for p in live[:req.replicas]]
    if len(live) > req.replicas:
        extra = ", ".join(str(p.get("id")) for p in live[req.replicas:])
        say(f"{len(live) - req.replicas} live pod(s) beyond --replicas {req.replicas}, left as they are: {extra} "
            "(`down --pod ID` terminates one)")
    taken = {str(p.get("name")) for p in everything}     # no two pods of the account share a name
    created: list[str] = []
    index = 0
    for _ in range(req.replicas - len(live)):
        index += 1
        while pod_name(target.name, index) in taken:
            index += 1
        name = pod_name(target.name, index)
        taken.add(name)
        made.creating = name
        pod = api.create_pod(pod_body(req, name, tpl.template_id, vol))
        made.pods.append((str(pod["id"]), name))
        made.creating = None
        created.append(str(pod["id"]))
        say(f"pod {name}: created ({pod['id']}, {pod.get('status')})")
    if reused:
        say(f"{len(reused)} pod(s) already live: {', '.join(reused)}")
    reports = wait_ready(api, reused + created, req, say, session or requests.Session())
    return UpResult(tpl, created, reused, vol, reports)


def _pod_label(p: dict[str, Any]) -> str:
    return f"{p.get('name')} ({p.get('id')})"


def _differs(pod: dict[str, Any], req: UpRequest) -> str | None:
    """How a live pod differs from what `up` asks for (its image, its deploy config), or None."""
    image = req.template.body["image"]
    if pod.get("image") and pod.get("image") != image:
        return f"runs image {pod.get('image')}, this `up` asks for {image}"
    env = pod.get("env") if isinstance(pod.get("env"), dict) else {}
    have, want = carried_text(env), req.config_text
    if have != want:
        def name(text: str | None) -> str:
            return "the image's own deploy config" if text is None else \
                f"deploy config sha256 {hashlib.sha256(text.encode()).hexdigest()[:12]}"
        return f"serves {name(have)}, this `up` asks for {name(want)}"
    return None


def wait_ready(api: RunPodAPI, pod_ids: list[str], req: UpRequest, say: Say,
               session: requests.Session) -> list[PodReport]:
    """Wait until each pod's supervisor answers /ready, fails, or the deadline passes."""
    status_port = req.target.deploy_config().status.port
    reports = {pid: PodReport(pid, pid) for pid in pod_ids}
    deadline = time.monotonic() + req.timeout_s
    while True:
        pending = [r for r in reports.values() if not r.ready and r.failure is None]
        if not pending:
            break
        for r in pending:
            pod = api.pod(r.id)
            r.pod, r.name = pod, str(pod.get("name") or r.id)
            status = str(pod.get("status"))
            line = status
            if status in ("EXITED", "ERROR", "TERMINATED"):
                r.failure = f"the pod is {status}"
            elif status == "RUNNING":
                url = proxy_url(r.id, status_port, req.proxy)
                snap = probe.read_status(url, session, timeout=10)
                if snap is None:
                    line = "RUNNING, the supervisor does not answer yet"
                else:
                    line = probe.progress_line(snap)
                    if snap.get("state") == "FAILED":
                        r.failure = line
                    elif snap.get("ready") is True and probe.is_ready(url, session, timeout=10):
                        r.ready = True
            if line != r.line:
                r.line = line
                say(f"{r.name} ({r.id}): {line}")
        if all(r.ready or r.failure for r in reports.values()):
            break
        if time.monotonic() >= deadline:
            for r in reports.values():
                if not (r.ready or r.failure):
                    r.failure = f"not ready within {req.timeout_s:.0f} s (last: {r.line})"
            break
        time.sleep(req.poll_s)     # the polling interval of a condition wait with a deadline
    for r in reports.values():      # runtime ports (public IP, mapped TCP port) are set once RUNNING
        if r.ready:
            r.pod = api.pod(r.id)
    return list(reports.values())


@dataclass(frozen=True)
class Endpoints:
    http: str                      # the API through RunPod's HTTP proxy
    tcp: str | None                # the API at the public IP and mapped port (no proxy time limit)
    status: str


def endpoints(target: Target, pod: dict[str, Any], proxy: str | None = None) -> Endpoints:
    cfg = target.deploy_config()
    pid = str(pod["id"])
    tcp = None
    runtime = pod.get("runtime") if isinstance(pod.get("runtime"), dict) else {}
    for port in runtime.get("ports") or []:
        if port.get("private") == cfg.server.tcp_port and port.get("type") == "tcp" and port.get("ip") \
                and port.get("public"):
            tcp = f"http://{port['ip']}:{port['public']}/v1"
    return Endpoints(proxy_url(pid, cfg.server.port, proxy) + "/v1", tcp, proxy_url(pid, cfg.status.port, proxy))


def key_hint(target: Target) -> str:
    """How a client sends the key: the secret's name, never its value."""
    cfg = target.deploy_config()
    kind, _, ref = cfg.server.api_key.partition(":")
    if kind == "none":
        return "the API takes no key (server.api_key = \"none\")"
    secret = dict(target.runpod.secrets).get(ref) if kind == "env" else None
    where = f"the value of your RunPod secret {secret!r}" if secret else f"the key from {cfg.server.api_key}"
    return f"send the key as `Authorization: Bearer <{where}>`"


def terminate(api: RunPodAPI, pods: list[dict[str, Any]], say: Say) -> list[str]:
    """DELETE each pod (terminate; never stop); the ids that were terminated."""
    done = []
    for p in pods:
        if api.terminate_pod(str(p["id"])):
            done.append(str(p["id"]))
            rate = p.get("cost")
            say(f"pod {p.get('name')} ({p['id']}): terminated" + (f", ${rate:.2f}/h no longer billed"
                                                                   if isinstance(rate, (int, float)) else ""))
        else:
            say(f"pod {p.get('name')} ({p['id']}): already gone")
    return done
