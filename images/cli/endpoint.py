"""`endpoint plan|up|status|logs|down`: a target as a RunPod Serverless load-balancing endpoint,
one URL that scales to zero. The arguments, and the order of a release (`cmd_up`: the body
checked offline -> the catalog -> the network volume -> create or update -> wait for a healthy
worker -> on failure the previous release restored); each step's work is in images/runpod/:
the body endpoint.py, the catalog, volume, create-or-update and restore body endpoints.py, the
wait rollout.py.

`plan` needs no key. The others read RUNPOD_API_KEY from the environment (never an argument:
argv is visible to every process on the machine); `--api` / $RUNPOD_API_URL points at another
API (tests: the stand-in in kiln_dev/runpod). Progress goes to stderr, results to stdout. Exit 0;
1 when no worker of the release it made turned healthy (`up --wait`, `failures --clear --wait`) and
nothing was restored (nothing to restore, the restore failed: the command that does it is printed,
or another release replaced this one's: it is named and never rolled back); 3 when a new release
failed and the previous one's configuration was restored; 130 or 143 on Ctrl-C or TERM during the
wait, after the restore; 2 on a usage, configuration or API error (one line; an option a command
does not take, an unknown target or endpoint, a body that breaks RunPod's schema: nothing is sent
after it). `up` on an error or a signal before the endpoint is written deletes a network volume it
created. Every command it prints names the endpoint as this one was asked for (`--name`, `--api`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from supervisor.errors import KilnError

from ..runpod import endpoint as ep
from . import command as opt
from .command import Command

EXIT_NOT_HEALTHY = 1
EXIT_ROLLED_BACK = 3


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _key() -> str:
    key = os.environ.get("RUNPOD_API_KEY", "")
    if not key:
        raise KilnError("RUNPOD_API_KEY is not set: create an API key in RunPod's console (Settings > API Keys) "
                        "and export it (it is never taken as an argument); `endpoint plan` needs none")
    return key


def _api(args: argparse.Namespace):
    from ..runpod.api import RunPodAPI

    return RunPodAPI(_key(), args.api)


def command(args: argparse.Namespace, sub: str, *extra: str) -> str:
    """`python build.py endpoint SUB` with the options that identify this endpoint as this command was
    given them (--target, --name, --api), so a printed command finds the same one."""
    parts = ["python", "build.py", "endpoint", sub, "--target", args.target]
    if getattr(args, "name", None):
        parts += ["--name", args.name]
    if getattr(args, "api", None):
        parts += ["--api", args.api]
    return "`" + shlex.join([*parts, *extra]) + "`"


# -- arguments -----------------------------------------------------------------------------
def _which(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, metavar="T", help="target name, images/targets/T.toml")
    p.add_argument("--name", metavar="NAME", help="endpoint name (default: kiln-<target>)")


def _api_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api", metavar="URL", help="RunPod REST API v2 base URL (default: $RUNPOD_API_URL or "
                   "https://api.runpod.io/v2)")


def _body_options(p: argparse.ArgumentParser) -> None:
    _which(p)
    p.add_argument("--config", metavar="FILE", help="the deploy config the workers serve (what `plan --write-config` "
                   "writes): it travels in the endpoint's environment, no rebuild (default: the image's own)")
    opt.image(p)
    p.add_argument("--image-ref", metavar="REF", help="the endpoint's whole image reference (default: the target's "
                   "immutable tag in --image or the target's repository)")
    p.add_argument("--registry-auth", metavar="ID", help="RunPod container registry credential id for a private image")
    p.add_argument("--allow-floating", action="store_true", help="name an image with unresolved pins (labelled "
                   "floating)")
    p.add_argument("--pool", action="append", default=[], metavar="POOL", help="serverless GPU pool id, e.g. "
                   "AMPERE_48 (repeatable; default: the pool of the target's [runpod] gpu_type)")
    p.add_argument("--gpu-count", type=int, help="GPUs per worker (default: the target's [runpod] gpu_count)")
    p.add_argument("--cpu-flavor", metavar="ID", help="CPU targets: a flavor id from GET /v2/catalog/cpus")
    p.add_argument("--vcpu", type=int, help="CPU targets: vCPUs per worker (a power of two, at least 2)")
    d = ep.Scaling()
    p.add_argument("--min-workers", type=int, default=d.min_workers, help="workers kept running (default: "
                   f"{d.min_workers}, scale to zero: nothing bills while nobody asks)")
    p.add_argument("--max-workers", type=int, default=d.max_workers, help=f"at most this many workers (default: "
                   f"{d.max_workers}, RunPod's own default, under the account's default cap of 5)")
    p.add_argument("--idle-timeout", type=int, default=d.idle_timeout_s, metavar="S", help="seconds an idle worker "
                   f"stays before it is released (1..3600, default: {d.idle_timeout_s}: a cold start costs minutes)")
    p.add_argument("--request-count", type=int, default=d.request_count, metavar="N", help="in-flight requests "
                   f"per worker before another starts (default: {d.request_count})")
    p.add_argument("--flashboot", default=d.flashboot, choices=ep.FLASHBOOT, help=f"default: {d.flashboot}")


def _plan_arguments(p: argparse.ArgumentParser) -> None:
    _body_options(p)


def _up_arguments(p: argparse.ArgumentParser) -> None:
    _body_options(p)
    p.add_argument("--network-volume", metavar="NAME", help="network volume for weights and caches, mounted at "
                   "/runpod-volume and shared by the workers (reused by name, else created; default: kiln-<target>)")
    p.add_argument("--network-volume-gb", type=int, default=0, help="size of a new network volume (default: the "
                   "target's volume_gb, at least 10)")
    p.add_argument("--no-network-volume", action="store_true", help="no volume (an existing endpoint's is "
                   "detached): every cold start downloads the model again")
    p.add_argument("--data-center", action="append", default=[], metavar="DC", help="data center to create the "
                   "network volume in (exactly one; an existing volume decides where workers run)")
    _wait_options(p, "wait until a worker of the release this `up` made reports healthy (one request wakes it "
                  "from zero); a new release that never does is undone, unless a newer release (a teammate's, "
                  "CI's) replaced it: that one is named and left live")
    opt.verify_options(p)
    _api_option(p)


def _wait_options(p: argparse.ArgumentParser, wait_help: str) -> None:
    p.add_argument("--wait", action="store_true", help=wait_help)
    p.add_argument("--timeout", type=float, metavar="S", help="with --wait: seconds to wait (default: 1800: a cold "
                   "start downloads or loads the model and runs the selftest)")
    p.add_argument("--poll", type=float, metavar="S", help="with --wait: seconds between reads of the workers "
                   "(default: 5)")
    p.add_argument("--settle", type=float, metavar="S", help="with --wait: a worker is healthy once it was read "
                   "ready for this long, at every read (default: 30: a crash a moment after it turned ready fails "
                   "the release)")


def _check_wait(args: argparse.Namespace) -> None:
    if not args.wait and (args.timeout is not None or args.poll is not None or args.settle is not None):
        raise KilnError("--timeout, --poll and --settle only go with --wait")
    for name, value in (("--timeout", args.timeout), ("--poll", args.poll), ("--settle", args.settle)):
        if value is not None and not value > 0:           # 0 meant the default before (`or`), a negative ran
            raise KilnError(f"{name} {value:g}: seconds, more than 0 (leave it out for the default)")


def _wait(api, e: dict, args: argparse.Namespace, key: str, release: int | None, latest_only: bool = True):
    from ..runpod import rollout

    return rollout.wait_healthy(api, e, say, api_key=key, timeout_s=1800.0 if args.timeout is None else args.timeout,
                                poll_s=5.0 if args.poll is None else args.poll,
                                settle_s=rollout.SETTLE_S if args.settle is None else args.settle,
                                latest_only=latest_only, release=release)


def _status_arguments(p: argparse.ArgumentParser) -> None:
    _which(p)
    _api_option(p)


def _logs_arguments(p: argparse.ArgumentParser) -> None:
    _which(p)
    p.add_argument("worker", nargs="?", help="worker id (`endpoint status` lists them; required when the "
                   "endpoint has more than one)")
    p.add_argument("--tail", type=int, default=100, help="lines of backfill (RunPod: at most 5000)")
    p.add_argument("--source", choices=("container", "system"))
    p.add_argument("--idle", type=float, default=3.0, help="stop after this many quiet seconds")
    _api_option(p)


def _down_arguments(p: argparse.ArgumentParser) -> None:
    _which(p)
    p.add_argument("--delete-volume", action="store_true", help="also delete the endpoint's network volume "
                   "and the weights on it (kept by default: the next endpoint does not download again)")
    _api_option(p)


# -- commands ------------------------------------------------------------------------------
def _scaling(args: argparse.Namespace) -> ep.Scaling:
    return ep.Scaling(args.min_workers, args.max_workers, args.idle_timeout, args.request_count, args.flashboot)


def _plan(args: argparse.Namespace, target, pins, compute, volume=None) -> ep.EndpointPlan:
    from ..build.render import FloatingRefused
    from ..pins.lock import missing

    plan = ep.build_endpoint(target, pins, compute, scaling=_scaling(args), repository=args.image,
                             image=args.image_ref, name=args.name, registry=args.registry_auth,
                             network_volume=volume, no_volume=getattr(args, "no_network_volume", False),
                             extra_env=getattr(args, "deploy_env_", None))
    if plan.floating and not args.image_ref and not args.allow_floating:
        raise FloatingRefused(target, [f for f in missing(target, pins)])
    return plan


def _deployment(args: argparse.Namespace, *, check: bool):  # type: ignore[no-untyped-def]
    """The target's image and the deploy config its workers serve (--config, else the image's own), checked
    before anything is asked of RunPod: the config against the image and the worker's GPU kind and count."""
    from .. import deployment
    from ..pins.lock import load_lock, pins_for
    from ..runpod import precheck
    from .pods import refuse_unless_ok

    dep = deployment.load(args.target, args.config, count=args.gpu_count)
    args.deploy_env_ = dep.env()
    args.server_key_ = dep.config.server.api_key
    target, pins = _one_node(dep.target, pins_for(dep.target, load_lock()))
    if check and target.is_gpu:
        shape = precheck.PodShape(target.runpod.gpu_type, target.runpod.gpu_count, 1, dep.gpu_from, dep.count_from)
        image = args.image_ref or _plan(args, target, pins, ep.Compute(pools=("catalog",), gpu_count=1)).body["image"]
        refuse_unless_ok(precheck.check(dep, shape), dep, image, opt.verify_key(args))
    return target, pins


