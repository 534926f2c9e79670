"""`cluster plan|up|status|logs|down`: a target as one RunPod Instant Cluster (REST API v2 /clusters).

The arguments and wiring are here; the request, the catalog check, the wait on rank 0 and the
node lines are images/runpod/clusters.py. Every command reads RUNPOD_API_KEY from the environment
(never an argument); `plan` needs none: it only prints the CreateClusterRequest, checked against the
vendored schema, with secrets as RunPod secret references. Progress goes to stderr, results to
stdout; exit 0, 1 when the group did not turn ready, 2 on a usage, configuration or API error.
"""

from __future__ import annotations

import argparse
import secrets

import requests

from supervisor.cluster_env import SECRET_ENV
from supervisor.errors import KilnError

from ..pins.lock import load_lock, pins_for
from ..runpod import clusters
from ..runpod import pods as runpod_pods
from ..runpod.template import dumps
from ..target import load_target
from . import command as opt
from .command import Command
from .. import deployment
from ..runpod import precheck
from .pods import (EXIT_NOT_READY, _api, _common, _template, _template_options, config_argument, refuse_unless_ok,
                   replace_argument, say)


def _shape_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True)
    config_argument(p)
    p.add_argument("--nodes", type=int, help="nodes (pods) in the cluster, 2..250 (default: a cluster "
                   "target's [runpod] nodes; required for a one-node target)")
    p.add_argument("--gpu", metavar="ID", help="RunPod GPU type id (default: the target's [runpod] gpu_type)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the target's [runpod] gpu_count)")
    p.add_argument("--data-center", action="append", default=[], metavar="DC", help="preferred data center "
                   "id (repeatable; a cluster is always placed within one)")
    p.add_argument("--volume", metavar="VOLUME_ID", help="mount this existing network volume on every node, the "
                   "state_dir on it: the nodes share one model download (each keeps its own state there); the "
                   "cluster is placed in the volume's data center")
    p.add_argument("--volume-path", metavar="PATH", help="where every node mounts --volume (default: the "
                   "target's [runpod] volume_mount)")
    _template_options(p)


def _plan_arguments(p: argparse.ArgumentParser) -> None:
    _shape_arguments(p)


def _up_arguments(p: argparse.ArgumentParser) -> None:
    _shape_arguments(p)
    replace_argument(p)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for rank 0's /ready")
    p.add_argument("--poll", type=float, default=5.0, help="seconds between status reads")
    p.add_argument("--proxy", metavar="PATTERN", help="proxy URL pattern with {pod_id} and {port} "
                   f"(default: $RUNPOD_PROXY_URL or {runpod_pods.PROXY_URL})")
    opt.verify_options(p)
    _common(p)


def _status_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True)
    p.add_argument("--proxy", metavar="PATTERN")
    p.add_argument("--no-probe", action="store_true", help="do not ask each node's supervisor")
    _common(p)


def _logs_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True)
    p.add_argument("--rank", type=int, default=0, help="whose log (default 0, the primary)")
    p.add_argument("--tail", type=int, default=100, help="lines of backfill (RunPod: at most 5000)")
    p.add_argument("--idle", type=float, default=3.0, help="stop after this many quiet seconds")
    _common(p)


def _down_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True)
    _common(p)


def _body(args: argparse.Namespace, *, check: bool = True):  # type: ignore[no-untyped-def]
    dep = deployment.load(args.target, args.config, gpu=args.gpu, count=args.gpus_per_node)
    target = dep.target
    if args.registry_auth:
        raise KilnError("--registry-auth: RunPod's CreateClusterRequest has no registry field (private "
                        "registries are not supported for clusters): push the image to a public repository")
    tpl = _template(args, target, pins_for(target, load_lock()))
    nodes = args.nodes if args.nodes is not None else target.runpod.nodes
    nodes_from = "--nodes" if args.nodes is not None else "the config's rungs (tensor x pipeline parallel)" \
        if dep.given else "the target's [runpod] nodes"
    if nodes == 1 and args.nodes is None:
        raise KilnError(f"--target {target.name} is a one-node target ([runpod] nodes = 1): give --nodes N "
                        "(2..250), or use a cluster target")
    shape = clusters.Shape.of(target, nodes=nodes, gpu_id=args.gpu, gpus_per_node=args.gpus_per_node,
                              data_centers=tuple(args.data_center))
    if check:
        count_from = "--gpus-per-node" if args.gpus_per_node is not None else dep.count_from
        verdict = precheck.check(dep, precheck.PodShape(shape.gpu_id, shape.gpus_per_node, shape.nodes, dep.gpu_from,
                                                        count_from, nodes_from))
        refuse_unless_ok(verdict, dep, tpl.body["image"], opt.verify_key(args))
    if args.volume_path and not args.volume:
        raise KilnError(f"--volume-path {args.volume_path}: give --volume VOLUME_ID as well (the volume to "
                        "mount there)")
    mount = clusters.NetworkMount.of(target, args.volume, args.volume_path) if args.volume else None
    if mount is not None:
        say(f"network volume {mount.volume_id} at {mount.path} on every node; state_dir {mount.state_dir} on it "
            "(the Hub cache and the compile caches shared, each node's own state in workers/<pod id>)")
    return target, shape, clusters.cluster_body(target, tpl, shape, mount, dep.env())


