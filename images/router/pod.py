"""The router pod of `pods up --target T --replicas N --router`: a small CPU pod from the router target
(images/targets/router.toml: smg under Kiln's supervisor) in front of T's replicas, named
kiln-<T>-router so `pods status --target T` shows it and `pods down --target T` removes it with them.

How it reaches the replicas. RunPod's global networking (pods at <podId>.runpod.internal, no port
to expose) is "currently only available for NVIDIA GPU Pods" (runpod/docs pods/networking.mdx; the
v2 schema's CreatePodRequest.globalNetworking: "Requires an NVIDIA GPU"), and a router needs no GPU:
renting one to route would cost a GPU's hourly rate. So the router talks to each replica
    - its API over the replica's TCP port (the supervisor relays 8082/tcp to the engine: no HTTP
      proxy, so no ~100-125 s cut on a long prefill), at the public IP and mapped port RunPod
      reports once the pod runs;
    - its readiness over RunPod's HTTPS proxy (https://<podId>-8081.proxy.runpod.net/ready: short
      requests, TLS).
The TCP hop is plain HTTP across the internet, as the replicas' own TCP endpoints already are: the
key (Bearer) travels in clear on it. Pods on COMMUNITY cloud may have no public IP; `up --router`
refuses then, naming the pod.

The replicas' addresses are known only once they run, so the router is created after they are
ready, with them in its environment (KILN_ROUTER_REPLICAS). A second `up --router` keeps a live
router whose list is still right and replaces one whose list is not (a replica added, replaced or
moved to another port).
"""

from __future__ import annotations

from typing import Any, Callable

import requests

from supervisor.errors import KilnError

from ..runpod.api import RunPodAPI
from ..runpod.pods import (LIVE, TARGET_ENV, PodReport, UpRequest, endpoints, kiln_pods, pod_prefix, proxy_url,
                           wait_ready)
from ..runpod.template import upsert
from ..target import Target

ROUTER_TARGET = "router"
REPLICAS_ENV = "KILN_ROUTER_REPLICAS"
# CreatePodRequest.cpu: the flavor id RunPod's v2 document gives as its example (BaseCpuConfig.id
# "cpu5c"), and the least vCPUs it allows (vcpuCount minimum 2). Check GET /v2/catalog/cpus for yours.
DEFAULT_CPU_FLAVOR = "cpu5c"
DEFAULT_VCPU = 2


def router_name(target_name: str) -> str:
    return f"{pod_prefix(target_name)}router"


def replicas_value(target: Target, pods: list[dict[str, Any]], proxy: str | None = None) -> str:
    """KILN_ROUTER_REPLICAS for these replica pods (RUNNING, their runtime ports known): each entry
    API-over-TCP|status-over-proxy."""
    status_port = target.deploy_config().status.port
    entries = []
    for pod in sorted(pods, key=lambda p: str(p.get("name"))):
        ep = endpoints(target, pod, proxy)
        if ep.tcp is None:
            raise KilnError(f"replica {pod.get('name')} ({pod.get('id')}) has no public IP and mapped TCP port "
                            f"(its {target.deploy_config().server.tcp_port}/tcp): the router reaches replicas over "
                            "it. Deploy the replicas on SECURE cloud, or run the router yourself "
                            "(`python build.py router --replicas ...`)")
        entries.append(f"{ep.tcp.removesuffix('/v1')}|{proxy_url(str(pod['id']), status_port, proxy)}/ready")
    return " ".join(entries)


def router_body(name: str, template_id: str, replicas: str, *, cpu_flavor: str, vcpu: int, cloud: str,
                data_centers: tuple[str, ...] = (), target_name: str | None = None) -> dict[str, Any]:
    """The router pod's CreatePodRequest, deployed by templateId (a CPU pod). It belongs to its
    replicas' target (KILN_TARGET), so `down --target T` removes it with them."""
    env = {REPLICAS_ENV: replicas, **({TARGET_ENV: target_name} if target_name else {})}
    body: dict[str, Any] = {"name": name, "templateId": template_id, "cloud": cloud,
                            "cpu": {"id": cpu_flavor, "vcpuCount": vcpu}, "env": env}
    if data_centers:
        body["dataCenterIds"] = list(data_centers)
    return body


def routes(snap: dict[str, Any] | None, replicas: list[dict[str, Any]]) -> str:
    """What a router's /status says it routes to, by replica pod name."""
    if not snap:
        return "no answer"
    section = snap.get("router") or {}
    rows = section.get("replicas") or []
    names = {str(p.get("id")): str(p.get("name")) for p in replicas}

    def name_of(row: dict[str, Any]) -> str:
        return next((n for pid, n in names.items() if f"{pid}-" in str(row.get("status_url"))), str(row.get("url")))

    routed = [name_of(r) for r in rows if r.get("routed")]
    out = [name_of(r) for r in rows if not r.get("routed")]
    text = f"routes to {len(routed)} of {len(rows)} replica(s)" + (f": {', '.join(routed)}" if routed else "")
    if out:
        text += f"; not routed: {', '.join(out)}"
    return text


def up(api: RunPodAPI, req: UpRequest, *, replica_target: Target, replicas: list[dict[str, Any]], cpu_flavor: str,
       vcpu: int, say: Callable[[str], None], session: requests.Session | None = None) -> PodReport:
    """The router pod in front of `replicas` (running, ready): kept when live with this list and this
    image, else (re)created; then waited on like a replica (its /ready: a replica routed)."""
    want = replicas_value(replica_target, replicas, req.proxy)
    tpl = upsert(api, req.template.body)
    say(f"template {tpl.name}: {tpl.action} ({tpl.template_id})")
    name = router_name(replica_target.name)
    keep = None
    for p in kiln_pods(api.pods(), replica_target.name):
        if p.get("name") != name or p.get("status") not in LIVE:
            continue
        same = (p.get("env") or {}).get(REPLICAS_ENV) == want and p.get("image") == req.template.body["image"]
        if keep is None and same:
            keep = p
            continue
        api.terminate_pod(str(p["id"]))
        say(f"router {name} ({p['id']}): its replicas or image are not the current ones: terminated, a new one follows")
    if keep is None:
        p = req.placement
        pod = api.create_pod(router_body(name, tpl.template_id, want, cpu_flavor=cpu_flavor, vcpu=vcpu,
                                         target_name=replica_target.name,
                                         cloud=p.cloud, data_centers=p.data_centers))
        pod_id = str(pod["id"])
        say(f"router {name}: created ({pod_id}, {pod.get('status')}) in front of {len(replicas)} replica(s)")
    else:
        pod_id = str(keep["id"])
        say(f"router {name} ({pod_id}): already live in front of these replicas")
    (report,) = wait_ready(api, [pod_id], req, say, session or requests.Session())
    return report


def is_router(pod: dict[str, Any]) -> bool:
    return str(pod.get("name", "")).endswith("-router")