def _one_node(target, pins):  # type: ignore[no-untyped-def]
    """A worker is one machine: a cluster target ([runpod] nodes > 1) is `cluster`'s."""
    if target.runpod.is_cluster:
        raise KilnError(f"--target {target.name}: a cluster target ([runpod] nodes = {target.runpod.nodes}): a "
                        f"serverless worker cannot hold it; `python build.py cluster up --target {target.name}`")
    return target, pins


def cmd_plan(args: argparse.Namespace) -> int:
    target, pins = _deployment(args, check=False)
    compute = ep.offline_compute(target, pools=tuple(args.pool), gpu_count=args.gpu_count,
                                 cpu_flavor=args.cpu_flavor, vcpu=args.vcpu)
    plan = _plan(args, target, pins, compute)
    if compute.pools_from:
        say(f"note: pools from {compute.pools_from}")
    say("note: `endpoint up` adds networkVolumes and dataCenterIds: the network volume (kiln-<target> unless "
        "--network-volume/--no-network-volume) and its data center")
    sys.stdout.write(plan.to_json())
    return 0


def _volume(api, args: argparse.Namespace, target):
    from ..runpod import endpoints, volumes

    if args.no_network_volume:
        return None
    name = args.network_volume or f"kiln-{target.name}"
    size = args.network_volume_gb or max(target.runpod.volume_gb, volumes.MIN_GB)
    return endpoints.volume_for(api, name, size, tuple(args.data_center), say)


