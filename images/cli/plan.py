"""`plan --model SRC`: what to rent for a model, before renting (issue 39).

Reads the model's shape (images/plan/source.py: a local GGUF, an hf:// GGUF's headers by range, an
hf:// safetensors repo's config.json and index), RunPod's GPU catalog (GET /v2/catalog/gpus, with
RUNPOD_API_KEY from the environment, --api / $RUNPOD_API_URL for another API), and prints the plans
ranked by $/1M output tokens among those that hold the model VRAM-resident (images/plan/rank.py),
each with its memory per card, its speed and the basis of that speed, the `pods up` command and a
deploy config whose ladder matches. --json adds the model's weights_bytes and kv_bytes_per_token as
the engine counts them. Exit 0 with at least one resident plan, 1 when none holds it (the answer
says why and what would), 2 on a usage or API error.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from supervisor.errors import KilnError
from supervisor.plan import memory

from ..plan import rank, source
from ..target import load_target, target_names
from .command import Command
from .pods import _api as runpod_api

EXIT_NO_RESIDENT_PLAN = 1
DEFAULT_KV = {"llamacpp": "f16", "vllm": "auto"}
SHOWN = 8


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="SRC",
                   help="a local GGUF (a split set by its first shard), hf://OWNER/REPO/FILE.gguf[@REV] (headers "
                        "only, by range) or hf://OWNER/REPO[@REV] (safetensors: config.json + index)")
    p.add_argument("--ctx", type=int, default=32768, help="context the plan must hold, in tokens (default 32768)")
    p.add_argument("--streams", type=int, default=1, help="concurrent streams $/1M is priced at (default 1)")
    p.add_argument("--engine", choices=("llamacpp", "vllm"), help="default: llamacpp for a GGUF, vllm for safetensors")
    p.add_argument("--kv-type", help="KV cache type: llama.cpp f16|q8_0|q4_0|... (default f16), vLLM "
                   "auto|fp8|... (default auto)")
    p.add_argument("--gpu", action="append", metavar="ID", help="only this GPU type id of the catalog (repeatable)")
    p.add_argument("--max-usd-h", type=float, metavar="X", help="leave out pods that cost more than X $/h")
    p.add_argument("--cloud", choices=("secure", "community"), default="secure")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--api", metavar="URL", help="RunPod REST API v2 base URL (default: $RUNPOD_API_URL or "
                   "https://api.runpod.io/v2)")


def _check(args: argparse.Namespace) -> None:
    bad = [f"--{k.replace('_', '-')} {v}: must be at least 1" for k, v in (("ctx", args.ctx), ("streams", args.streams))
           if v < 1]
    if args.max_usd_h is not None and args.max_usd_h <= 0:
        bad.append(f"--max-usd-h {args.max_usd_h}: must be more than 0")
    if bad:
        raise KilnError("; ".join(bad))


_FAMILY = re.compile(r'^family\s*=\s*"([^"]+)"', re.MULTILINE)


def _targets(src: str) -> dict[tuple[str, str], str]:
    """(engine, GPU id) -> a target that builds for it: one whose deploy config serves this repo, else
    one whose model family the source names, else the first."""
    best: dict[tuple[str, str], tuple[int, str]] = {}
    repo, low = src.split("@")[0].rstrip("/"), src.lower()
    for name in target_names():
        try:
            t = load_target(name)
            text = t.deploy_config_path.read_text(errors="replace")
        except (KilnError, OSError):
            continue
        family = _FAMILY.search(text)
        score = 2 if repo in text else 1 if family and family.group(1) in low else 0
        key = (t.engine, t.runpod.gpu_type or "")
        if key not in best or score > best[key][0]:
            best[key] = (score, name)
    return {k: name for k, (_, name) in best.items()}


def _plan_json(p: rank.Plan) -> dict[str, Any]:
    return {"gpu": p.gpu, "count": p.count, "usd_h": round(p.usd_h, 4), "availability_of_one": p.availability,
            "cuda": list(p.cuda), "resident": p.resident, "per_card_bytes": list(p.placement.per_card_bytes),
            "host_layers": list(p.placement.host_layers), "host_bytes": p.placement.host_bytes,
            "why": p.placement.why, "decode_tok_s_1": p.speed.decode_1, "decode_tok_s": p.speed.decode_n,
            "streams": p.speed.streams, "prefill_tok_s": p.speed.prefill, "speed_basis": p.speed.basis,
            "speed_measured": p.speed.measured, "usd_per_1m": p.usd_per_m, "command": p.command,
            "deploy_config": p.deploy_config, "notes": list(p.notes)}


def _line(i: int, p: rank.Plan) -> str:
    cards = " ".join(f"{b / 2**30:.1f}" for b in p.placement.per_card_bytes)
    where = "resident" if p.resident else f"OFFLOADED: {len(p.placement.host_layers)} layers on the host"
    cost = f"${p.usd_per_m:.3f}/1M" if p.usd_per_m is not None else "$/1M unknown"
    rate = f"{p.speed.decode_n:g} tok/s at {p.speed.streams} streams" if p.speed.decode_n else "speed unknown"
    out = [f"{i}. {p.count}x {p.gpu}  ${p.usd_h:.2f}/h  {where}  GiB per card: {cards}",
           f"   {rate}, {cost}  ({p.speed.basis})"]
    if p.placement.why:
        out.append(f"   {p.placement.why}")
    out.append(f"   {p.command}")
    return "\n".join(out)


def _capped(max_usd_h: float | None, ranked) -> str | None:
    """Why no plan is resident when the price cap, not the memory, is what left none: the cheapest
    resident plan without the cap; None when there is none either (then the memory says why)."""
    if max_usd_h is None:
        return None
    uncapped = [p for p in ranked(None) if p.resident]
    if not uncapped:
        return None
    cheapest = min(uncapped, key=lambda p: p.usd_h)
    return (f"--max-usd-h {max_usd_h:g}: the cheapest pod that holds it VRAM-resident is {cheapest.count}x "
            f"{cheapest.gpu} at ${cheapest.usd_h:.2f}/h; raise the cap to at least that")


def run(args: argparse.Namespace) -> int:
    _check(args)
    src = source.read(args.model)
    engine = args.engine or src.engine_hint
    if engine != src.engine_hint:
        want = "a safetensors repo (hf://OWNER/REPO)" if engine == "vllm" else "a GGUF (a local file or hf://.../FILE.gguf)"
        raise KilnError(f"--engine {engine} --model {args.model}: Kiln plans {engine} for {want}; leave --engine out "
                        f"to plan this source for {src.engine_hint}")
    kv = args.kv_type or DEFAULT_KV[engine]
    try:
        per_token = memory.kv_bytes_per_token(src.shape, engine, kv)    # before RunPod is asked anything
    except KilnError as e:                                              # a cache type the engine does not know
        raise KilnError(f"--kv-type {kv}: {e}") from None
    catalog = runpod_api(args).gpu_types(cloud=args.cloud.upper())
    if args.gpu:
        unknown = sorted(set(args.gpu) - {g["id"] for g in catalog})
        if unknown:
            raise KilnError(f"--gpu {', '.join(unknown)}: not in RunPod's catalog (one of: "
                            f"{', '.join(sorted(g['id'] for g in catalog))})")
        catalog = [g for g in catalog if g["id"] in args.gpu]
    def ranked(max_usd_h: float | None) -> list[rank.Plan]:
        return rank.plans(src.shape, src.name, src.model_table, catalog, engine=engine, ctx=args.ctx,
                          streams=args.streams, kv_type=kv, targets=_targets(args.model), max_usd_h=max_usd_h,
                          cloud=args.cloud)

    plans = ranked(args.max_usd_h)
    resident = [p for p in plans if p.resident]
    no_fit = None
    if not resident:            # the price cap, when it is what left none; else the memory
        no_fit = _capped(args.max_usd_h, ranked) or rank.no_fit_reason(src.shape, engine, args.ctx, kv, catalog,
                                                                       args.cloud)
    if args.json:
        print(json.dumps({
            "model": {"src": args.model, "engine": engine, "kv_type": kv, "ctx": args.ctx, "streams": args.streams,
                      "weights_bytes": src.shape.weights_bytes, "kv_bytes_per_token": float(per_token),
                      "weights_by_kind": dict(src.shape.weights_by_kind), "n_layers": src.shape.n_layers,
                      "cache_layers": src.shape.cache_layers, "notes": list(src.shape.notes)},
            "plans": [_plan_json(p) for p in plans], "no_fit": no_fit}, indent=2))
    else:
        print(f"{args.model}: {engine}, weights {src.shape.weights_bytes / 2**30:.2f} GiB, KV {float(per_token):,.0f} "
              f"B/token ({kv}; {src.shape.cache_layers} of {src.shape.n_layers} layers cache), ctx {args.ctx}, "
              f"{args.streams} stream(s)")
        for i, p in enumerate(plans[:SHOWN], 1):
            print(_line(i, p))
        if len(plans) > SHOWN:
            print(f"... {len(plans) - SHOWN} more (--json lists every plan)")
        if no_fit:
            print(f"no resident plan: {no_fit}" if no_fit.startswith("--max-usd-h")
                  else f"no catalog GPU holds it VRAM-resident: {no_fit}")
        elif resident:
            print(f"\ndeploy config for plan 1 (its ladder matches the plan):\n{plans[0].deploy_config}")
    if no_fit:
        print(f"no resident plan: {no_fit}", file=sys.stderr)
    return 0 if resident else EXIT_NO_RESIDENT_PLAN


COMMANDS = (
    Command("plan", "what to rent for a model: the pods that hold it VRAM-resident, ranked by $/1M", run,
            _arguments, description=__doc__.split("\n\n")[1].replace("\n", " ")),
)
