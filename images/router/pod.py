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
router: when its replicas changed (one added, replaced, moved to another port) it hands the router
the new list in place (PUT /kiln/router/replicas on the router's own URL, with its operator key:
supervisor/router/control.py), since a pod's environment cannot change after it is created (the v2
API has no pod update). The URL stays; the old replicas drain, their requests in flight finish. The
operator key is not the one clients send: $KILN_OPERATOR_KEY here, the value of the RunPod secret
kiln_operator_key (the router pod gets it as that secret's reference). Without it, `up` refuses before
renting a replica when a live router would need the new list (images/cli/pods.py). Only a router of another image is replaced: a new pod
first, the old one terminated once the new one is ready, and one line says the URL moved (old, new).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping

import requests

from supervisor.errors import KilnError

from ..fleet import probe
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


def entries(value: str) -> set[tuple[str, str]]:
    """KILN_ROUTER_REPLICAS as (API URL, status URL) pairs."""
    return {(url.rstrip("/"), status) for url, _, status in (e.partition("|") for e in value.split())}


def routed_list(snap: dict[str, Any] | None) -> set[tuple[str, str]] | None:
    """The replicas a router's /status says it works with (whether routed or not), or None."""
    rows = ((snap or {}).get("router") or {}).get("replicas")
    return {(str(r.get("url")).rstrip("/"), str(r.get("status_url"))) for r in rows} if isinstance(rows, list) else None


def operator_key(target: Target, env: Mapping[str, str]) -> tuple[str | None, str]:
    """(the router's operator key from this machine's environment, where to find it). Only the operator
    key changes where traffic goes (supervisor/router/control.py); the clients' key never does."""
    ref = target.deploy_config().router.operator_key.partition(":")[2]
    secret = dict(target.runpod.secrets).get(ref)
    where = f"export {ref} (the value of your RunPod secret {secret!r}: the operator's key, not the one clients " \
            "send)" if secret else f"export {ref} (the router's operator key, not the one clients send)"
    return (env.get(ref) or None), where


def push(url: str, value: str, key: str, session: requests.Session) -> None:
    """The router's new replica list, in place (supervisor/router/control.py); KilnError with its answer."""
    try:
        r = session.put(url + "/kiln/router/replicas", json={"replicas": value}, timeout=60,
                        headers={"Authorization": f"Bearer {key}", "Connection": "close"})
    except requests.RequestException as e:
        raise KilnError(f"the router at {url} did not take its new replicas: {type(e).__name__}") from None
    if r.status_code != 200:
        try:
            said = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            said = r.text[:200]
        raise KilnError(f"the router at {url} refused its new replicas ({r.status_code}): {said}")


def up(api: RunPodAPI, req: UpRequest, *, replica_target: Target, replicas: list[dict[str, Any]], cpu_flavor: str,
       vcpu: int, say: Callable[[str], None], session: requests.Session | None = None,
       env: Mapping[str, str] | None = None) -> PodReport:
    """The router pod in front of `replicas` (running, ready): a live one of this image is kept, and
    given the new list in place when its replicas changed; else one is created (and one of another
    image terminated once it is ready). Then waited on like a replica (its /ready: a replica routed)."""
    session = session or requests.Session()
    want = replicas_value(replica_target, replicas, req.proxy)
    tpl = upsert(api, req.template.body)
    say(f"template {tpl.name}: {tpl.action} ({tpl.template_id})")
    name = router_name(replica_target.name)
    live = [p for p in kiln_pods(api.pods(), replica_target.name) if p.get("name") == name and p.get("status") in LIVE]
    keep = next((p for p in live if p.get("image") == req.template.body["image"]), None)
    cfg = req.target.deploy_config()
    if keep is None:
        p = req.placement
        pod = api.create_pod(router_body(name, tpl.template_id, want, cpu_flavor=cpu_flavor, vcpu=vcpu,
                                         target_name=replica_target.name,
                                         cloud=p.cloud, data_centers=p.data_centers))
        pod_id = str(pod["id"])
        say(f"router {name}: created ({pod_id}, {pod.get('status')}) in front of {len(replicas)} replica(s)")
    else:
        pod_id = str(keep["id"])
        status_url = proxy_url(pod_id, cfg.status.port, req.proxy)
        now = routed_list(probe.read_status(status_url, session, timeout=10))
        if now is None:                  # no answer yet: the list it was created with
            now = entries((keep.get("env") or {}).get(REPLICAS_ENV, ""))
        if now == entries(want):
            say(f"router {name} ({pod_id}): already live in front of these replicas")
        else:
            key, where = operator_key(req.target, os.environ if env is None else env)
            if key is None:
                raise KilnError(f"router {name} ({pod_id}) is live in front of other replicas: it takes the new list "
                                f"in place, on its own URL, with its operator key: {where} and run this again (the "
                                f"replicas are up). Or `python build.py pods down --pod {pod_id}` first: a new "
                                "router, a new URL")
            push(proxy_url(pod_id, cfg.server.port, req.proxy), want, key, session)
            _wait_list(status_url, entries(want), req, session)
            say(f"router {name} ({pod_id}): its replicas changed in place ({len(replicas)} now); its URL stays "
                f"{proxy_url(pod_id, cfg.server.port, req.proxy)}/v1")
    (report,) = wait_ready(api, [pod_id], req, say, session)
    for old in (p for p in live if p is not keep):
        old_url, new_url = proxy_url(str(old["id"]), cfg.server.port, req.proxy), proxy_url(pod_id, cfg.server.port,
                                                                                           req.proxy)
        if not report.ready:
            say(f"router {name} ({old['id']}): kept ({old_url}/v1) while its successor {pod_id} is not ready")
            continue
        api.terminate_pod(str(old["id"]))
        say(f"router {name}: another image needs another pod: its URL moves from {old_url}/v1 to {new_url}/v1 "
            f"({old['id']} terminated)")
    return report


def _wait_list(status_url: str, want: set[tuple[str, str]], req: UpRequest, session: requests.Session) -> None:
    """Until the router's /status works with the new list (its feeder's next round)."""
    deadline = time.monotonic() + req.timeout_s
    while routed_list(probe.read_status(status_url, session, timeout=10)) != want:
        if time.monotonic() > deadline:
            raise KilnError(f"the router took its new replicas but its /status ({status_url}/status) did not show "
                            f"them within {req.timeout_s:g} s")
        time.sleep(req.poll_s)           # a poll interval between two reads of /status


def is_router(pod: dict[str, Any]) -> bool:
    return str(pod.get("name", "")).endswith("-router")
