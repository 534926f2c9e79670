"""`plan --model SRC`: what to rent for a model, before renting (issue 39).

Reads the model's shape (images/plan/source.py: a local GGUF, an hf:// GGUF's headers by range, an
hf:// safetensors repo's config.json and index), RunPod's GPU catalog (GET /v2/catalog/gpus, with
RUNPOD_API_KEY from the environment, --api / $RUNPOD_API_URL for another API), and prints the plans
ranked by $/1M output tokens among those that hold the model VRAM-resident (images/plan/rank.py),
each with its memory per card, its speed and the basis of that speed, and a deploy config whose ladder
matches. The context is never planned past what the model was trained for (the GGUF's context_length,
config.json's max_position_embeddings with its RoPE scaling, as the engine reads them); --ctx above it is
refused with the limit. Each plan ends in the two commands that deploy it: `plan ... --gpu G --count N
--write-config FILE` (the plan's deploy config) and `pods up --target T --config FILE` (the image that
runs this engine on that GPU kind; where none does, what target to add). --json adds the model's
weights_bytes and kv_bytes_per_token as the engine counts them. Exit 0 with at least one resident plan,
1 when none holds it (the answer says why and what would), 2 on a usage or API error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from supervisor.errors import KilnError
from supervisor.plan import memory

from ..plan import rank, source, targets
from .command import Command
from .pods import _api as runpod_api

EXIT_NO_RESIDENT_PLAN = 1
DEFAULT_KV = {"llamacpp": "f16", "vllm": "auto"}
DEFAULT_CTX = 32768
SHOWN = 8
WRITTEN_BY = "# written by `python build.py plan`"      # the first line of every config plan writes


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="SRC",
                   help="a local GGUF (a split set by its first shard), hf://OWNER/REPO/FILE.gguf[@REV] (headers "
                        "only, by range) or hf://OWNER/REPO[@REV] (safetensors: config.json + index)")
    p.add_argument("--ctx", type=int, help=f"context the plan must hold, in tokens (default {DEFAULT_CTX:,}, or what "
                   "the model was trained for when that is less; never more)")
    p.add_argument("--streams", type=int, default=1, help="concurrent streams $/1M is priced at (default 1)")
    p.add_argument("--engine", choices=("llamacpp", "vllm"), help="default: llamacpp for a GGUF, vllm for safetensors")
    p.add_argument("--kv-type", help="KV cache type: llama.cpp f16|q8_0|q4_0|... (default f16), vLLM "
                   "auto|fp8|... (default auto)")
    p.add_argument("--gpu", action="append", metavar="ID", help="only this GPU type id of the catalog (repeatable)")
    p.add_argument("--count", type=int, metavar="N", help="only pods of N GPUs")
    p.add_argument("--write-config", metavar="FILE", help="write the first plan's deploy config to FILE (a new file, "
                   "or one an earlier plan wrote), for `pods up --target T --config FILE`")
    p.add_argument("--max-usd-h", type=float, metavar="X", help="leave out pods that cost more than X $/h")
    p.add_argument("--cloud", choices=("secure", "community"), default="secure")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--api", metavar="URL", help="RunPod REST API v2 base URL (default: $RUNPOD_API_URL or "
                   "https://api.runpod.io/v2)")


def _check(args: argparse.Namespace) -> None:
    bad = [f"--{k.replace('_', '-')} {v}: must be at least 1" for k, v in
           (("ctx", args.ctx), ("streams", args.streams), ("count", args.count)) if v is not None and v < 1]
    if args.max_usd_h is not None and args.max_usd_h <= 0:
        bad.append(f"--max-usd-h {args.max_usd_h}: must be more than 0")
    if bad:
        raise KilnError("; ".join(bad))


def _local_note(src: source.Source) -> str | None:
    where = str(src.model_table.get("source", ""))
    if where.startswith("hf://"):
        return None
    return (f"the deploy config's model is this machine's file {where}: a RunPod pod cannot read it. Upload it to the "
            "Hub and plan hf://OWNER/REPO/FILE.gguf (or set [model] source to where the pod finds it)")


def _plan_json(p: rank.Plan) -> dict[str, Any]:
    return {"gpu": p.gpu, "count": p.count, "usd_h": round(p.usd_h, 4), "availability_of_one": p.availability,
            "cuda": list(p.cuda), "resident": p.resident, "per_card_bytes": list(p.placement.per_card_bytes),
            "host_layers": list(p.placement.host_layers), "host_bytes": p.placement.host_bytes,
            "why": p.placement.why, "decode_tok_s_1": p.speed.decode_1, "decode_tok_s": p.speed.decode_n,
            "streams": p.speed.streams, "decode_tok_s_1_at_ctx": p.speed.decode_1_at_ctx,
            "bound_tok_s_1": p.speed.bound_1, "prefill_tok_s": p.speed.prefill, "speed_basis": p.speed.basis,
            "speed_measured": p.speed.measured, "usd_per_1m": p.usd_per_m, "command": p.command,
            "commands": list(p.commands), "deploy_config": p.deploy_config, "notes": list(p.notes)}


def _line(i: int, p: rank.Plan) -> str:
    cards = " ".join(f"{b / 2**30:.1f}" for b in p.placement.per_card_bytes)
    where = "resident" if p.resident else f"OFFLOADED: {len(p.placement.host_layers)} layers on the host"
    cost = f"${p.usd_per_m:.3f}/1M" if p.usd_per_m is not None else "$/1M unknown"
    if p.speed.decode_n and not p.speed.measured and p.speed.decode_1 and p.speed.bound_1:
        rate = (f"~{p.speed.decode_n:.0f} tok/s at {p.speed.streams} stream(s), ~{p.speed.decode_1:.0f} for one"
                + (f" (~{p.speed.decode_1_at_ctx:.0f} at the full context)" if p.speed.decode_1_at_ctx else ""))
    else:
        rate = f"{p.speed.decode_n:g} tok/s at {p.speed.streams} streams" if p.speed.decode_n else "speed unknown"
    out = [f"{i}. {p.count}x {p.gpu}  ${p.usd_h:.2f}/h  {where}  GiB per card: {cards}",
           f"   {rate}, {cost}  ({p.speed.basis})"]
    if p.placement.why:
        out.append(f"   {p.placement.why}")
    out += [f"   {c}" for c in p.commands]
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


def _context(args: argparse.Namespace, shape: Any, engine: str) -> tuple[int, str | None]:
    """The context to plan: --ctx, else the default; never past what the model was trained for."""
    trained, where = shape.trained_ctx, shape.trained_ctx_from
    if args.ctx is None:
        if trained and trained < DEFAULT_CTX:
            return trained, f"context {trained:,}: what the model was trained for ({where}), under the default {DEFAULT_CTX:,}"
        return DEFAULT_CTX, None if trained else "the model's trained context is not in its header or config: not checked"
    if trained and args.ctx > trained:
        does = "refuses a --max-model-len past it" if engine == "vllm" else "warns and degrades past it"
        raise KilnError(f"--ctx {args.ctx:,}: the model was trained for at most {trained:,} tokens ({where}); the "
                        f"engine {does}. Fix: --ctx {trained} or less")
    return args.ctx, None if trained else "the model's trained context is not in its header or config: not checked"


def _config_name(src: source.Source) -> str:
    stem = Path(src.name.rstrip("/")).name.removesuffix(".gguf")
    return (re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-.") or "model") + ".toml"


def _write_config(path: str, text: str) -> None:
    """A new file, or one `plan` wrote before (its first line says so): never a file of the user's."""
    out = Path(path)
    if out.exists():
        try:
            first = out.read_text(encoding="utf-8", errors="replace").splitlines()[:1]
        except OSError as e:
            raise KilnError(f"--write-config {path}: cannot read it ({e.strerror})") from None
        if not first or not first[0].startswith(WRITTEN_BY):
            raise KilnError(f"--write-config {path}: the file exists and `plan` did not write it; nothing was written. "
                            "Fix: another file name, or move it away")
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text + ("\n" if not text.endswith("\n") else ""), encoding="utf-8")
    tmp.replace(out)


