"""A target's RunPod Serverless load-balancing endpoint, as a v2 CreateEndpointRequest.

One URL for a team: https://<endpoint id>.api.runpod.ai/<path> reaches a worker's own HTTP
server (the engine's OpenAI API) and only a worker whose health path answers 200; workers scale
on in-flight requests between workers.min and workers.max (RunPod's docs, vendored in
images/schemas/runpod-rest-v2.json). The body says everything explicitly:

- type LOAD_BALANCER, scaling REQUEST_COUNT (the only scaler a load-balancing endpoint takes);
- image: the target's immutable tag; args: the image's CMD (`run`), never empty (template.py);
- env: secret references only ({{ RUNPOD_SECRET_<name> }}), never a value; PORT (the engine's
  API), PORT_HEALTH (the supervisor's status server, where the health path answers 204 until the
  selftest passed, 200 while serving, 503 when it can never serve) and HEALTH_CHECK_PATH, all
  three set because RunPod's two documents disagree on PORT_HEALTH's default; KILN_API_KEY_SOURCE
  = none: RunPod's load balancer admits only requests that carry a RunPod API key, and whether it
  forwards that header to the worker is not documented, so an engine key could never be sent
  beside it (the key's secret reference is dropped with it);
- ports: PORT and PORT_HEALTH as http (a custom port must be in env and exposed);
- gpu: the pools the target's GPU type belongs to, GPUs per worker, minCudaVersion = the image's
  CUDA floor (cuda.py), never an exact list; or cpu for a CPU target;
- workers: min 0 (scale to zero: nothing bills while nobody asks), max 3 (RunPod's own create
  default, below the account's default cap of 5 workers over all endpoints, and a ceiling on the
  bill: 3 x the pool's rate), idleTimeout 300 s (a cold start, the model loaded from the volume and
  the selftest, costs minutes of a user's wait; up to five idle minutes after a burst keep a
  conversation's next request warm; RunPod's default is 10 s);
- requestCount 4 in-flight requests per worker before another starts (RunPod's example value: one
  worker's engine batches a few streams; raise it for an engine with more slots);
- flashboot FLASHBOOT (RunPod's console enables it by default, the API does not);
- networkVolumes: the volume for weights and caches (mounted at /runpod-volume), and its data
  center in dataCenterIds (a volume confines the workers to it anyway).

Checked against the vendored schema before it is printed or sent. `plan` needs no key, so it
takes the pools from the docs' pool table; `up` from the live catalog, which is authoritative.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from supervisor.errors import KilnError

from ..build import render, tags
from ..pins.lock import Pin
from ..target import Target
from .. import runpod_schema as schema
from .cuda import cuda_floor
from .template import secret_ref, start_args

HEALTH_CHECK_PATH = "/ping"
FLASHBOOT = ("OFF", "FLASHBOOT", "PRIORITY_FLASHBOOT")
# What a change to these fields does: a new release that rolls out as workers cycle (RunPod's
# updateEndpoint description names image and env; the rest change what a worker's container is or
# sees too). Kiln follows such a rollout and can restore them.
RELEASE_FIELDS = ("image", "args", "env", "ports", "disk", "registry", "gpu", "cpu", "networkVolumes",
                  "dataCenterIds")


@dataclass(frozen=True)
class Scaling:
    min_workers: int = 0
    max_workers: int = 3
    idle_timeout_s: int = 300
    request_count: int = 4
    flashboot: str = "FLASHBOOT"

    def problems(self) -> list[str]:
        out = []
        if self.min_workers < 0:
            out.append(f"--min-workers {self.min_workers}: at least 0 (0 scales to zero)")
        if self.max_workers < max(1, self.min_workers):
            out.append(f"--max-workers {self.max_workers}: at least 1 and at least --min-workers {self.min_workers}")
        if not 1 <= self.idle_timeout_s <= 3600:
            out.append(f"--idle-timeout {self.idle_timeout_s}: RunPod takes 1..3600 seconds")
        if self.request_count < 1:
            out.append(f"--request-count {self.request_count}: at least 1 in-flight request per worker")
        if self.flashboot not in FLASHBOOT:
            out.append(f"--flashboot {self.flashboot!r}: one of {', '.join(FLASHBOOT)}")
        return out


@dataclass(frozen=True)
class Compute:
    """Where the workers run: GPU pools and GPUs per worker, or CPU flavors."""
    pools: tuple[str, ...] = ()
    gpu_count: int = 1
    cpu_flavor: str | None = None
    vcpu: int | None = None
    pools_from: str = ""              # where the pools came from, said beside a plan


@dataclass(frozen=True)
class EndpointPlan:
    body: dict[str, Any]              # a CreateEndpointRequest, schema-checked
    floating: tuple[str, ...]         # unresolved pins of the image it names
    secret_keys: frozenset[str]       # env variables that hold a secret reference
    compute: Compute

    @property
    def name(self) -> str:
        return str(self.body["name"])

    def to_json(self) -> str:
        return json.dumps(self.body, indent=2, ensure_ascii=False) + "\n"


def endpoint_name(target: Target) -> str:
    return default_name(target.name)


def default_name(target_name: str) -> str:
    """The endpoint a target's name makes, whether or not the target's file still exists."""
    return f"kiln-{target_name}"


def docs_pools(gpu_id: str) -> list[str]:
    """The serverless pools RunPod's docs table puts `gpu_id` in: each listed short name ("A40",
    "6000 Ada") whose words all appear in the type id ("NVIDIA A40")."""
    words = set(gpu_id.split())
    return sorted(pool for pool, names in schema.serverless_pools().items()
                  if any(set(n.split()) <= words for n in names))


def offline_compute(target: Target, *, pools: tuple[str, ...] = (), gpu_count: int | None = None,
                    cpu_flavor: str | None = None, vcpu: int | None = None, docs: bool = True) -> Compute:
    """The compute a plan names without asking RunPod: --pool, else (`docs`) the docs' pool table;
    without `docs`, no pool yet (`up` reads the live catalog)."""
    if not target.is_gpu:
        if pools:
            raise KilnError(f"--pool: {target.name} is a CPU target ([cuda] unset): its workers rent no GPU")
        if not cpu_flavor or not vcpu:
            raise KilnError(f"{target.name} is a CPU target: give --cpu-flavor (an id from RunPod's CPU catalog, "
                            "GET /v2/catalog/cpus) and --vcpu (a power of two, at least 2)")
        if vcpu < 2 or vcpu & (vcpu - 1):
            raise KilnError(f"--vcpu {vcpu}: RunPod's CPU workers come in powers of two vCPUs, at least 2 "
                            "(2, 4, 8, 16, ...)")
        return Compute(cpu_flavor=cpu_flavor, vcpu=vcpu)
    if cpu_flavor or vcpu:
        raise KilnError(f"--cpu-flavor/--vcpu: {target.name} is a GPU target ([cuda] is set)")
    count = target.runpod.gpu_count if gpu_count is None else gpu_count
    if count < 1:
        raise KilnError(f"--gpu-count {count}: a GPU worker has at least 1 GPU")
    if pools:
        return Compute(pools=tuple(pools), gpu_count=count, pools_from="--pool")
    gpu = target.runpod.gpu_type
    if not docs:
        return Compute(gpu_count=count)
    if not gpu:
        raise KilnError(f"{target.name} names no [runpod] gpu_type: give --pool (a serverless pool id, e.g. "
                        f"{', '.join(sorted(schema.serverless_pools())[:3])})")
    found = docs_pools(gpu)
    if len(found) != 1:
        table = "; ".join(f"{p}: {', '.join(n)}" for p, n in schema.serverless_pools().items())
        why = f"is in {len(found)} of them ({', '.join(found)})" if found else "is in none of them"
        raise KilnError(f"{gpu} {why} in RunPod's pool table ({table}): give --pool")
    return Compute(pools=tuple(found), gpu_count=count,
                   pools_from=f"RunPod's docs table puts {gpu} in {found[0]} (`up` asks the live catalog)")


def api_key_env(target: Target) -> str | None:
    """The variable the deploy config reads the engine's key from (server.api_key = env:NAME)."""
    kind, _, ref = target.deploy_config().server.api_key.partition(":")
    return ref if kind == "env" else None


