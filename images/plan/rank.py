"""Every catalog GPU kind x count -> a plan, ranked: resident plans by $/1M output tokens at the asked
streams (a plan with no speed after those with one, by $/h), then offloaded plans (host-bound).

For each GPU kind of RunPod's catalog (`GET /v2/catalog/gpus`: memory in GB, price per GPU per hour,
maxCount, availability, cudaVersions) and each count from 1 to its maxCount: the memory per card
(supervisor/plan/fit.py), whether everything is VRAM-resident and what is not, the speed with its
basis (speed.py), the price, the `pods up` command and a deploy config whose ladder rungs match.
Only the smallest resident count of each kind is kept (a larger one holds the same model for more
per hour unless it is measured faster, in which case it is kept too), and the largest offloaded one.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from supervisor.plan import fit, memory
from supervisor.plan.shape import Shape

from . import speed as speeds

# field notes § "Kimi-Linear: tokenizer, tool parser, headroom": 0.93 OOMed at the last step, 0.90 fits
VLLM_UTILIZATION = 0.90


@dataclass(frozen=True)
class Plan:
    gpu: str
    count: int
    usd_h: float
    availability: str           # the catalog's, for one GPU of the kind (asked with count=1)
    cuda: tuple[str, ...]
    engine: str
    placement: fit.Placement
    speed: speeds.Speed
    usd_per_m: float | None
    command: str                # the deploy command ("" where no image serves this GPU kind)
    deploy_config: str
    notes: tuple[str, ...] = field(default=())
    commands: tuple[str, ...] = field(default=())     # what to run, in order (plan's CLI fills it in)

    @property
    def resident(self) -> bool:
        return self.placement.resident


def _estimate(shape: Shape, engine: str, ctx: int, streams: int, kv_type: str) -> memory.Estimate:
    """llama.cpp: `streams` slots of `ctx` tokens each (-c streams x ctx over --parallel streams: the cache
    is allocated whole at start). vLLM: one sequence of `ctx` (what it refuses to start without); its
    paged cache holds as many more as fit, said in the plan's notes (_concurrency)."""
    if engine == "llamacpp":
        return memory.llamacpp(shape, ctx * streams, streams=streams, kv_type=kv_type)
    return memory.vllm(shape, ctx, streams=streams, kv_type=kv_type)


def _concurrency(kv_tokens: int, ctx: int, streams: int) -> tuple[str, ...]:
    """vLLM's paged KV cache: how many whole contexts it holds at once, against the asked streams."""
    if streams <= 1 or kv_tokens <= 0:
        return ()
    whole = kv_tokens // ctx
    if whole >= streams:
        return (f"vLLM's KV cache holds {whole} sequences of the full {ctx:,} tokens: {streams} streams fit at any "
                "length",)
    return (f"vLLM's KV cache holds {whole} sequence(s) of the full {ctx:,} tokens ({kv_tokens:,} tokens): "
            f"{streams} streams all run while they average under {kv_tokens // streams:,} tokens; longer ones wait",)


def _toml(value: Any) -> str:
    return "[" + ", ".join(_toml(v) for v in value) + "]" if isinstance(value, (list, tuple)) else json.dumps(value)