def cmd_up(args: argparse.Namespace) -> int:
    from ..runpod import endpoints, rollout
    from ..runpod.cuda import cuda_floor

    _check_wait(args)
    if args.no_network_volume and (args.network_volume or args.network_volume_gb or args.data_center):
        raise KilnError("--no-network-volume cannot be combined with --network-volume, --network-volume-gb or "
                        "--data-center")
    target, pins = _deployment(args, check=True)
    compute = ep.offline_compute(target, pools=tuple(args.pool), gpu_count=args.gpu_count,
                                 cpu_flavor=args.cpu_flavor, vcpu=args.vcpu, docs=False)
    key = _key()
    # Every refusal the body alone can give (floating pins, scaling, RunPod's schema) before
    # RunPod is asked anything: the pools are a placeholder here, the catalog's below.
    _plan(args, target, pins, compute if not target.is_gpu else ep.Compute(pools=("catalog",), gpu_count=1))
    api = _api(args)
    floor = cuda_floor(target)
    if target.is_gpu:
        if args.pool:
            compute = ep.Compute(pools=tuple(args.pool), gpu_count=compute.gpu_count, pools_from="--pool")
        compute, offer = endpoints.serverless_offer(api, compute, floor, target.runpod.gpu_type, say)
        runs = "; ".join(f"{g} (CUDA {', '.join(v)})" for g, v in sorted(offer.cuda.items())) \
            or "none with capacity now"
        say(f"catalog: pool {', '.join(offer.pools)}: GPUs that run this image (CUDA >= {floor}): {runs}")
        if offer.full:
            say(f"catalog: {', '.join(offer.full)} run it too but have no capacity now")
        if not offer.cuda:
            say("catalog: no GPU of the pool that runs this image has capacity now: workers wait (THROTTLED) "
                "until one has")
    vol = _volume(api, args, target)
    plan = _plan(args, target, pins, compute, (vol.id, vol.data_center) if vol else None)
    try:
        change = endpoints.upsert(api, plan, down=command(args, "down"))
    except BaseException:             # an API error, Ctrl-C or TERM: only what this command created goes
        endpoints.drop_created(api, vol, say)
        raise
    e = change.endpoint
    say(f"endpoint {plan.name}: {change.action} ({e.get('id')})" +
        (f"; changed: {', '.join(sorted(change.patch))}" if change.patch else ""))
    if change.action == "updated" and change.new_release:
        say("a new release: workers on the previous one are replaced as they finish their requests")
    if change.ours.version is not None:
        say(f"release v{change.ours.version}: this up's" + ("" if change.action != "unchanged" else
                                                            " (unchanged: the endpoint's latest)"))
    code = 0
    if args.wait:
        if change.ours.version is None:
            _untold(change.ours, args)
            code = EXIT_NOT_HEALTHY
        else:
            try:
                outcome = _wait(api, e, args, key, change.ours.version, latest_only=change.new_release)
            except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or TERM (app.py raises SystemExit for it)
                _interrupted(api, plan, change, args)
                raise
            if outcome.replaced_by:
                code = _replaced(api, change, outcome, args)
            elif not outcome.healthy:
                code = _not_healthy(api, plan, change, outcome, key, args)
            else:
                # Read after the wait: an interrupt from here on leaves the release it proved in place.
                _healthy(api, str(e["id"]), outcome)
    _print_endpoint(api, e, code, args, target)
    return code


