"""`pods up|status|logs|down|volumes`: Kiln's pods on RunPod (REST API v2) from a target's template.

The arguments and the wiring of each command are here; what `up` does (catalog first, template,
volume, replicas, the wait on each supervisor's /ready), how pods are named and found, and
`down`'s terminate-never-stop are images/runpod/pods.py.

A --target that is not a target (images/targets/) and owns no pod, or a pod id the account does not
have, is exit 2 naming what there is: a typo never reads as "nothing to terminate" while the real
pods bill on. Ctrl-C during `up` says which pods it created and the `down` that removes them.

Every command reads RUNPOD_API_KEY from the environment (never an argument: argv is visible to
every process on the machine). `--api` / $RUNPOD_API_URL and `--proxy` / $RUNPOD_PROXY_URL point
at another API or proxy (tests: the stand-in in kiln_dev/runpod). No command stops a pod: `down`
terminates. Progress goes to stderr, results to stdout; exit 0, 1 when a pod did not become ready,
2 on a usage, configuration or API error (one line, nothing created after it).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from supervisor.errors import KilnError

from .. import deployment
from ..build import render
from ..pins.lock import load_lock, missing, pins_for
from ..router import pod as router_pod
from ..runpod import image_check, pods, precheck, volumes
from ..runpod.api import RunPodAPI
from ..runpod.template import build_template
from ..target import load_target
from . import command as opt
from .command import Command

EXIT_NOT_READY = 1


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _api(args: argparse.Namespace) -> RunPodAPI:
    key = os.environ.get("RUNPOD_API_KEY", "")
    if not key:
        raise KilnError("RUNPOD_API_KEY is not set: create an API key in RunPod's console (Settings > API Keys) "
                        "and export it (it is never taken as an argument)")
    return RunPodAPI(key, getattr(args, "api", None))


# -- arguments -----------------------------------------------------------------------------
def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api", metavar="URL", help="RunPod REST API v2 base URL (default: $RUNPOD_API_URL or "
                   "https://api.runpod.io/v2)")


def _template_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image", help="repository for the image's tag (default: the target's `image`)")
    opt.template_reference_options(p)
    p.add_argument("--allow-floating", action="store_true", help="deploy a target with unresolved pins "
                   "(its image is labelled floating)")


def config_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="the deploy config to serve (what `plan --write-config` writes; "
                   "images/deploy/ has the field notes' own): it travels in each pod's environment, no rebuild "
                   "(default: the image's own)")


def replace_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replace", action="store_true", help="live pods (a cluster) of this target that run another "
                   "image or deploy config are terminated and created anew (without it, `up` refuses and says "
                   "what differs)")


def _up_arguments(up: argparse.ArgumentParser) -> None:
    up.add_argument("--target", required=True)
    config_argument(up)
    replace_argument(up)
    up.add_argument("--replicas", type=int, default=1, help="how many pods (kiln-<target>-1..N; live ones "
                    "are kept, only the missing ones are created)")
    up.add_argument("--gpu", metavar="ID", help="RunPod GPU type id (default: the target's [runpod] gpu_type)")
    up.add_argument("--gpu-count", type=int, help="GPUs per pod (default: the target's [runpod] gpu_count)")
    up.add_argument("--cloud", default="SECURE", choices=pods.CLOUDS)
    up.add_argument("--data-center", action="append", default=[], metavar="DC",
                    help="preferred data center id (repeatable; exactly one to create a network volume)")
    up.add_argument("--network-volume", metavar="NAME", help="put the model cache on this network volume "
                    "(reused by name, else created): a terminated pod's successor does not download again")
    up.add_argument("--network-volume-gb", type=int, default=0, help="size of a new network volume "
                    "(default: the target's volume_gb)")
    up.add_argument("--terminate-on-failure", action="store_true", help="each pod's supervisor terminates "
                    "its own pod after a grace period when it can never serve ([runpod] "
                    "terminate_on_terminal_failure)")
    up.add_argument("--router", action="store_true", help="also run the router (the `router` target's image: "
                    "smg, prefix-aware, fed by the replicas' /ready) on a CPU pod kiln-<target>-router, reaching "
                    "the replicas over their TCP port: one URL and one key for all of them")
    up.add_argument("--router-cpu-flavor", metavar="ID", default=router_pod.DEFAULT_CPU_FLAVOR,
                    help=f"the router pod's CPU flavor (default {router_pod.DEFAULT_CPU_FLAVOR}, RunPod's own "
                    "example id; GET /v2/catalog/cpus lists them)")
    up.add_argument("--router-vcpu", type=int, default=router_pod.DEFAULT_VCPU,
                    help=f"the router pod's vCPUs (default {router_pod.DEFAULT_VCPU}, RunPod's least)")
    up.add_argument("--cpu-flavor", metavar="ID", help="CPU targets: a flavor id from GET /v2/catalog/cpus")
    up.add_argument("--vcpu", type=int, help="CPU targets: vCPUs (a power of two, at least 2)")
    up.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for every pod to be ready")
    up.add_argument("--poll", type=float, default=5.0, help="seconds between status reads")
    up.add_argument("--proxy", metavar="PATTERN", help="proxy URL pattern with {pod_id} and {port} "
                    f"(default: $RUNPOD_PROXY_URL or {pods.PROXY_URL})")
    _template_options(up)
    opt.verify_options(up)
    _common(up)


def _status_arguments(st: argparse.ArgumentParser) -> None:
    st.add_argument("--target", help="only this target's pods (KILN_TARGET=<target> in their env, or "
                    "named kiln-<target>-<n>)")
    st.add_argument("--proxy", metavar="PATTERN")
    st.add_argument("--no-probe", action="store_true", help="do not ask each supervisor's /status")
    _common(st)


def _logs_arguments(lg: argparse.ArgumentParser) -> None:
    lg.add_argument("pod", help="pod id or name")
    lg.add_argument("--tail", type=int, default=100, help="lines of backfill (RunPod: at most 5000)")
    lg.add_argument("--source", choices=("container", "system"))
    lg.add_argument("--idle", type=float, default=3.0, help="stop after this many quiet seconds")
    _common(lg)


def _down_arguments(dn: argparse.ArgumentParser) -> None:
    which = dn.add_mutually_exclusive_group(required=True)
    which.add_argument("--target", help="every pod of this target (KILN_TARGET=<target> in its env, or "
                       "named kiln-<target>-<n>; never another target's whose name begins the same)")
    which.add_argument("--pod", action="append", metavar="ID", help="this pod (repeatable)")
    which.add_argument("--all", action="store_true", help="every Kiln pod, of any target")
    _common(dn)


def _volumes_arguments(vo: argparse.ArgumentParser) -> None:
    vo.add_argument("--delete", metavar="ID",
                    help="delete this network volume and its data (refused while an endpoint or a pod mounts it)")
    _common(vo)


# -- commands ------------------------------------------------------------------------------
def _template(args: argparse.Namespace, target, pins):
    tpl = build_template(target, pins, repository=args.image, image=args.image_ref,
                         name=args.template_name, registry=args.registry_auth)
    if tpl.floating and not args.image_ref and not args.allow_floating:
        raise render.FloatingRefused(target, [f for f in missing(target, pins)])
    return tpl


def cmd_up(args: argparse.Namespace) -> int:
    if args.target == router_pod.ROUTER_TARGET:
        raise KilnError("--target router: the router runs in front of another target's replicas: "
                        "`pods up --target T --replicas N --router`")
    key = opt.verify_key(args)
    dep = deployment.load(args.target, args.config, gpu=args.gpu, count=args.gpu_count)
    target = dep.target
    if target.runpod.is_cluster:
        what = f"{dep.describe()} spans {target.runpod.nodes} nodes" if dep.given else \
            f"a cluster target ([runpod] nodes = {target.runpod.nodes})"
        again = f" --config {args.config}" if dep.given else ""
        raise KilnError(f"--target {target.name}: {what}: one pod cannot hold it; "
                        f"`python build.py cluster up --target {target.name}{again}`")
    lock = load_lock()
    pins = pins_for(target, lock)
    router_req = None
    if args.router:          # everything the router needs is checked before any pod is created
        rtarget = load_target(router_pod.ROUTER_TARGET)
        rtpl = build_template(rtarget, pins_for(rtarget, lock), repository=args.image, registry=args.registry_auth)
        if rtpl.floating and not args.allow_floating:
            raise render.FloatingRefused(rtarget, list(missing(rtarget, pins_for(rtarget, lock))))
        router_req = pods.UpRequest(target=rtarget, template=rtpl, placement=pods.Placement.of(
            rtarget, cloud=args.cloud, data_centers=tuple(args.data_center), cpu_flavor=args.router_cpu_flavor,
            vcpu=args.router_vcpu), timeout_s=args.timeout, poll_s=args.poll, proxy=args.proxy)
    placement = pods.Placement.of(target, gpu_id=args.gpu, gpu_count=args.gpu_count, cloud=args.cloud,
                                  data_centers=tuple(args.data_center), cpu_flavor=args.cpu_flavor, vcpu=args.vcpu)
    template = _template(args, target, pins)
    verdict = precheck.check(dep, precheck.PodShape(placement.gpu_id, placement.gpu_count, 1, dep.gpu_from,
                                                    dep.count_from))
    refuse_unless_ok(verdict, dep, template.body["image"], key)
    req = pods.UpRequest(target=target, template=template, placement=placement,
                         replicas=args.replicas, network_volume=args.network_volume,
                         network_volume_gb=args.network_volume_gb, terminate_on_failure=args.terminate_on_failure,
                         timeout_s=args.timeout, poll_s=args.poll, proxy=args.proxy, config_text=dep.text,
                         replace=args.replace)
    made = pods.Made()
    api = _api(args)
    if router_req is not None:
        _operator_key_first(api, target, router_req.target, args.replicas)
    try:
        result = pods.up(api, req, say, made=made)
    except (KeyboardInterrupt, SystemExit):     # Ctrl-C, or TERM (app.py raises SystemExit for it)
        for line in pods.billed_lines(made, target.name):
            say(line)
        raise
    for r in result.pods:
        if not r.ready:
            print(f"{r.name} ({r.id}): NOT READY: {r.failure}; see `python build.py pods logs {r.id}`, "
                  f"then `python build.py pods down --pod {r.id}`")
            continue
        ep = pods.endpoints(target, r.pod, args.proxy)
        cost = r.pod.get("cost")
        print(f"{r.name} ({r.id}): ready: {r.line}" + (f"; ${cost:.2f}/h" if isinstance(cost, (int, float)) else ""))
        print(f"  API over RunPod's HTTP proxy (100 s per request): {ep.http}")
        print(f"  API over TCP (no proxy limit): {ep.tcp or 'no public IP / TCP port mapped'}")
        print(f"  status: {ep.status}/status")
    if result.pods:
        print(pods.key_hint(target))
        total = sum(r.pod.get("cost") or 0 for r in result.pods if isinstance(r.pod.get("cost"), (int, float)))
        print(f"{len(result.pods)} pod(s), ${total:.2f}/h while they exist: "
              f"`python build.py pods down --target {target.name}` terminates them")
    if router_req is None:
        return 0 if result.ok else EXIT_NOT_READY
    return _up_router(api, router_req, target, result, args) if result.ok or any(r.ready for r in result.pods) \
        else EXIT_NOT_READY


def _up_router(api, req, target, result, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    """The router pod in front of the ready replicas; its endpoints, and what it routes to."""
    import requests

    from ..fleet import probe

    ready = [r.pod for r in result.pods if r.ready]
    r = router_pod.up(api, req, replica_target=target, replicas=ready, cpu_flavor=args.router_cpu_flavor,
                      vcpu=args.router_vcpu, say=say)
    if not r.ready:
        print(f"{r.name} ({r.id}): router NOT READY: {r.failure}; see `python build.py pods logs {r.id}`")
        return EXIT_NOT_READY
    ep = pods.endpoints(req.target, r.pod, args.proxy)
    snap = probe.read_status(ep.status, requests.Session(), timeout=10)
    cost = r.pod.get("cost")
    print(f"{r.name} ({r.id}): router ready, {router_pod.routes(snap, ready)}"
          + (f"; ${cost:.2f}/h" if isinstance(cost, (int, float)) else ""))
    print(f"  one URL for all replicas, over RunPod's HTTP proxy (100 s per request): {ep.http}")
    print(f"  over TCP (no proxy limit): {ep.tcp or 'no public IP / TCP port mapped'}")
    print(f"  status: {ep.status}/status; requests name the model its /v1/models lists")
    return 0 if result.ok else EXIT_NOT_READY


def _operator_key_first(api: RunPodAPI, target, router_target, replicas: int) -> None:  # type: ignore[no-untyped-def]
    """A live router takes a changed replica list only with its operator key: without it on this machine,
    refused before any replica is created (was: the replica was rented first, then `up` stopped)."""
    listed = api.pods()
    name = router_pod.router_name(target.name)
    live_router = [p for p in listed if p.get("name") == name and p.get("status") in pods.LIVE]
    live = [p for p in pods.kiln_pods(listed, target.name) if not pods.is_router(p) and p.get("status") in pods.LIVE]
    if not live_router or len(live) >= replicas:
        return
    key, where = router_pod.operator_key(router_target, os.environ)
    if key is None:
        raise KilnError(f"router {name} ({live_router[0].get('id')}) is live and would take the new replicas in place, "
                        f"with its operator key: {where}, then run this again. Nothing was created")


def refuse_unless_ok(verdict: precheck.Verdict, dep: deployment.Deployment, image: str,  # type: ignore[no-untyped-def]
                     key=None) -> None:
    """Say what was checked; refuse, with every problem, when the pod would refuse what it is given, its
    image is not in its registry, or (`--verify`, `key` given) the image does not verify: unsigned, signed
    over another digest, its SBOM, provenance or gate verdict missing, made for another image, or failed.
    Nothing is rented before this passes."""
    for note in verdict.notes:
        say(f"note: {note}")
    found = image_check.check(image)
    if found.verdict != "missing":
        say(found.line)
    problems = verdict.problems + ([found.line] if found.verdict == "missing" else [])
    if key is not None and found.verdict != "missing":
        problems += _verify_image(image, key)
    if problems:
        raise KilnError(f"{dep.describe()} on the {dep.target.name} image: {len(problems)} problem(s); nothing "
                        "was rented:\n  - " + "\n  - ".join(problems))
    say(f"checked before renting: {dep.describe()} on the {dep.target.name} image")


def _verify_image(image: str, key) -> list[str]:  # type: ignore[no-untyped-def]
    from ..attest.verify import VerifyFailed, verify
    from ..registry import client_for, parse_ref

    try:
        done = verify(client_for(parse_ref(image).registry, timeout=30), image, key)
    except VerifyFailed as e:
        return [f"--verify: {p}" for p in e.problems]
    for line in done.lines:
        say(f"verified {line}")
    if parse_ref(image).digest is None:
        say(f"note: RunPod pulls {image} by its tag; --image-ref {done.name}@{done.digest} pins the digest verified "
            "here, so a tag moved later cannot swap it")
    return []


def cmd_status(args: argparse.Namespace) -> int:
    import requests

    from ..fleet import probe

    api = _api(args)
    listed = api.pods()
    if args.target:
        _known_target(args.target, listed)
    found = pods.kiln_pods(listed, args.target)
    if not found:
        print("no Kiln pods")
        return 0
    session = requests.Session()
    total = 0.0
    for p in found:
        gpu = p.get("gpu") or {}
        cost = p.get("cost") if isinstance(p.get("cost"), (int, float)) else 0.0
        total += cost
        line = f"{p.get('name')}  {p.get('id')}  {p.get('status')}  " \
               f"{gpu.get('count', '')}x {gpu.get('id', 'CPU')}  {p.get('dataCenterId') or '-'}  ${cost:.2f}/h"
        if not args.no_probe and p.get("status") == "RUNNING":
            router = router_pod.is_router(p)
            port = load_target(router_pod.ROUTER_TARGET).deploy_config().status.port if router \
                else _status_port(pods.owner(p))
            snap = probe.read_status(pods.proxy_url(str(p["id"]), port, args.proxy), session, timeout=10) \
                if port else None
            line += "  supervisor: " + (probe.progress_line(snap) if snap else "no answer")
            if router:
                line += "  router: " + router_pod.routes(snap, [q for q in found if not router_pod.is_router(q)])
        print(line)
    print(f"{len(found)} pod(s), ${total:.2f}/h")
    return 0


def _status_port(target: str | None) -> int | None:
    """The status port of the target a pod belongs to (pods.owner), when that target is here."""
    from ..target import target_names

    return load_target(target).deploy_config().status.port if target in target_names() else None


def _known_target(name: str, listed: list[dict[str, Any]]) -> None:
    """A target of images/targets/, or one that still owns pods (its file since removed); else exit 2."""
    from supervisor.validate import nearest

    from ..target import target_names

    names = target_names()
    if name in names or any(pods.owner(p) == name for p in listed):
        return
    near = nearest(name, names)
    raise KilnError(f"--target {name!r} is not a target" + (f" (did you mean {near!r}?)" if near else "")
                    + f" and owns no pod; the targets (images/targets/): {', '.join(names)}")


def _no_such_pod(what: str, api_pods: list[dict[str, Any]]) -> KilnError:
    ours = pods.kiln_pods(api_pods)
    have = ", ".join(f"{p.get('id')} ({p.get('name')})" for p in ours) or "none"
    return KilnError(f"{what}: no such pod in this account (a typo, or terminated already); Kiln's pods: {have}")


def cmd_logs(args: argparse.Namespace) -> int:
    api = _api(args)
    pod_id = args.pod
    listed = api.pods()
    named = [p for p in listed if p.get("name") == args.pod]
    if len(named) == 1:
        pod_id = str(named[0]["id"])
    elif not any(str(p.get("id")) == pod_id for p in listed):
        raise _no_such_pod(f"pod {args.pod!r}", listed)
    for event in api.pod_logs(pod_id, tail=args.tail, source=args.source, idle_s=args.idle):
        print(f"{event.get('ts', '')} {event.get('source', '')}: {event.get('line', '')}", flush=True)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    api = _api(args)
    listed = api.pods()
    if args.pod:
        everything = {str(p.get("id")): p for p in listed}
        missing = [pid for pid in args.pod if pid not in everything]
        if missing:        # nothing terminated: one typo among several ids is fixed, then all go
            raise _no_such_pod(f"--pod {', '.join(missing)} (nothing was terminated)", listed)
        chosen = [everything[pid] for pid in dict.fromkeys(args.pod)]
    else:
        if args.target:
            _known_target(args.target, listed)
        chosen = pods.kiln_pods(listed, args.target)
    if not chosen:
        print("nothing to terminate")
        return 0
    done = pods.terminate(api, chosen, say)
    left = [p for p in api.pods() if str(p.get("id")) in {str(c["id"]) for c in chosen}]
    for p in left:
        say(f"pod {p.get('name')} ({p.get('id')}) is still listed ({p.get('status')})")
    print(f"terminated {len(done)} pod(s)")
    kept = api.network_volumes()
    if kept:
        print("network volumes kept (they bill while they exist): "
              + ", ".join(f"{v.get('name')} ({v.get('id')}, {v.get('size')} GB)" for v in kept)
              + "; `python build.py pods volumes --delete ID` removes one")
    return 0 if not left else EXIT_NOT_READY


def cmd_volumes(args: argparse.Namespace) -> int:
    api = _api(args)
    if args.delete:
        mounted = volumes.users(api, args.delete)
        if mounted:        # its workers or pod would lose their weights and caches mid-run
            raise KilnError(f"--delete {args.delete}: {args.delete} is mounted by {', '.join(mounted)}: deleting it "
                            "would take their weights and caches away. Nothing was deleted; end them first "
                            "(`endpoint down`, `pods down`), then delete the volume")
        api.delete_network_volume(args.delete)
        print(f"network volume {args.delete}: deleted")
        return 0
    found = api.network_volumes()
    for v in found:
        print(f"{v.get('name')}  {v.get('id')}  {v.get('size')} GB  {v.get('dataCenter')}  {v.get('type', '')}")
    if not found:
        print("no network volumes")
    return 0


COMMANDS = (
    Command("pods", "RunPod pods from a target's template: up, status, logs, down (terminate, never stop), volumes",
            description="RunPod pods from a target's template (REST API v2, $RUNPOD_API_KEY).\n"
            "docs/pods.md: From zero to a serving pod.",
            children=(
                Command("up", "pods from the target's template, once the catalog offers a host its CUDA runs on; "
                        "waits until each supervisor is ready", cmd_up, _up_arguments),
                Command("status", "Kiln's pods (or one target's), what each supervisor says, what they cost",
                        cmd_status, _status_arguments),
                Command("logs", "a pod's log lines (container and system)", cmd_logs, _logs_arguments),
                Command("down", "terminate pods (never stop: a stopped pod's volume bills double)",
                        cmd_down, _down_arguments),
                Command("volumes", "network volumes (they bill while they exist)", cmd_volumes, _volumes_arguments),
            )),
)