SECRET_SHOWN = "<made by `cluster up` for each cluster; never printed>"


def cmd_plan(args: argparse.Namespace) -> int:
    _, shape, body = _body(args)
    body["env"][SECRET_ENV] = SECRET_SHOWN
    print(dumps(body), end="")
    say(f"{shape.nodes} nodes x {shape.gpus_per_node} {shape.gpu_id}; POST /v2/clusters with this body is "
        "`cluster up` (checked against RunPod's CreateClusterRequest; secrets are RunPod secret references, but "
        f"{SECRET_ENV}, the beats' seal key, which `cluster up` makes for each cluster and puts in its env)")
    if args.volume:
        say(f"`cluster up` first checks that network volume {args.volume} exists, and places the cluster in its "
            "data center")
    return 0


def _found(api, name: str) -> dict:  # type: ignore[no-untyped-def]
    found = clusters.find(api, name)
    if found is None:
        raise KilnError(f"--target {name}: no cluster named {clusters.cluster_name(name)!r} in this account "
                        "(`cluster up` creates it)")
    return found


def cmd_up(args: argparse.Namespace) -> int:
    target, shape, body = _body(args)
    # The group's beats are sealed with a key of this cluster's own (supervisor/cluster/protocol.py): made
    # here, given to every node in the cluster's env, never printed or logged.
    body["env"][SECRET_ENV] = secrets.token_urlsafe(32)
    api = _api(args)
    if args.volume:
        vol, body, shape = clusters.place_on_volume(api, body, shape)
        say(f"network volume {vol.id} ({vol.name}, {vol.size_gb} GB) is in {vol.data_center}: the cluster goes there")
        if vol.size_gb < target.runpod.volume_gb:
            say(f"warning: network volume {vol.id} has {vol.size_gb} GB, less than the {target.runpod.volume_gb} GB "
                f"the target's [runpod] volume_gb asks for its model and caches")
    result = clusters.up(api, target, body, shape, say, timeout_s=args.timeout, poll_s=args.poll, proxy=args.proxy,
                         replace=args.replace)
    cid = result.cluster.get("id")
    if not result.ready or result.primary is None:
        print(f"cluster {result.cluster.get('name')} ({cid}): NOT READY: {result.line}; see "
              f"`python build.py cluster logs --target {target.name} --rank 0`, then "
              f"`python build.py cluster down --target {target.name}`")
        return EXIT_NOT_READY
    ep = runpod_pods.endpoints(target, result.primary, args.proxy)
    print(f"cluster {result.cluster.get('name')} ({cid}): ready: {result.line}")
    print(f"  API (rank 0, over RunPod's HTTP proxy, 100 s per request): {ep.http}")
    print(f"  status: {ep.status}/status")
    print(runpod_pods.key_hint(target))
    print(f"every node bills until `python build.py cluster down --target {target.name}`")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    api = _api(args)
    found = _found(api, args.target)
    members = api.cluster_pods(str(found["id"]))
    port = None if args.no_probe else load_target(args.target).deploy_config().status.port
    compute = found.get("compute") or {}
    print(f"cluster {found.get('name')} ({found.get('id')}): {compute.get('podCount')} x "
          f"{compute.get('gpuCountPerPod')} {compute.get('gpuTypeId')}, {found.get('dataCenterId') or '-'}")
    for line in clusters.node_lines(members, port, args.proxy, requests.Session()):
        print(f"  {line}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    api = _api(args)
    members = api.cluster_pods(str(_found(api, args.target)["id"]))
    pod = next((p for p in members if clusters.rank_of(p) == args.rank), None)
    if pod is None:
        ranks = sorted(r for p in members if (r := clusters.rank_of(p)) is not None)
        raise KilnError(f"--rank {args.rank}: no such node; the cluster's ranks: {ranks or 'none assigned yet'}")
    for event in api.pod_logs(str(pod["id"]), tail=args.tail, idle_s=args.idle):
        print(f"{event.get('ts', '')} {event.get('source', '')}: {event.get('line', '')}", flush=True)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    api = _api(args)
    found = _found(api, args.target)
    gone = api.delete_cluster(str(found["id"]))
    print(f"cluster {found.get('name')} ({found.get('id')}): " + ("deleted, with every node" if gone
                                                                   else "already gone"))
    return 0


COMMANDS = (
    Command("cluster", "a target as one RunPod Instant Cluster: plan, up, status, logs, down",
            description="A target served by vLLM across the nodes of one RunPod Instant Cluster (REST API v2 "
            "/clusters, $RUNPOD_API_KEY). docs/clusters.md: One model, several nodes.",
            children=(
                Command("plan", "print the CreateClusterRequest (schema-checked, secrets as references)",
                        cmd_plan, _plan_arguments),
                Command("up", "check the catalog, create the cluster, wait for rank 0's /ready, print the one URL",
                        cmd_up, _up_arguments),
                Command("status", "every node's rank, state, GPU use and supervisor", cmd_status, _status_arguments),
                Command("logs", "one node's log lines", cmd_logs, _logs_arguments),
                Command("down", "delete the cluster (every node is terminated with it)", cmd_down, _down_arguments),
            )),
)