def _healthy(api, endpoint_id: str, outcome) -> None:
    from ..runpod import rollout

    say(f"worker {outcome.worker} of release v{outcome.version} is healthy: ready, and still ready "
        f"{outcome.settled_s:g} s later at every read; {rollout.checked(api, endpoint_id, str(outcome.worker))}")


def _untold(mine, args: argparse.Namespace) -> None:
    """No wait when it cannot tell which release is its own: it would follow one that may be another's."""
    from ..runpod.endpoints import describe

    among = f" among {'; '.join(describe(r) for r in mine.unsure)} (released at the same time)" if mine.unsure else \
        " (the endpoint's releases could not be read)"
    print(f"NOT WAITED: which release is this command's could not be told{among}; waiting on one that may be "
          f"another's would report it as this one's. {command(args, 'status')} shows which release its workers run")


def _replaced(api, change, outcome, args: argparse.Namespace) -> int:
    """A newer release (a teammate's, CI's) replaced this up's before it proved healthy: name it, leave it."""
    print(f"NOT HEALTHY: {outcome.cause}")
    print(f"  nothing was rolled back: putting back what this up replaced would undo "
          f"v{outcome.replaced_by[-1].get('version')}, which is live now{_image_now(api, change)}")
    print(f"  {command(args, 'status')} shows which release its workers run; run this `up --wait` again to "
          "release this configuration over it, or leave the newer release live")
    return EXIT_NOT_HEALTHY


def _image_now(api, change) -> str:
    try:
        return f" (image {api.endpoint(str(change.endpoint['id'])).get('image')})"
    except Exception:  # noqa: BLE001 - a read for the message only
        return ""


def _live_check(api, change) -> tuple[str, bool] | None:
    """Why a restore must not run, and whether the restore command may still be printed for the user
    to run after checking; None when this up's release is still the endpoint's latest and nobody
    released between its read of the endpoint and its PATCH."""
    from ..runpod import endpoints
    from ..runpod.api import RunPodAPIError

    mine = change.ours
    if mine.version is None:
        return "which release is this up's could not be told, so whether it is still the live one cannot be", True
    try:
        newer = endpoints.after(api, str(change.endpoint["id"]), mine.version)
    except (RunPodAPIError, OSError) as err:
        return f"what is live could not be read ({err})", True
    if newer:
        return (f"release v{mine.version} (this up's) was replaced by {'; '.join(endpoints.describe(r) for r in newer)}"
                f"; putting back what this up replaced would undo it", False)
    if mine.earlier:
        return (f"{'; '.join(endpoints.describe(r) for r in mine.earlier)} came between this up's read of the endpoint "
                f"and its own release v{mine.version}; putting back what it read would undo that too", False)
    return None