def build_endpoint(target: Target, pins: Mapping[str, Pin], compute: Compute, *, scaling: Scaling = Scaling(),
                   repository: str | None = None, image: str | None = None, name: str | None = None,
                   registry: str | None = None, network_volume: tuple[str, str] | None = None,
                   no_volume: bool = False, extra_env: Mapping[str, str] | None = None) -> EndpointPlan:
    """The endpoint for `target`. `network_volume` is (volume id, its data center); `no_volume`
    says none explicitly (networkVolumes [], so an update detaches one); `extra_env` the deploy config
    a deployment carries (KILN_DEPLOY_CONFIG: deployment.py)."""
    bad = scaling.problems()
    if bad:
        raise KilnError("; ".join(bad))
    floating = tags.floating_keys(target, pins)
    ctx = render.make_context(target, dict(pins), allow_floating=True)
    cfg = target.deploy_config()
    rp = target.runpod
    if cfg.server.port == cfg.status.port:
        raise KilnError(f"{target.name}: server.port and status.port are both {cfg.server.port}: the engine "
                        "owns PORT, the health path needs its own PORT_HEALTH")
    key_env = api_key_env(target)
    env = {key: secret_ref(secret) for key, secret in rp.secrets if key != key_env}
    env.update(PORT=str(cfg.server.port), PORT_HEALTH=str(cfg.status.port), HEALTH_CHECK_PATH=HEALTH_CHECK_PATH,
               KILN_API_KEY_SOURCE="none")
    env.update(dict(rp.env))
    env.update(dict(extra_env or {}))
    body: dict[str, Any] = {
        "name": name or endpoint_name(target),
        "type": "LOAD_BALANCER",
        "image": image or tags.release_tag(target, pins, repository),
        "args": start_args(render.render_dockerfile(ctx)),
        "env": dict(sorted(env.items())),
        "ports": [f"{cfg.server.port}/http", f"{cfg.status.port}/http"],
        "disk": rp.container_disk_gb,
    }
    if compute.pools:
        gpu: dict[str, Any] = {"pools": list(compute.pools), "count": compute.gpu_count}
        floor = cuda_floor(target)
        if floor:
            gpu["minCudaVersion"] = floor
        body["gpu"] = gpu
    else:
        body["cpu"] = [{"id": compute.cpu_flavor, "vcpuCount": compute.vcpu}]
    body["workers"] = {"min": scaling.min_workers, "max": scaling.max_workers, "idleTimeout": scaling.idle_timeout_s}
    body["scaling"] = {"type": "REQUEST_COUNT", "requestCount": scaling.request_count}
    body["flashboot"] = scaling.flashboot
    if network_volume:
        body["networkVolumes"] = [network_volume[0]]
        body["dataCenterIds"] = [network_volume[1]]
    elif no_volume:
        body["networkVolumes"] = []
    if registry:
        body["registry"] = registry
    schema.check(body, "CreateEndpointRequest")
    secrets = frozenset(k for k, v in env.items() if v.startswith("{{ RUNPOD_SECRET_"))
    return EndpointPlan(body=body, floating=floating, secret_keys=secrets, compute=compute)