def _commands(args: argparse.Namespace, p: rank.Plan, engine: str, kv: str, ctx: int, file: str, written: bool,
              advice: str) -> tuple[str, ...]:
    write = ["python", "build.py", "plan", "--model", args.model, "--ctx", str(ctx)]
    write += (["--engine", engine] if args.engine else []) + (["--kv-type", kv] if args.kv_type else [])
    write += (["--streams", str(args.streams)] if args.streams != 1 else [])
    write += (["--cloud", args.cloud] if args.cloud != "secure" else [])
    write += ["--gpu", p.gpu, "--count", str(p.count), "--write-config", file]
    deploy = p.command or f"# {advice}"
    return (deploy,) if written else (shlex.join(write), deploy)


def run(args: argparse.Namespace) -> int:
    _check(args)
    src = source.read(args.model)
    engine = args.engine or src.engine_hint
    if engine != src.engine_hint:
        want = "a safetensors repo (hf://OWNER/REPO)" if engine == "vllm" else "a GGUF (a local file or hf://.../FILE.gguf)"
        raise KilnError(f"--engine {engine} --model {args.model}: Kiln plans {engine} for {want}; leave --engine out "
                        f"to plan this source for {src.engine_hint}")
    kv = args.kv_type or DEFAULT_KV[engine]
    ctx, ctx_note = _context(args, src.shape, engine)
    args.ctx = ctx
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
    chosen = {g["id"]: targets.choose(engine, g["id"]) for g in catalog}
    file = args.write_config or _config_name(src)

    def ranked(max_usd_h: float | None) -> list[rank.Plan]:
        return rank.plans(src.shape, src.name, src.model_table, catalog, engine=engine, ctx=args.ctx,
                          streams=args.streams, kv_type=kv, targets={k: c.target for k, c in chosen.items()},
                          max_usd_h=max_usd_h, cloud=args.cloud, config_file=file, count=args.count)

    plans = ranked(args.max_usd_h)
    written = bool(args.write_config and plans)
    if args.write_config and not plans:
        raise KilnError(f"--write-config {args.write_config}: no plan to write (no catalog GPU kind matched the "
                        "filters); nothing was written")
    if written:
        _write_config(args.write_config, plans[0].deploy_config)
    plans = [dataclasses.replace(p, commands=_commands(args, p, engine, kv, ctx, file, written and i == 0,
                                                       chosen[p.gpu].note))
             for i, p in enumerate(plans)]
    notes = [n for n in (ctx_note, _local_note(src)) if n]
    resident = [p for p in plans if p.resident]
    no_fit = None
    if not resident:            # the price cap, when it is what left none; else the memory
        no_fit = _capped(args.max_usd_h, ranked) or rank.no_fit_reason(src.shape, engine, args.ctx, kv, catalog,
                                                                       args.cloud)
    if args.json:
        print(json.dumps({
            "model": {"src": args.model, "engine": engine, "kv_type": kv, "ctx": args.ctx, "streams": args.streams,
                      "trained_ctx": src.shape.trained_ctx, "trained_ctx_from": src.shape.trained_ctx_from,
                      "weights_bytes": src.shape.weights_bytes, "active_bytes": src.shape.active_bytes,
                      "kv_bytes_per_token": float(per_token),
                      "weights_by_kind": dict(src.shape.weights_by_kind), "n_layers": src.shape.n_layers,
                      "cache_layers": src.shape.cache_layers, "notes": list(src.shape.notes)},
            "plans": [_plan_json(p) for p in plans], "no_fit": no_fit, "notes": notes,
            "written": args.write_config if written else None}, indent=2))
    else:
        print(f"{args.model}: {engine}, weights {src.shape.weights_bytes / 2**30:.2f} GiB, KV {float(per_token):,.0f} "
              f"B/token ({kv}; {src.shape.cache_layers} of {src.shape.n_layers} layers cache), ctx {args.ctx}, "
              f"{args.streams} stream(s)")
        for note in notes:
            print(f"note: {note}")
        for i, p in enumerate(plans[:SHOWN], 1):
            print(_line(i, p))
        if len(plans) > SHOWN:
            print(f"... {len(plans) - SHOWN} more (--json lists every plan)")
        if no_fit:
            print(f"no resident plan: {no_fit}" if no_fit.startswith("--max-usd-h")
                  else f"no catalog GPU holds it VRAM-resident: {no_fit}")
        if written:
            print(f"\nwrote plan 1's deploy config to {args.write_config}; deploy it with:\n  {plans[0].commands[0]}")
        elif resident:
            print(f"\ndeploy config for plan 1 (its ladder matches the plan; its first command above writes it):\n"
                  f"{plans[0].deploy_config}")
    if no_fit:
        print(f"no resident plan: {no_fit}", file=sys.stderr)
    return 0 if resident else EXIT_NO_RESIDENT_PLAN


COMMANDS = (
    Command("plan", "what to rent for a model: the pods that hold it VRAM-resident, ranked by $/1M", run,
            _arguments, description=__doc__.split("\n\n")[1].replace("\n", " ")),
)