def _not_healthy(api, plan: ep.EndpointPlan, change, outcome, key: str, args: argparse.Namespace) -> int:
    from ..runpod import endpoints
    from ..runpod.rollout import masked

    secrets = [key, os.environ.get("HF_TOKEN")]
    print(f"NOT HEALTHY: {masked([outcome.cause or 'unknown'], secrets)[0]}")
    if outcome.worker:
        print(f"  worker {outcome.worker}" + (", its log ends:" if outcome.log_tail else ""))
        for line in masked(outcome.log_tail, secrets):
            print(f"    {line}")
    restore = _restore_body(plan, change)
    if restore:
        refused = _live_check(api, change)
        if refused:
            why, show = refused
            print(f"nothing was rolled back: {why}. {command(args, 'status')} shows which release its workers run"
                  + (f"; once release v{change.ours.version} is the latest, this restores its "
                     f"{', '.join(sorted(restore))}:\n  "
                     f"{endpoints.restore_command(api, str(change.endpoint['id']), restore)}" if show else ""))
            return EXIT_NOT_HEALTHY
        if not _put_back(api, str(change.endpoint["id"]), restore, "the failed release"):
            return EXIT_NOT_HEALTHY
        print(f"restored the previous release's {', '.join(sorted(restore))} (a new release of the old "
              "configuration); the failed one takes no more traffic once its workers are replaced")
        return EXIT_ROLLED_BACK
    print(f"nothing to restore (the endpoint was {change.action}); {command(args, 'down')} deletes it")
    return EXIT_NOT_HEALTHY


def _restore_body(plan: ep.EndpointPlan, change) -> dict:
    """The PATCH that puts back what a new release replaced; {} when there is none to undo."""
    from ..runpod import endpoints

    if not (change.action == "updated" and change.new_release):
        return {}
    return endpoints.restore_body(change, plan.secret_keys, {k: plan.body["env"][k] for k in plan.secret_keys})


def _interrupted(api, plan: ep.EndpointPlan, change, args: argparse.Namespace) -> None:
    """Ctrl-C or TERM before the new release proved healthy: put the previous one back, as `pods up`
    accounts for its pods, or print the command that does it; unless it is no longer the live one
    (a newer release replaced it: putting back would undo that). A second signal while restoring
    ends the attempt and prints the command too."""
    from ..runpod import endpoints

    restore = _restore_body(plan, change)
    if not restore:
        print(f"interrupted before a worker proved healthy; the endpoint was {change.action}, nothing to restore: "
              f"{command(args, 'down')} deletes it", flush=True)
        return
    refused = _live_check(api, change)
    if refused:
        why, show = refused
        print(f"interrupted before release v{change.ours.version} proved healthy; nothing was put back: {why}. "
              f"{command(args, 'status')} shows which release its workers run"
              + (f"; this restores its {', '.join(sorted(restore))}:\n  "
                 f"{endpoints.restore_command(api, str(change.endpoint['id']), restore)}" if show else ""), flush=True)
        return
    if _put_back(api, str(change.endpoint["id"]), restore, "the new release, interrupted before it proved healthy,"):
        print(f"interrupted before the new release proved healthy: restored the previous release's "
              f"{', '.join(sorted(restore))} (a new release of the old configuration)", flush=True)


def _put_back(api, endpoint_id: str, restore: dict, what: str) -> bool:
    """PATCH the previous release back; when that fails (an API error, or a second Ctrl-C/TERM, which
    still ends the command) print the command that does it instead. Whether it was put back."""
    from ..runpod import endpoints

    try:
        api.update_endpoint(endpoint_id, restore)
        return True
    except BaseException as e:
        print(f"{what} is still live: restoring the previous release failed ({type(e).__name__}: {e}); this "
              f"restores its {', '.join(sorted(restore))}:\n  {endpoints.restore_command(api, endpoint_id, restore)}",
              flush=True)
        if not isinstance(e, Exception):
            raise
        return False