def deploy_config(model: dict[str, Any], engine: str, *, ctx: int, count: int, kv_type: str,
                  predictions: dict[str, Any] | None = None, streams: int = 1) -> str:
    """A deploy config whose ladder is the plan: autofit with no placement flag (a pinned -ngl,
    --tensor-split or -ot turns autofit off: field notes § "Autofit and placement flags"), then half the
    context; vLLM at the plan's utilization and tensor parallelism, then half the context. Never past
    `ctx` (which `plan` checked against the model's trained context). [hardware] gpu_count is the
    plan's: the supervisor refuses a pod of another count, and `pods up` before renting it.
    With `streams` > 1, llama.cpp gets that many slots of `ctx` each (-c streams x ctx, --parallel,
    --kv-unified-per-slot ctx) and keeps one unified KV cache (--kv-unified: an explicit --parallel turns it
    off in the pinned build, and
    the server then splits a step into one micro-batch per run of consecutive slot ids, each reading
    every weight again: measured up to 2x slower steps at 2 and 4 streams, docs/benchmarks.md P19).
    vLLM batches continuously; its slot count stays its own."""
    half = min(ctx, max(4096, ctx // 2))
    lines = [f"# written by `python build.py plan` for {count} GPU(s); review before publishing",
             f'engine = "{engine}"', 'state_dir = "/workspace/kiln"', "", "[model]",
             *(f"{k} = {_toml(v)}" for k, v in model.items()),
             "", "[server]", "port = 8080", 'api_key = "env:KILN_API_KEY"', "",
             "[ladder]", 'fall_through = ["oom", "config_rejected"]', ""]
    for name, c in ((f"plan-{ctx}", ctx), (f"plan-{half}", half)):
        if engine == "llamacpp":
            args = ["--ctx-size", str(c * streams)] + (["--cache-type-k", kv_type, "--cache-type-v", kv_type]
                                                        if kv_type != "f16" else [])
            if streams > 1:         # each slot up to the context (server-context.cpp n_ctx_slot()), in one pool
                args += ["--parallel", str(streams), "--kv-unified", "--kv-unified-per-slot", str(c)]
            lines += ["[[ladder.rungs]]", f'name = "{name}"', 'placement = "autofit"',
                      "args = [" + ", ".join(f'"{a}"' for a in args) + "]", ""]
        else:
            args = ["--max-model-len", str(c), "--gpu-memory-utilization", f"{VLLM_UTILIZATION:g}"]
            if kv_type != "auto":
                args += ["--kv-cache-dtype", kv_type]
            if count > 1:
                args += ["--tensor-parallel-size", str(count)]
            lines += ["[[ladder.rungs]]", f'name = "{name}"', "args = [" + ", ".join(f'"{a}"' for a in args) + "]", ""]
        if c == half:
            break
    lines += ["[hardware]", f"gpu_count = {count}", ""]
    if predictions:     # [plan]: the pod's GPU kind and count (`pods up` rents them), and what it checks itself against
        lines += ["[plan]", *(f"{k} = {_toml(v)}" for k, v in predictions.items() if v not in (None, 0, "")), ""]
    return "\n".join(lines)


def command(target: str | None, config_file: str, cloud: str = "secure") -> str:
    """The deploy command: the target's image serving the config `plan --write-config` wrote (its [plan]
    table names the GPU kind and count)."""
    if target is None:
        return ""
    cloud_flag = [] if cloud.upper() == "SECURE" else ["--cloud", cloud.upper()]     # SECURE: pods up's default
    return shlex.join(["python", "build.py", "pods", "up", "--target", target, "--config", config_file, *cloud_flag])


def plans(shape: Shape, name: str, model: dict[str, Any], catalog: list[dict[str, Any]], *, engine: str, ctx: int, streams: int,
          kv_type: str, targets: dict[str, str | None], max_usd_h: float | None = None,
          cloud: str = "secure", config_file: str = "model.toml", count: int | None = None) -> list[Plan]:
    """`targets`: GPU id -> the target that serves `engine` there (None: none does). `count`: only pods
    of that many GPUs (`plan --count`, which `--write-config` is asked with)."""
    est = _estimate(shape, engine, ctx, streams, kv_type)
    out: list[Plan] = []
    for g in catalog:
        price = (g.get("price") or {}).get(cloud)
        top = (g.get("maxCount") or {}).get(cloud) or 0
        if price is None or not g.get(cloud, True):
            continue
        card = int(g["memory"]) * 10**9                       # the catalog's "VRAM in GB"
        kept: list[Plan] = []
        for n in range(1, int(top) + 1):
            if count is not None and n != count:
                continue
            usd_h = float(price) * n
            if max_usd_h is not None and usd_h > max_usd_h:
                break
            if engine == "llamacpp":
                placed = fit.llamacpp(shape, est, count=n, card_bytes=card)
            else:
                placed = fit.vllm(shape, est, count=n, card_bytes=card, utilization=VLLM_UTILIZATION)
            sp = speeds.estimate(shape, name, engine=engine, gpu=g["id"], count=n, resident=placed.resident,
                                 streams=streams, kv_bytes_per_token=float(est.kv_bytes_per_token), ctx=ctx)
            # vLLM takes gpu_memory_utilization of every card whatever the model needs (the rest is KV cache).
            card_mib = int(VLLM_UTILIZATION * card) if engine == "vllm" else max(placed.per_card_bytes)
            predictions: dict[str, Any] = {"gpu": g["id"], "cards": n}
            if placed.resident:
                predictions |= {"card_mib": card_mib // 2**20,
                                "kv_tokens": memory.vllm_kv_tokens(shape, card_bytes=card, utilization=VLLM_UTILIZATION,
                                                                   kv_type=kv_type, tp=n) if engine == "vllm" else 0,
                                # measured or estimated (a bound is no prediction to check a pod against)
                                "decode_tok_s": round(sp.decode_1, 2) if sp.decode_1 and not _bound(sp) else 0,
                                "basis": sp.basis if sp.decode_1 and not _bound(sp) else ""}
            plan = Plan(gpu=g["id"], count=n, usd_h=usd_h, availability=str(g.get("availability", "")),
                        cuda=tuple(v["version"] for v in g.get("cudaVersions", []) if v.get("available")),
                        engine=engine, placement=placed, speed=sp, usd_per_m=speeds.usd_per_million(usd_h, sp.decode_n),
                        command=command(targets.get(g["id"]), config_file, cloud),
                        deploy_config=deploy_config(model, engine, ctx=ctx, count=n, kv_type=kv_type,
                                                    predictions=predictions, streams=streams),
                        notes=tuple(shape.notes) + placed.notes
                        + (_concurrency(predictions.get("kv_tokens", 0), ctx, streams) if engine == "vllm" else ()))
            kept.append(plan)
        out += _keep(kept)
    return sorted(out, key=_rank)


def _bound(sp: speeds.Speed) -> bool:
    return sp.basis.startswith("upper bound")


def _keep(per_count: list[Plan]) -> list[Plan]:
    resident = [p for p in per_count if p.resident]
    off = [p for p in per_count if not p.resident]
    keep = resident[:1] + [p for p in resident[1:] if p.speed.measured]
    if off and (not off[-1].speed.measured):
        keep.append(off[-1])
    keep += [p for p in off if p.speed.measured]
    return list(dict.fromkeys(keep))


def _rank(p: Plan) -> tuple[int, int, float, float]:
    return (0 if p.resident else 1, 0 if p.usd_per_m is not None else 1,
            p.usd_per_m if p.usd_per_m is not None else 0.0, p.usd_h)


def no_fit_reason(shape: Shape, engine: str, ctx: int, kv_type: str, catalog: list[dict[str, Any]],
                  cloud: str = "secure") -> str:
    """Why no catalog GPU holds the model resident, and what context would (never more than the model was
    trained for, never a negative one)."""
    est = _estimate(shape, engine, ctx, 1, kv_type)
    biggest = max((int(g["memory"]) * 10**9 * int((g.get("maxCount") or {}).get(cloud) or 1) for g in catalog),
                  default=0)
    parts = [(f"weights {est.weights_bytes / 2**30:.1f} GiB + KV {est.kv_bytes / 2**30:.1f} GiB at {ctx} tokens; "
              f"the largest pod in the catalog has {biggest / 2**30:.0f} GiB of VRAM")]
    room = biggest * 0.9 - est.weights_bytes
    fits = int(room / float(est.kv_bytes_per_token)) if room > 0 and float(est.kv_bytes_per_token) > 0 else 0
    if shape.trained_ctx:
        fits = min(fits, shape.trained_ctx)
    if fits >= ctx:
        parts.append("the context is not what leaves it out: the weights and cache together need more cards than "
                     "the catalog's largest pod")
    elif fits > 0:
        parts.append(f"a context of about {fits:,} tokens would leave room for the weights")
    else:
        parts.append("the weights alone do not fit: a smaller quantization is needed")
    return "; ".join(parts)