def _server_key(args: argparse.Namespace, target) -> str:
    """What becomes of the deploy config's own server key on an endpoint: nothing (endpoint.py)."""
    kind, _, ref = str(getattr(args, "server_key_", "") or "").partition(":")
    if kind != "env":
        return ""
    secret = dict(target.runpod.secrets).get(ref)
    named = f"RunPod secret {secret!r}" if secret else f"${ref}"
    return (f"; the deploy config's server key ({named}, what `pods up` clients send) is not used here: its "
            "reference is not sent to the workers")


def _print_endpoint(api, e: dict, code: int, args: argparse.Namespace, target) -> None:
    """The URL, the key its clients send, the price, and the commands that watch and delete it. The
    key: RunPod's load balancer admits only requests that carry a RunPod API key and the workers
    check none (KILN_API_KEY_SOURCE=none, endpoint.py), so a client needs a RunPod API key; the one
    to hand out is one restricted to this endpoint, never the account-wide key `up` ran with."""
    from ..runpod import endpoints, rollout

    url = rollout.base_url(e)
    rate, source = endpoints.price(api, e)
    print(f"endpoint {e.get('name')} ({e.get('id')}): {url}" + ("" if code == 0 else " (not healthy)"))
    print(f"  OpenAI API: {url}/v1 (streaming included). RunPod's load balancer admits only requests that carry "
          "`Authorization: Bearer <a RunPod API key>`; the workers check no key of their own (KILN_API_KEY_SOURCE="
          f"none){_server_key(args, target)}")
    print(f"  clients: give each a RunPod API key restricted to this endpoint ({e.get('id')}): RunPod console > "
          "API Keys > Create API Key, permission Restricted, this endpoint only; e.g. with it in $ENDPOINT_KEY:")
    print(f"    curl -H \"Authorization: Bearer $ENDPOINT_KEY\" {url}/v1/models")
    print("  not $RUNPOD_API_KEY, the key this command ran with: a key with the All permission can also create and "
          "delete pods, endpoints and network volumes on the account")
    workers = e.get("workers") or {}
    if rate is not None:
        print(f"  one worker: ${rate:.2f}/h (${rate / 3600:.5f}/s), {source}; workers {workers.get('min')}.."
              f"{workers.get('max')}, an idle one is released after {workers.get('idleTimeout')} s")
    else:
        print(f"  price: {source}")
    print(f"  {command(args, 'status')}: its workers, its release's rollout, the cost; {command(args, 'logs')}: a "
          f"worker's log (add the worker's id when it has several); {command(args, 'failures')}: its workers' "
          f"failure records")
    print(f"  {command(args, 'down')} deletes it (the network volume is kept unless --delete-volume)")


def _existing(api, args: argparse.Namespace) -> dict:
    """The endpoint `--name` or the target's name says: its target file is not read (status, logs and
    down work on an endpoint whose target is gone, as `pods` does)."""
    from ..runpod import endpoints

    return endpoints.resolve(api, args.name or ep.default_name(args.target))


def cmd_status(args: argparse.Namespace) -> int:
    from ..runpod import endpoints, rollout

    api = _api(args)
    e = _existing(api, args)
    eid = str(e["id"])
    gpu = e.get("gpu") if isinstance(e.get("gpu"), dict) else None
    w, s = e.get("workers") or {}, e.get("scaling") or {}
    print(f"endpoint {e.get('name')} ({eid})  {e.get('type')}  {rollout.base_url(e)}")
    compute = (f"pools {', '.join(gpu.get('pools') or [])} x{gpu.get('count', 1)} GPU, CUDA >= "
               f"{gpu.get('minCudaVersion') or 'any'}") if gpu else f"cpu {e.get('cpu')}"
    print(f"  image {e.get('image')}; {compute}; workers {w.get('min')}..{w.get('max')}, idle {w.get('idleTimeout')} s;"
          f" {s.get('type')} {s.get('requestCount', s.get('queueDelay'))}; flashboot {e.get('flashboot')}; "
          f"volumes {', '.join(e.get('networkVolumes') or []) or 'none'}")
    rel = api.endpoint_releases(eid)
    ro = rel.get("rollout") or {}
    latest = (rel.get("releases") or [{}])[0]
    fields = ", ".join(str(d.get("field")) for d in latest.get("diff") or []) or "-"
    print(f"  release v{rel.get('endpointVersion')} ({latest.get('createdAt', '?')}, changed: {fields}): "
          f"{ro.get('workersOnLatest')}/{ro.get('workersTotal')} workers on it ({ro.get('percentOnLatest')}%)"
          + (", rollout in progress" if ro.get("inProgress") else ""))
    listing = api.endpoint_workers(eid)
    sm = listing.get("summary") or {}
    print(f"  workers: {sm.get('total', 0)} (running {sm.get('running', 0)}, idle {sm.get('idle', 0)}, initializing "
          f"{sm.get('initializing', 0)}, throttled {sm.get('throttled', 0)}, unhealthy {sm.get('unhealthy', 0)})")
    billing = endpoints.billed(listing.get("workers") or [])
    for x in listing.get("workers") or []:
        print(f"    {x.get('id')}  {x.get('status')}  v{x.get('version')}{' STALE' if x.get('isStale') else ''}  "
              f"up {x.get('uptimeSeconds') if x.get('uptimeSeconds') is not None else '-'} s  "
              f"{x.get('gpuTypeId') or '-'}  {x.get('dataCenterId') or '-'}")
    rate, source = endpoints.price(api, e)
    if rate is None:
        print(f"  cost: {source}")
    else:
        print(f"  cost: ${rate:.2f}/h per worker (${rate / 3600:.5f}/s), {source}; now {billing} worker(s) "
              f"running, idle, starting or unhealthy (each bills until it is stopped): ${rate * billing:.2f}/h")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from ..runpod.api import RunPodAPIError

    api = _api(args)
    e = _existing(api, args)
    workers = [str(w.get("id")) for w in api.endpoint_workers(str(e["id"])).get("workers") or []]
    worker = args.worker
    if worker is None:
        if len(workers) != 1:
            raise KilnError(f"endpoint {e.get('name')} has {len(workers)} workers"
                            + (f" ({', '.join(workers)}): name one" if workers else ": nothing to read"))
        worker = workers[0]
    # A worker that has ended is no longer listed ("only active workers"), yet its log is what a
    # user wants after a failure: ask for it anyway, and name the listed ones if RunPod has none.
    try:
        for event in api.worker_logs(str(e["id"]), worker, tail=args.tail, source=args.source, idle_s=args.idle):
            print(f"{event.get('ts', '')} {event.get('source', '')}: {event.get('line', '')}", flush=True)
    except RunPodAPIError as err:
        if err.status != 404:
            raise
        raise KilnError(f"endpoint {e.get('name')} has no worker {worker!r} (RunPod: {err}); its workers: "
                        f"{', '.join(workers) or 'none'}") from None
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from ..runpod import endpoints

    api = _api(args)
    e = _existing(api, args)
    kept = endpoints.delete(api, e, say, delete_volumes=args.delete_volume, down=command(args, "down"))
    print(f"endpoint {e.get('name')} ({e.get('id')}): deleted")
    if kept:
        api_opt = f" --api {shlex.quote(args.api)}" if args.api else ""
        print(f"network volume(s) kept (they bill while they exist): {', '.join(kept)}; "
              + "; ".join(f"`python build.py pods volumes --delete {v}{api_opt}`" for v in kept) + " removes it")
    return 0


def _failures_arguments(p: argparse.ArgumentParser) -> None:
    _which(p)
    p.add_argument("--clear", action="store_true", help="set the endpoint's clear mark: a new release that "
                   "replaces every worker (each new one cold-starts); its workers ignore and delete every failure "
                   "record written before now")
    _wait_options(p, "with --clear: wait until a worker of that release reports healthy (as `up --wait`; a clear "
                  "is never undone)")
    _api_option(p)


def cmd_failures(args: argparse.Namespace) -> int:
    """The failure records of the endpoint's workers (supervisor/serverless/failures.py): what the CLI can
    see of them, and --clear (images/runpod/failures.py says why this is the way)."""
    import time

    from ..runpod import endpoints, failures
    from ..runpod.rollout import masked
    from ..runpod.template import secret_ref
    from ..target import load_target

    _check_wait(args)
    if args.wait and not args.clear:
        raise KilnError("--wait only goes with --clear (showing the records makes no release)")
    api = _api(args)
    e = api.endpoint(str(_existing(api, args)["id"]))
    eid, secrets = str(e["id"]), [_key(), os.environ.get("HF_TOKEN")]
    vols = {str(v.get("id")): v for v in api.network_volumes()}
    print(f"endpoint {e.get('name')} ({eid}): failure records are files on its network volume, under "
          f"{failures.RECORDS_PATH}<key>/<worker>.json; RunPod's REST API cannot read a volume's files")
    mark = failures.mark_of(e)
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(mark))) if mark and mark.isdigit() else None
    print(f"  clear mark: {failures.CLEARED_ENV}={mark} ({when}): its workers ignore records written before it"
          if when else f"  clear mark: {mark or 'none'}")
    listed = api.endpoint_workers(eid).get("workers") or []
    print(f"  what the {len(listed)} listed worker(s) logged about them (RunPod lists running workers only):")
    for w in listed:
        lines = failures.worker_lines(api.worker_logs(eid, str(w.get("id")), tail=500, idle_s=1.0))
        print(f"    {w.get('id')} {w.get('status')}: " + ("nothing" if not lines else ""))
        for line in masked(lines, secrets):
            print(f"      {line}")
    for vid in e.get("networkVolumes") or []:
        dc = str((vols.get(vid) or {}).get("dataCenter") or "DATACENTER")
        ls, rm = failures.s3_commands(vid, dc)
        print(f"  volume {vid} ({dc}), with an S3 API key of RunPod's S3-compatible API (select data centers: "
              f"runpod/docs storage/s3-api.mdx):\n    list:   {ls}\n    delete: {rm}")
    if not e.get("networkVolumes"):
        print("  no network volume: each worker keeps its records on its own disk, and they go with it")
    if not args.clear:
        return 0
    try:
        target = load_target(args.target)
    except KilnError as err:
        raise KilnError(f"--clear needs the target's file for its secret references (the endpoint's env is sent "
                        f"back whole): {err}; delete the records with the S3 command above instead") from None
    refs = {key: secret_ref(name) for key, name in target.runpod.secrets}
    body = failures.clear_body(e, refs)
    print(f"--clear is a new release of endpoint {e.get('name')}: every worker is replaced ({len(listed)} listed "
          "now: an idle one at once, a busy one after its requests), and each new one cold-starts: it loads the "
          "model and runs its selftest again, billed", flush=True)
    before = endpoints.read_version(api, eid)
    after, mine = endpoints.patch_release(api, eid, body, before)
    release = f"v{mine.version}, whose" if mine.version is not None else "its"
    print(f"cleared: {failures.CLEARED_ENV}={body['env'][failures.CLEARED_ENV]} is set (a new release): {release} "
          "workers ignore every failure record written before it and delete it; the next request starts one")
    if not args.wait:
        print(f"  {command(args, 'status')} shows its workers move to it (`--clear --wait` waits for a healthy "
              "worker of the release it makes)")
        return 0
    if mine.version is None:
        _untold(mine, args)
        return EXIT_NOT_HEALTHY
    outcome = _wait(api, after, args, _key(), mine.version)
    if outcome.healthy:
        _healthy(api, eid, outcome)
        return 0
    print(f"NOT HEALTHY: {masked([outcome.cause or 'unknown'], secrets)[0]}")
    if outcome.worker:
        print(f"  worker {outcome.worker}" + (", its log ends:" if outcome.log_tail else ""))
        for line in masked(outcome.log_tail, secrets):
            print(f"    {line}")
    print(f"  the clear mark stays (a clear is not undone: it lifts records, it changes nothing a worker runs); "
          f"{command(args, 'status')} and {command(args, 'logs')} show what its workers do")
    return EXIT_NOT_HEALTHY


COMMANDS = (
    Command("endpoint", "RunPod Serverless load-balancing endpoints from a target: one URL that scales to zero",
            description="A target as a RunPod Serverless load-balancing endpoint (REST API v2, $RUNPOD_API_KEY): "
            "requests reach only workers whose selftest passed; workers scale on in-flight requests, down to "
            "zero.\ndocs/endpoints.md: One URL for a team.",
            children=(
                Command("plan", "print the CreateEndpointRequest `up` would send (no key needed)", cmd_plan,
                        _plan_arguments),
                Command("up", "create or update the endpoint by name, once the serverless catalog offers a GPU its "
                        "CUDA runs on; --wait follows the release it made and undoes one that never turns healthy",
                        cmd_up, _up_arguments),
                Command("status", "the endpoint's workers, the rollout of its latest release, what it costs",
                        cmd_status, _status_arguments),
                Command("logs", "a worker's log lines (container and system)", cmd_logs, _logs_arguments),
                Command("down", "delete the endpoint and its workers (the network volume is kept unless asked)",
                        cmd_down, _down_arguments),
                Command("failures", "the failure records its workers keep on the network volume; --clear lifts "
                        "them (docs/endpoints.md: Failure records)", cmd_failures, _failures_arguments),
            )),
)
