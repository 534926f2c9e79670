"""The deploy config: what the supervisor serves, and how.

TOML → validated (every problem at once) → frozen dataclasses. The image bakes
the target's default at /etc/kiln/deploy.toml; a few named fields can be
overridden from the environment (ENV_OVERRIDES), which RunPod templates use;
a published config replaces the whole file through the watcher ([watch],
supervisor/reload/watch.py), except what the supervisor reads only at boot ([watch],
state_dir, [status], [runpod], [serverless], server.tcp_port: supervisor/reload/boot_only.py): a
published config may repeat those, and one that changes them is rejected by name.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import ipaddress
import json
import os
import re
import tomllib
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError
from .failure import FailureClass
from . import runpod_env as serverless_contract
from .runpod_env import volume_state_dir
from .validate import Problem, Reader, raise_if, read_text

ENGINES = ("llamacpp", "vllm", "router")   # the first is the default; router: smg in front of replicas
DEFAULT_STATE_DIR = "/workspace/kiln"
# autofit: llama.cpp fits placement itself (no pins). manual: the rung's own explicit -ot ranges.
# balanced: Kiln plans -ot ranges from the model's layout and free VRAM, calibrating from
# shortfalls. cpu: no offload. engine: no Kiln placement guard (vLLM, and raw experiments).
PLACEMENTS = ("autofit", "manual", "balanced", "cpu", "engine")
FAILURE_CLASSES = FailureClass.names()
SELFTEST_MODES = ("auto", "gate", "full")
# The selftest's probe sets by name (their probes: selftest/probes.py SETS, which a test keeps equal).
PROBE_SETS = ("generic", "smollm2", "kimi-k3", "kimi-linear", "qwen3-coder")
# Branches of the watch repo that are Kiln's own: where pods report (fleet/record.py) and where a
# canary publish goes first. A pod never watches them.
FLEET_BRANCH = "kiln-fleet"
CANARY_PREFIX = "kiln-canary/"
DEFAULT_FALL_THROUGH = (FailureClass.OOM.value, FailureClass.CONFIG_REJECTED.value)
# The router's "binary" is the Python that has its pinned package (smg): the supervisor's own venv in an image.
DEFAULT_BINARIES = {"llamacpp": "/opt/kiln/engine/bin/llama-server", "vllm": "vllm",
                    "router": "/opt/kiln/venv/bin/python3"}
DEFAULT_SNAPSHOTS = {"llamacpp": "/opt/kiln/engine/share/kiln/llama-server.help.txt",
                     "vllm": "/opt/kiln/engine/share/kiln/vllm-serve.help.txt"}

# Fields the environment may override: env name -> (dotted path, type).
ENV_OVERRIDES: dict[str, tuple[str, type]] = {
    "KILN_MODEL_SOURCE": ("model.source", str),
    "KILN_MODEL_REVISION": ("model.revision", str),
    "KILN_MODEL_ENTRY": ("model.entry", str),
    "KILN_MODEL_FAMILY": ("model.family", str),
    "KILN_MODEL_FETCH_CONNECTIONS": ("model.fetch_connections", int),
    "KILN_SERVER_PORT": ("server.port", int),
    "KILN_TCP_PORT": ("server.tcp_port", int),
    "KILN_API_KEY_SOURCE": ("server.api_key", str),
    "KILN_STATUS_PORT": ("status.port", int),
    "KILN_LADDER_START": ("ladder.start", str),
    "KILN_GPU_COUNT": ("hardware.gpu_count", int),
    "KILN_STATE_DIR": ("state_dir", str),
    "KILN_SELFTEST_ENABLED": ("selftest.enabled", bool),
    "KILN_SELFTEST_MODE": ("selftest.mode", str),
    "KILN_WATCH_REPO": ("watch.repo", str),
    "KILN_WATCH_BRANCH": ("watch.branch", str),
    "KILN_WATCH_PATH": ("watch.path", str),
    "KILN_WATCH_POLL_S": ("watch.poll_s", float),
    "KILN_WATCH_DIR": ("watch.dir", str),
    "KILN_RUNPOD_TERMINATE_ON_TERMINAL_FAILURE": ("runpod.terminate_on_terminal_failure", bool),
    "KILN_SERVERLESS_EXIT_GRACE_S": ("serverless.exit_grace_s", float),
    "KILN_SERVERLESS_FAILURE_TTL_S": ("serverless.failure_ttl_s", float),
    "KILN_SERVERLESS_VOLUME": ("serverless.volume", str),
    "KILN_STARTUP_LOAD_MODE": ("startup.load_mode", str),
    "KILN_STARTUP_OPTIMIZATION_LEVEL": ("startup.optimization_level", int),
    "KILN_STARTUP_LOAD_FORMAT": ("startup.load_format", str),
    "KILN_STARTUP_SAFETENSORS_LOAD_STRATEGY": ("startup.safetensors_load_strategy", str),
    "KILN_STARTUP_COMPILATION_CONFIG": ("startup.compilation_config", str),
    "KILN_STARTUP_PREFETCH": ("startup.prefetch", bool),
    "KILN_STARTUP_PREFETCH_STREAMS": ("startup.prefetch_streams", int),
    "KILN_STARTUP_PREFETCH_WIDEN_TO": ("startup.prefetch_widen_to", int),
    "KILN_STARTUP_PREFETCH_AT": ("startup.prefetch_at", str),
    # The router's replicas, known only when they exist (a router pod is created with its replicas):
    # whitespace-separated entries, each URL or URL|STATUS_URL (ROUTER_REPLICAS_ENV below).
    "KILN_ROUTER_REPLICAS": ("router.replicas", list),
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")

# RunPod's REST API v2: the only place a deploy config may send the pod's RUNPOD_API_KEY. A stand-in
# (tests) is named in the image's or pod's own environment, never in a config file.
RUNPOD_API_URL = "https://api.runpod.io/v2"
RUNPOD_API_HOST = "api.runpod.io"
RUNPOD_API_URL_ENV = "KILN_RUNPOD_API_URL"
BOM = "\ufeff"  # a UTF-8 byte-order mark, as decoded text

# The supervisor sets these itself from [model] and [server]; a rung must not.
SUPERVISOR_OWNED_FLAGS = {
    "-m", "--model", "--host", "--port", "--api-key", "--api-key-file", "-hf", "--hf-repo",
    "-mu", "--model-url",
}
HF_REPO = r"[A-Za-z0-9][\w.-]*/[\w.-]+"
HF_SOURCE = re.compile(rf"hf://(?P<repo>{HF_REPO})")
COMMIT = re.compile(r"[0-9a-f]{40}")
# Kiln never hands a value to a shell (argv lists only), but a value holding these was pasted from
# a shell command line ("--ctx-size 4096; --jinja", "$(cat key)") and would reach the engine
# verbatim. `|` and `( )` alone stay allowed: -ot regexes use them ("blk\.(1|2)\.ffn=CPU").
SHELL_META = re.compile(r"[`;&<>]|\$[A-Za-z_({]|\|\|")
# Names of files Kiln reads from or publishes to a repo or directory: relative, plain segments.
API_KEY_SOURCE = re.compile(r"none|env:[A-Za-z_][A-Za-z0-9_]*|file:/.+")   # server.api_key: where, never what
SAFE_PATH = r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*"
# Upper bounds of durations: every number has a range (a huge one overflows a wait, as nan broke it).
DAY_S, WEEK_S = 86400.0, 604800.0


@dataclass(frozen=True)
class ModelSpec:
    source: str                      # hf://owner/name, or an absolute path to a local file/dir
    revision: str | None = None      # hf only: branch, tag or 40-hex commit
    allow_patterns: tuple[str, ...] = ()
    entry: str | None = None         # file given to the engine, relative to the snapshot
    family: str = "generic"          # selects the selftest's probe set
    fetch_stall_s: float = 120.0     # hf only: a download that moves no byte for this long is stopped
    fetch_connections: int = 32      # hf only: parallel connections to the Hub/CDN (ranges and files)
    fetch_segment_mib: int = 0       # hf only: resume/parallelism unit; 0 = sized from the model (1-64 MiB)

    @property
    def hf_repo(self) -> str | None:
        m = HF_SOURCE.fullmatch(self.source)
        return m.group("repo") if m else None

    @property
    def pinned(self) -> bool:
        return self.hf_repo is None or bool(self.revision and COMMIT.fullmatch(self.revision))


@dataclass(frozen=True)
class ServerSpec:
    host: str = "0.0.0.0"
    port: int = 8080
    # "env:NAME", "file:/path", or "none" (an unauthenticated server must be said out loud).
    api_key: str = "env:KILN_API_KEY"
    binary: str = ""
    flag_snapshot: str = ""
    extra_args: tuple[str, ...] = ()
    # A second port relayed to the engine as plain TCP: RunPod's TCP ports skip its HTTP proxy,
    # which cuts requests at ~125 s (a long cold prefill). None = no relay.
    tcp_port: int | None = None
    # vLLM only, off by default: start-up options that trade nothing Kiln checks for a quicker load
    # (engines/vllm.py FAST_START says which; their measured effect is issue 28's).
    fast_start: bool = False


@dataclass(frozen=True)
class SamplerSpec:
    temperature: float | None = None
    min_p: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repeat_penalty: float | None = None


@dataclass(frozen=True)
class SelftestSpec:
    """After /health 200, before /ready: probes at temperature 0, decode and prefill measured."""
    enabled: bool = True
    probes: str | None = None           # probe set; None = model.family (unknown -> "generic")
    tools: bool = False                 # the target serves tool calls: probe them (fatal)
    decode_tokens: int = 256            # decode measured on at least this many non-degenerate tokens
    min_decode_tok_s: float = 0.0       # floor; 0 = report the rate only (a failed decode request fails anyway)
    prefill_tokens: int = 3000          # long-prompt prefill, cold and warm; 0 = skip
    min_prefill_tok_s: float = 0.0      # floor on cold prefill; 0 = report only
    request_wall_s: float = 100.0       # no request longer than this (RunPod's proxy cuts at ~125 s)
    min_probe_pass: float = 0.75        # share of the scored probes that must pass
    timeout_s: float = 1800.0           # the whole selftest
    # "full": probes one after another, decode and prefill measured as configured (a pod's boot);
    # "gate": probes at once (as many as the engine has slots), measurements sized to what a floor
    # needs (supervisor/selftest/runner.py); "auto": the gate on a Serverless worker, whose cold
    # start a waiting user pays for, full elsewhere.
    mode: str = "auto"


@dataclass(frozen=True)
class Rung:
    name: str
    placement: str = "autofit"
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    # balanced placement only: VRAM left free per card, and how many shortfall-guided re-plans
    # to try before the rung counts as failed (the field notes needed three by hand).
    reserve_mib: int = 1024
    calibration_rounds: int = 3
    calibration_slack_mib: int = 256
    # The rung knowingly trades output quality for speed (llama.cpp: --override-kv lowering the
    # model's expert_used_count; the field notes got +28 % and `# # # #` after six tokens). Lint refuses
    # such a rung unless this says so.
    accept_degraded: bool = False


EXPERT_COUNT_OVERRIDE = re.compile(r"(?:^|[,=])\s*[^,=]+\.expert_used_count=")


RUNG_DEFAULTS = Rung(name="")


@dataclass(frozen=True)
class LadderSpec:
    rungs: tuple[Rung, ...]
    start: str | None = None                          # begin at this rung (env KILN_LADDER_START)
    fall_through: tuple[str, ...] = DEFAULT_FALL_THROUGH
    remember: bool = True                             # start the next boot at the rung that won
    reclaim_timeout_s: float = 30.0                   # wait for VRAM to come back between rungs
    reclaim_slack_mib: int = 512


@dataclass(frozen=True)
class HardwareSpec:
    gpu_count: int | None = None          # exact; None = any (0 = CPU only)
    min_vram_mib: int | None = None       # per GPU, total memory
    min_compute_capability: str | None = None
    min_vcpu: int | None = None
    min_ram_gib: float | None = None
    # The field notes' wall: 16 vCPU for ~80 GB of host-resident weights ran 1.9x slower than 41.
    warn_vcpu_per_host_gib: float = 0.4


@dataclass(frozen=True)
class HealthSpec:
    stall_s: float = 120.0      # no progress (output, CPU, I/O) for this long = stalled
    max_s: float = 0.0          # absolute cap on loading, 0 = none (progress decides)
    poll_s: float = 0.1
    stop_grace_s: float = 10.0


@dataclass(frozen=True)
class RestartSpec:
    max_restarts: int = 5           # within window_s, then FAILED (crash loop)
    window_s: float = 600.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    stable_s: float = 300.0         # uptime that resets the backoff


@dataclass(frozen=True)
class StatusSpec:
    host: str = "0.0.0.0"
    port: int = 8081


@dataclass(frozen=True)
class WatchSpec:
    """Where published configs come from (supervisor/reload/watch.py). Boot-only: a published config
    cannot move it (it would change where the next update comes from)."""
    repo: str | None = None          # Hub repo "owner/name" whose `branch` is polled for `path`
    branch: str = "main"
    path: str = "deploy.toml"        # the config's path in the repo, and its name inside `dir`
    poll_s: float = 30.0             # one small request per interval
    max_backoff_s: float = 300.0     # errors double the interval up to this
    dir: str | None = None           # a local directory watched (watchdog) for `path`
    debounce_s: float = 0.2          # quiet time after the last event before the file is read
    # With a repo: this pod's record (state, config, reload verdicts) on the repo's fleet branch
    # (supervisor/fleet/record.py), at most one write per poll_s, and at least one per report_s (the
    # heartbeat: the Hub limits commits, so it is slow; a pod silent for 3 of them shows stale).
    report: bool = True
    report_s: float = 600.0

    @property
    def enabled(self) -> bool:
        return bool(self.repo or self.dir)

    @property
    def reporting(self) -> bool:
        return bool(self.repo and self.report)


@dataclass(frozen=True)
class SelfTerminateSpec:
    """[runpod]: what the supervisor does about the RunPod pod it runs in (supervisor/fleet/self_terminate.py).
    A supervisor FAILED for good (it can never serve) terminates its own pod, so it stops billing:
    off by default; needs RUNPOD_POD_ID and RUNPOD_API_KEY, which RunPod sets in every pod."""
    terminate_on_terminal_failure: bool = False
    terminate_grace_s: float = 300.0              # /status stays readable this long before the pod goes
    api_url: str = RUNPOD_API_URL                 # RunPod's REST API v2 (tests: $KILN_RUNPOD_API_URL)


# smg's routing policies Kiln offers (smg launch --help, 1.13.0; passthrough, manual and bucket are
# for single-worker, routing-key and prefill/decode setups, not for replicas of one model).
ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two", "least_load", "consistent_hashing",
                   "prefix_hash")
# smg flags the supervisor sets itself from [server] and [router]; [router] extra_args must not.
ROUTER_OWNED_FLAGS = {"--host", "--port", "--api-key", "--worker-urls", "--policy", "--prometheus-host",
                      "--prometheus-port", "--service-discovery", "--discovery-provider", "--discovery-file"}
ROUTER_METRICS_PORT = 29000          # smg's own default for its Prometheus exporter
# smg itself listens here, on 127.0.0.1 only: clients reach it through the supervisor's gate on
# server.port, which answers 503 while no replica is routed (supervisor/router/front.py).
ROUTER_ENGINE_PORT = 29080
# On TERM smg keeps its listener 5 s for load balancers to notice, then waits for in-flight requests
# (measured on 1.13.0: 5.3 s with none in flight): a grace of 5 or 10 s ended every stop in SIGKILL
# with streams cut (issue 37 item 16). The router's default leaves a stream 30 s to finish.
ROUTER_STOP_GRACE_S = 40.0
SMG_TERM_HOLD_S = 5.0


@dataclass(frozen=True)
class ReplicaSpec:
    """One server behind the router: where its API is, and where its readiness is asked (a Kiln
    supervisor's /ready, which is 200 only once its selftest passed; a plain server's /health)."""
    url: str
    status_url: str


@dataclass(frozen=True)
class RouterSpec:
    """[router], engine = "router": smg in front of replicas, fed by their readiness
    (supervisor/router/feeder.py). The router enforces server.api_key, the key the replicas use."""
    replicas: tuple[ReplicaSpec, ...] = ()
    policy: str = "cache_aware"
    poll_s: float = 1.0                 # each replica's readiness is asked this often
    probe_timeout_s: float = 2.0        # a replica that does not answer within this is not ready
    metrics_port: int = ROUTER_METRICS_PORT   # smg's Prometheus exporter, on 127.0.0.1
    engine_port: int = ROUTER_ENGINE_PORT     # smg's own port, on 127.0.0.1, behind the gate on server.port
    extra_args: tuple[str, ...] = ()    # more `smg launch` flags
    # Who may change where traffic goes (PUT /kiln/router/replicas: router/control.py): a key of its own,
    # never the clients' (server.api_key). "env:NAME", "file:/path" or "none" (then only the deploy config
    # changes the replicas). `pods up --router` gives it from the RunPod secret kiln_operator_key.
    operator_key: str = "env:KILN_OPERATOR_KEY"


@dataclass(frozen=True)
class ServerlessSpec:
    """[serverless]: a worker of a RunPod Serverless load-balancing endpoint (supervisor/serverless/).
    Read only in serverless mode, which the environment decides (PORT_HEALTH or RUNPOD_ENDPOINT_ID
    set: `active`); RunPod's PORT, PORT_HEALTH and HEALTH_CHECK_PATH set server.port, status.port and
    `health_path` then (supervisor/runpod_env.py), never this table."""
    # A worker that can never serve answers 503 on the health path (RunPod takes it out of routing),
    # then exits after this grace so it stops billing. 60 s: RunPod documents no poll interval for an
    # unhealthy load-balancing worker (the docs tell clients to retry /ping every 5-10 s), so a
    # minute lets its health checks and an operator's `endpoint status` see the 503 and the cause on
    # /status several times, and costs at most a minute of GPU per failed worker.
    exit_grace_s: float = 60.0
    # How long a deterministic failure recorded on the shared volume stops later workers of the same
    # image and config at once (no download, no load). 30 min: a fix that changes the image or the
    # config is a new key and never waits; one that changes only the env (a token) waits this long at
    # most, or for the record to be deleted; a failure recorded wrongly blocks no longer than this.
    failure_ttl_s: float = 1800.0
    volume: str = "/runpod-volume"       # where Serverless mounts the endpoint's network volume
    active: bool = False                 # from the environment only
    health_path: str = serverless_contract.DEFAULT_HEALTH_PATH   # HEALTH_CHECK_PATH, from the environment


@dataclass(frozen=True)
class StartupSpec:
    """Levers on a boot's time (issue 28), each the engine's own default until a measurement on the
    card earns it (bench/coldstart.py; docs/benchmarks.md P15, P9). A rung's or extra_args' own flag
    wins. The flags and the values each engine's --help lists: supervisor/engines/startup.py."""
    # llama.cpp --load-mode (-lm): auto none mmap mlock mmap+mlock dio. Unset: `none` on a rung whose
    # every layer fits on the GPU, else the engine's own (engines/llamacpp.py boot_args)
    load_mode: str | None = None
    optimization_level: int | None = None         # vLLM --optimization-level (-O): 0 (fastest start) .. 3
    load_format: str | None = None                # vLLM --load-format
    safetensors_load_strategy: str | None = None  # vLLM --safetensors-load-strategy: eager lazy prefetch torchao
    compilation_config: str | None = None         # vLLM --compilation-config: a JSON object
    # Kiln's own, not an engine flag: the weights read into the page cache from the moment the
    # model is local, beside the engine's start (supervisor/model/prefetch.py). Not in the hash.
    prefetch: bool = True
    # reads in flight: 1 measured best on the H200's local disk (2026-12-02: more slowed the engine's
    # own start, its binary and CUDA libraries read from the same disk); more for a network volume
    prefetch_streams: int = 1
    # reads in flight once the engine has written its first line (its binary and libraries loaded:
    # nothing on the boot's path needs the disk but the weights); 0 keeps prefetch_streams. The
    # H100's disk read the model ~7 % faster with 8 ranges in flight than with one, but 4 streams
    # from the start slowed Kiln's and the engine's own start, and widening to 4 on the first line
    # gained nothing (+0.19 s, 2 of 8 rounds faster: docs/benchmarks.md P9, 2026-12-05)
    prefetch_widen_to: int = 0
    # when it starts: "start", as soon as PID 1 has read the config, before the loop's imports (the
    # disk busy ~0.3 s sooner on a cold worker; the imports queue behind its reads, 0.37 -> 0.73 s on
    # the H200, but with llama.cpp's --load-mode none the boot was 0.34 s shorter: docs/benchmarks.md
    # P9, 2026-12-02), or "preflight", after the GPU probe (the default until then)
    prefetch_at: str = "start"


PREFETCH_AT = ("start", "preflight")


@dataclass(frozen=True)
class CacheSpec:
    """[cache]: the engine's prompt cache kept across the restarts Kiln makes (supervisor/promptcache/):
    saved before a planned stop, restored before /ready. llama.cpp only (vLLM: docs/supervisor.md)."""
    keep: bool = True
    max_bytes: int = 8 * 2**30          # the whole store, every key: the oldest entries go first
    max_entries: int = 8
    min_tokens: int = 256               # a slot holding fewer is not worth a file
    save_s: float = 30.0                # a save before a stop never takes longer (then the stop goes on)
    restore_s: float = 60.0             # nor a restore before /ready


@dataclass(frozen=True)
class PlanSpec:
    """[plan]: what `build.py plan` predicted for the pod this config runs on (issue 39). After the
    selftest the supervisor sets beside each what it measured (supervisor/plan/check.py) on /status
    and /metrics. Every field is optional; an empty table predicts nothing."""
    gpu: str = ""                        # the catalog's GPU type id the plan was for
    cards: int = 0                       # how many of them
    card_mib: int = 0                    # memory on the fullest card, MiB (0 = not predicted)
    kv_tokens: int = 0                   # vLLM: its KV cache, tokens (0 = not predicted)
    decode_tok_s: float = 0.0            # one stream, tok/s (0 = not predicted)
    basis: str = ""                      # where decode_tok_s comes from (measured row, upper bound)

    @property
    def predicts(self) -> bool:
        return bool(self.card_mib or self.kv_tokens or self.decode_tok_s)

# -- what the config hash leaves out, and what a published config cannot change -----------------------
# The hash names what would run (the ladder memory's key; a published config with the running hash is
# "unchanged"). Each field it leaves out is also boot-only (BOOT_ONLY; a test keeps it so): a published
# change to it alone would otherwise be judged unchanged and lost without a word.
NOT_HASHED: dict[str, str] = {
    "watch": "where updates come from, not what runs",
    "runpod": "what becomes of the pod after a failure, not what runs",
    "serverless": "what becomes of a Serverless worker after a failure (its ports and state_dir are hashed)",
    "startup.prefetch": "how the model's files are read, not what runs",
    "startup.prefetch_streams": "how the model's files are read, not what runs",
    "startup.prefetch_widen_to": "how the model's files are read, not what runs",
    "startup.prefetch_at": "how the model's files are read, not what runs",
    "plan": "what a plan predicted for this pod, compared with what runs, not what runs",
    "router.operator_key": "who may change the router's replicas, not what runs",
    "cache": "what is kept of the prompt cache across restarts, not what runs",
}
# Tables and fields added after configs were first hashed: left out while they hold their defaults,
# so a config that does not set them keeps the hash it always had.
HASHED_WHEN_SET = ("server.fast_start", "startup", "router")
# Dotted name -> why the supervisor cannot take a change to it after boot (reload/boot_only.py).
BOOT_ONLY: dict[str, str] = {
    "watch": "it says where the next update comes from",
    "state_dir": "it says where the supervisor keeps its state, the reload book with it",
    "status": "the status server listens where it was started",
    "runpod": "it says what becomes of this pod and where its RunPod key is sent",
    "serverless": "it says what becomes of this Serverless worker after a failure, and where its volume is",
    "server.tcp_port": "the TCP relay listens where it was started",
    "startup.prefetch": "the model prefetch is set for the container's life",
    "startup.prefetch_streams": "the model prefetch is set for the container's life",
    "startup.prefetch_widen_to": "the model prefetch is set for the container's life",
    "startup.prefetch_at": "the model prefetch is set for the container's life",
    "plan": "the predictions are the ones the pod was booted from, checked once after its selftest",
    "router.operator_key": "who may change where traffic goes is set when the router starts, never by a "
                           "published config",
    "cache": "where and how much of the prompt cache is kept is set for the container's life",
}


def _get(d: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def _pop(d: dict[str, Any], dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        d = d.get(part) if isinstance(d, dict) else None
    if isinstance(d, dict):
        d.pop(leaf, None)


@dataclass(frozen=True)
class DeployConfig:
    engine: str
    model: ModelSpec
    ladder: LadderSpec
    server: ServerSpec = ServerSpec()
    sampler: SamplerSpec = SamplerSpec()
    selftest: SelftestSpec = SelftestSpec()
    hardware: HardwareSpec = HardwareSpec()
    health: HealthSpec = HealthSpec()
    restart: RestartSpec = RestartSpec()
    status: StatusSpec = StatusSpec()
    watch: WatchSpec = WatchSpec()
    runpod: SelfTerminateSpec = SelfTerminateSpec()
    serverless: ServerlessSpec = ServerlessSpec()
    startup: StartupSpec = StartupSpec()
    router: RouterSpec = RouterSpec()
    plan: PlanSpec = PlanSpec()
    cache: CacheSpec = CacheSpec()
    state_dir: str = DEFAULT_STATE_DIR
    source: str = "<memory>"        # where it was read from (not hashed)

    @property
    def engine_address(self) -> tuple[str, int]:
        """Where the engine itself listens (the port check, the health wait): server.host and port,
        except the router's smg, on 127.0.0.1:[router] engine_port behind the gate on server.port."""
        if self.engine == "router":
            return "127.0.0.1", self.router.engine_port
        return self.server.host, self.server.port

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("source")
        return d

    @property
    def hash(self) -> str:
        """Stable identity of what would run: same config, same hash, wherever it came from. What it
        leaves out is declared once (NOT_HASHED, HASHED_WHEN_SET), never decided here field by field."""
        d, default = self.to_dict(), DeployConfig(self.engine, self.model, self.ladder).to_dict()
        for path in NOT_HASHED:
            _pop(d, path)
            _pop(default, path)
        for path in HASHED_WHEN_SET:
            if _get(d, path) == _get(default, path):
                _pop(d, path)
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"), default=list)
        return hashlib.sha256(blob.encode()).hexdigest()

    def rung(self, name: str) -> Rung:
        for r in self.ladder.rungs:
            if r.name == name:
                return r
        raise KeyError(name)


# ---------------------------------------------------------------------------
def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> DeployConfig:
    p = Path(path)
    return parse_config(read_text(p), source=str(p), env=env)


def parse_config(text: str, *, source: str = "<memory>", env: Mapping[str, str] | None = None) -> DeployConfig:
    # Windows editors save UTF-8 with a byte-order mark, which TOML does not allow: it read as
    # "Invalid statement (line 1, col 1)". It is not content, so it is dropped.
    text = text.removeprefix(BOM)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(source, [Problem("(toml)", f"is not valid TOML: {e}")]) from None
    problems: list[Problem] = []
    env = os.environ if env is None else env
    _apply_env(data, env, problems)
    health_path = serverless_contract.apply_env(data, env, problems)
    if health_path is not None and "KILN_STATE_DIR" not in env:
        # A Serverless worker keeps its state on the endpoint's network volume when there is one
        # (supervisor/runpod_env.py); the image's state_dir names a pod's volume.
        table = data.get("serverless")
        shared = volume_state_dir(table.get("volume", ServerlessSpec.volume) if isinstance(table, dict)
                                  else ServerlessSpec.volume)
        if shared is not None:
            data["state_dir"] = shared
    cfg = _build(Reader(data, "", problems), source, env.get(RUNPOD_API_URL_ENV), health_path)
    if cfg is not None and (cfg.model.source.startswith("hf://") or cfg.watch.repo):
        # huggingface_hub reads HF_ENDPOINT as it loads: a malformed one would fail the fetch (or the
        # watcher) later, as a load error, after the boot had begun. Said now, with the config's problems.
        from .hubclient import endpoint_problem

        if (why := endpoint_problem(env)) is not None:
            url = env.get("HF_ENDPOINT", "")
            # shown on /status: a user:token@ in the URL is not
            shown = re.sub(r"(?<=://)[^/@]*@", "***@", url)
            problems.append(Problem("HF_ENDPOINT (from env HF_ENDPOINT)", why.removeprefix(f"HF_ENDPOINT {url!r} "), shown))
    raise_if(problems, f"deploy config {source}")
    assert cfg is not None
    return cfg


def boot_fallback(data: Any, env: Mapping[str, str]) -> tuple[StatusSpec, SelfTerminateSpec]:
    """What a boot whose config does not validate can still use (run/boot_failure.py): [status]
    and [runpod] as the file (`data`, its TOML when that parsed, else None) and the environment give
    them, each field where it is valid on its own, its default where not: the FAILED supervisor
    explains itself on that status port, and terminates its pod when asked to."""
    tables = {k: copy.deepcopy(v) for k in ("status", "runpod")
              if isinstance(v := (data if isinstance(data, dict) else {}).get(k), dict)}
    ignored: list[Problem] = []           # the config's own error lists them
    _apply_env(tables, env, ignored)
    status = _status(Reader(tables.get("status", {}), "status", ignored))
    runpod = _runpod(Reader(tables.get("runpod", {}), "runpod", ignored), env.get(RUNPOD_API_URL_ENV))
    return status, runpod


def serverless_fallback(data: Any, env: Mapping[str, str]) -> ServerlessSpec:
    """[serverless] for a Serverless worker whose config does not validate (run/boot_failure.py), as
    boot_fallback reads [status]: each field where it is valid on its own, its default where not;
    the health path from HEALTH_CHECK_PATH (its default where that is invalid)."""
    ignored: list[Problem] = []
    table = (data if isinstance(data, dict) else {}).get("serverless")
    tables = {"serverless": copy.deepcopy(table)} if isinstance(table, dict) else {}
    _apply_env(tables, env, ignored)
    health_path = serverless_contract.apply_env({}, env, ignored) or serverless_contract.DEFAULT_HEALTH_PATH
    d = ServerlessSpec()
    r = Reader(tables.get("serverless", {}), "serverless", ignored)
    return ServerlessSpec(exit_grace_s=r.float("exit_grace_s", d.exit_grace_s, min=0.0, max=DAY_S),
                          active=True, health_path=health_path)


def _apply_env(data: dict[str, Any], env: Mapping[str, str], problems: list[Problem]) -> None:
    for name, (path, kind) in ENV_OVERRIDES.items():
        if name not in env:
            continue
        raw = env[name]
        value: Any = raw
        if kind is int or kind is float:
            try:
                value = kind(raw)
            except ValueError:
                problems.append(Problem(f"{path} (from env {name})",
                                        "must be an integer" if kind is int else "must be a number", raw))
                continue
        elif kind is list:
            value = replicas_from_env(raw)
        elif kind is bool:
            if raw.strip().lower() not in _TRUE + _FALSE:
                problems.append(Problem(f"{path} (from env {name})", "must be true or false", raw,
                                        ", ".join(_TRUE + _FALSE)))
                continue
            value = raw.strip().lower() in _TRUE
        *parents, leaf = path.split(".")
        node: Any = data
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):     # `status = 3`: the Reader says the table is wrong too
                problems.append(Problem(f"{path} (from env {name})", f"cannot be applied: {part} in the file "
                                        f"is not a table ([{part}])", raw))
                break
        else:
            node[leaf] = value


def _build(r: Reader, source: str, runpod_url_env: str | None = None,
           health_path: str | None = None) -> DeployConfig | None:
    engine = r.str("engine", ENGINES[0], choices=ENGINES)
    routing = engine == "router"
    model = _no_model(r) if routing else _model(r.table("model", required=True))
    server = _server(r.table("server"), engine)
    sampler = _sampler(r.table("sampler"))
    selftest = _selftest(r.table("selftest"))
    if routing:
        selftest = _router_selftest(r, selftest)
    ladder = _router_ladder(r) if routing else _ladder(r, engine)
    router = _router(r.table("router")) if routing or r.has("router") else RouterSpec()
    if r.has("router") and not routing:
        r.problem("router", 'applies only to engine = "router"', allowed='engine = "router", or remove [router]')
    if routing and server.extra_args:
        r.problem("server.extra_args", "is for an engine's flags: the router's smg flags go in [router] extra_args",
                  list(server.extra_args))
    hardware = _hardware(r.table("hardware"))
    health = _health(r.table("health"), ROUTER_STOP_GRACE_S if routing else HealthSpec.stop_grace_s)
    restart = _restart(r.table("restart"))
    status = _status(r.table("status"))
    watch = _watch(r.table("watch"))
    runpod = _runpod(r.table("runpod"), runpod_url_env)
    serverless = _serverless(r.table("serverless"), health_path)
    startup = _startup(r.table("startup"), engine)
    plan = _plan(r.table("plan"))
    cache = _cache(r.table("cache"))
    state_dir = r.str("state_dir", DEFAULT_STATE_DIR, pattern=r"/.*", pattern_hint="an absolute path")
    r.finish()
    cfg = DeployConfig(engine=engine, model=model, ladder=ladder, server=server, sampler=sampler,
                        selftest=selftest, hardware=hardware, health=health, restart=restart, status=status,
                        watch=watch, runpod=runpod, serverless=serverless, startup=startup, router=router, plan=plan,
                        cache=cache, state_dir=state_dir, source=source)
    for prob in cross_problems(cfg):
        r.problems.append(prob)
    return cfg


def cross_problems(cfg: DeployConfig) -> list[Problem]:
    """Checks across tables, on the config as it will run (a published config is checked again
    after the boot-only tables it cannot change were put back: supervisor/reload/candidate.py)."""
    out = []
    if cfg.server.tcp_port is not None and cfg.server.tcp_port == cfg.status.port:
        out.append(Problem("server.tcp_port", "must differ from status.port", cfg.server.tcp_port))
    if cfg.status.port == cfg.server.port:
        out.append(Problem("status.port", "must differ from server.port (the supervisor and the engine both "
                           "listen)", cfg.status.port))
    if cfg.engine == "router" and cfg.router.metrics_port in (cfg.server.port, cfg.status.port, cfg.server.tcp_port):
        out.append(Problem("router.metrics_port", "must differ from server.port, status.port and server.tcp_port",
                           cfg.router.metrics_port))
    if cfg.engine == "router" and cfg.router.engine_port in (cfg.server.port, cfg.status.port, cfg.server.tcp_port,
                                                             cfg.router.metrics_port):
        out.append(Problem("router.engine_port", "must differ from server.port, status.port, server.tcp_port and "
                           "router.metrics_port", cfg.router.engine_port))
    return out


def _model(r: Reader) -> ModelSpec:
    source = r.str("source", "", required=True)
    if source and not (HF_SOURCE.fullmatch(source) or source.startswith("/")):
        r.problem("source", "must be hf://owner/name or an absolute local path", source,
                  "hf://owner/name, /models/file.gguf")
    elif source and ".." in Path(source).parts:
        r.problem("source", "must not step out of its directory with '..'", source)
    is_hf = bool(HF_SOURCE.fullmatch(source or ""))
    revision = r.str("revision", None, pattern=r"[\w./-]{1,200}", pattern_hint="a branch, tag or commit")
    if revision and not is_hf:
        r.problem("revision", "only applies to hf:// sources", revision)
    allow = r.str_list("allow_patterns", item=_glob_problem)
    entry = r.str("entry", None)
    if entry is not None and (entry.startswith("/") or ".." in Path(entry).parts):
        r.problem("entry", "must be a relative path inside the model snapshot", entry)
    if is_hf and not entry:
        r.problem("entry", "is required for hf:// sources: the file the engine loads",
                  allowed="e.g. 'UD-IQ1_S/model-00001-of-00004.gguf'")
    d = ModelSpec(source="")
    family = r.str("family", d.family, pattern=r"[a-z0-9][a-z0-9.-]*", pattern_hint="lowercase name")
    stall = r.float("fetch_stall_s", d.fetch_stall_s, min=1.0, max=86400.0)
    # 64: hf_xet's own ceiling (client.ac_max_download_concurrency) and within httpx's pool of 100.
    connections = r.int("fetch_connections", d.fetch_connections, min=1, max=64)
    segment_mib = r.int("fetch_segment_mib", d.fetch_segment_mib, min=0, max=1024)
    r.finish()
    return ModelSpec(source=source, revision=revision, allow_patterns=allow, entry=entry, family=family,
                     fetch_stall_s=stall, fetch_connections=connections, fetch_segment_mib=segment_mib)


def _no_model(r: Reader) -> ModelSpec:
    """The router serves no model of its own: its replicas do."""
    if r.has("model"):
        r.table("model")          # said once, here (not again as an unknown field)
        r.problem("model", 'the router serves no model of its own (its replicas do): remove [model]',
                  allowed='[model] only with engine = "llamacpp" or "vllm"')
    return ModelSpec(source="")


def _router_selftest(r: Reader, spec: SelftestSpec) -> SelftestSpec:
    """The replicas' selftest is the gate for traffic; the router has nothing to probe."""
    if spec.enabled and r.table("selftest").has("enabled"):
        r.problem("selftest.enabled", "the router has no model to test: each replica's supervisor runs its "
                  "own selftest and the router takes only replicas whose /ready says 200", True, "false")
    return dataclasses.replace(spec, enabled=False)


ROUTER_RUNG = Rung(name="router", placement="engine")


def _router_ladder(r: Reader) -> LadderSpec:
    """One way to run a router: no ladder to walk (more smg flags go in [router] extra_args)."""
    if r.has("ladder"):
        r.table("ladder")          # said once, here (not again as an unknown field)
        r.problem("ladder", "the router has one way to run: remove [ladder] and put smg flags in [router] "
                  "extra_args")
    return LadderSpec(rungs=(ROUTER_RUNG,))


_HTTP_URL = re.compile(r"https?://[\w.\-\[\]:]+(:\d{1,5})?(/[\w./%~-]*)?")


def replica_urls(url: str, status_url: str | None) -> ReplicaSpec:
    """A replica from its API URL and its status URL; without one, the server's own /health. A status
    URL with no path is a Kiln supervisor's status port: its /ready."""
    url = url.rstrip("/")
    if not status_url:
        return ReplicaSpec(url, url + "/health")
    parts = urllib.parse.urlsplit(status_url)
    if parts.path in ("", "/"):
        status_url = status_url.rstrip("/") + "/ready"
    return ReplicaSpec(url, status_url)


def replicas_from_env(raw: str) -> list[dict[str, str]]:
    """KILN_ROUTER_REPLICAS: whitespace-separated entries, each URL or URL|STATUS_URL."""
    out = []
    for entry in raw.split():
        url, _, status = entry.partition("|")
        out.append({"url": url, "status_url": status} if status else {"url": url})
    return out


def _router(r: Reader) -> RouterSpec:
    d = RouterSpec()
    replicas: list[ReplicaSpec] = []
    for rr in r.tables("replicas"):
        url = rr.str("url", "", required=True)
        status = rr.str("status_url", None)
        rr.finish()
        for key, value in (("url", url), ("status_url", status)):
            if value and not _HTTP_URL.fullmatch(value):
                rr.problem(key, "must be an http(s) URL such as http://10.0.0.2:8080", value)
        if url and _HTTP_URL.fullmatch(url) and urllib.parse.urlsplit(url).path not in ("", "/"):
            rr.problem("url", "must be the server's root (the router adds /v1/...), with no path", url,
                       urllib.parse.urlunsplit(urllib.parse.urlsplit(url)[:2] + ("", "", "")))
        if not url:
            continue
        rep = replica_urls(url, status)
        if any(x.url == rep.url for x in replicas):
            rr.problem("url", "names a replica listed before it: each replica once", url)
            continue
        replicas.append(rep)
    policy = r.str("policy", d.policy, choices=ROUTER_POLICIES)
    poll_s = r.float("poll_s", d.poll_s, min=0.1, max=60.0)
    probe_timeout_s = r.float("probe_timeout_s", d.probe_timeout_s, min=0.1, max=60.0)
    metrics_port = r.int("metrics_port", d.metrics_port, min=1, max=65535)
    engine_port = r.int("engine_port", d.engine_port, min=1, max=65535)
    extra = r.str_list("extra_args", item=_router_arg_problem)
    operator_key = r.str("operator_key", d.operator_key)
    if not API_KEY_SOURCE.fullmatch(operator_key):
        r.problem("operator_key", "must say where the operator key comes from, never the key itself",
                  "not shown: it may be a key", 'env:NAME, file:/path or none')
    r.finish()
    return RouterSpec(replicas=tuple(replicas), policy=policy, poll_s=poll_s, probe_timeout_s=probe_timeout_s,
                      metrics_port=metrics_port, engine_port=engine_port, extra_args=extra, operator_key=operator_key)


def _router_arg_problem(arg: str) -> str | None:
    flag = arg.split("=", 1)[0]
    if flag in ROUTER_OWNED_FLAGS:
        return f"{flag} is set by the supervisor from [server] and [router]; remove it here"
    return _SHELL_META_MESSAGE if SHELL_META.search(arg) else None


def _glob_problem(pattern: str) -> str | None:
    return "must be a relative glob" if pattern.startswith("/") or ".." in pattern.split("/") else None


def _server(r: Reader, engine: str) -> ServerSpec:
    d = ServerSpec()
    host = r.str("host", d.host, pattern=r"[\w.:-]+", pattern_hint="an address such as 0.0.0.0")
    port = r.int("port", d.port, min=1, max=65535)
    api_key = r.str("api_key", d.api_key)
    if isinstance(api_key, str) and not API_KEY_SOURCE.fullmatch(api_key):
        # Most likely the key itself, pasted: never echoed (this message reaches the log and stderr).
        r.problem("api_key", "is not where a key comes from; if it is the key itself, it is now in this file: "
                  "rotate it, and give its place instead", f"<{len(api_key)} characters, not shown>",
                  '"env:NAME" (e.g. env:KILN_API_KEY), "file:/path" or "none" (no authentication, said out loud)')
        api_key = d.api_key
    binary = r.str("binary", DEFAULT_BINARIES.get(engine, ""))
    if binary and SHELL_META.search(binary):
        r.problem("binary", _SHELL_META_MESSAGE, binary)
    snapshot = r.str("flag_snapshot", DEFAULT_SNAPSHOTS.get(engine, ""))
    extra = r.str_list("extra_args", item=_arg_problem)
    tcp_port = r.int("tcp_port", None, min=1, max=65535)
    fast_start = r.bool("fast_start", False)
    r.finish()
    if tcp_port is not None and tcp_port == port:
        r.problem("tcp_port", "must differ from server.port (it relays to it)", tcp_port)
    if fast_start and engine != "vllm":
        r.problem("fast_start", f"is a vLLM option; engine {engine} has no such switch", fast_start)
    return ServerSpec(host=host, port=port, api_key=api_key, binary=binary, flag_snapshot=snapshot,
                      extra_args=extra, tcp_port=tcp_port, fast_start=fast_start)


def _owned_flag_problem(arg: str) -> str | None:
    flag = arg.split("=", 1)[0]
    if flag in SUPERVISOR_OWNED_FLAGS:
        return f"{flag} is set by the supervisor from [model]/[server]; remove it here"
    return None


_SHELL_META_MESSAGE = ("holds shell syntax (` ; & < > $( ${ $NAME ||): no shell ever reads it, so it would reach "
                       "the engine verbatim; give each argument as its own list item")


def _arg_problem(arg: str) -> str | None:
    return _owned_flag_problem(arg) or (_SHELL_META_MESSAGE if SHELL_META.search(arg) else None)


def _sampler(r: Reader) -> SamplerSpec:
    s = SamplerSpec(
        temperature=r.float("temperature", None, min=0.0, max=5.0),
        min_p=r.float("min_p", None, min=0.0, max=1.0),
        top_p=r.float("top_p", None, min=0.0, max=1.0),
        top_k=r.int("top_k", None, min=0, max=2**31 - 1),       # llama.cpp holds it in an int32
        repeat_penalty=r.float("repeat_penalty", None, min=0.0, max=5.0),
    )
    r.finish()
    return s


def _selftest(r: Reader) -> SelftestSpec:
    d = SelftestSpec()
    s = SelftestSpec(
        enabled=r.bool("enabled", d.enabled),
        probes=r.str("probes", None, choices=sorted(PROBE_SETS)),
        tools=r.bool("tools", d.tools),
        decode_tokens=r.int("decode_tokens", d.decode_tokens, min=0, max=100_000),
        min_decode_tok_s=r.float("min_decode_tok_s", d.min_decode_tok_s, min=0.0, max=1_000_000.0),
        prefill_tokens=r.int("prefill_tokens", d.prefill_tokens, min=0, max=10_000_000),
        min_prefill_tok_s=r.float("min_prefill_tok_s", d.min_prefill_tok_s, min=0.0, max=1_000_000.0),
        request_wall_s=r.float("request_wall_s", d.request_wall_s, min=0.1, max=3600.0),
        min_probe_pass=r.float("min_probe_pass", d.min_probe_pass, min=0.0, max=1.0),
        timeout_s=r.float("timeout_s", d.timeout_s, min=1.0, max=DAY_S),
        mode=r.str("mode", d.mode, choices=SELFTEST_MODES),
    )
    r.finish()
    if 0 < s.decode_tokens < 16:
        r.problem("decode_tokens", "is too few to time (16 or more, or 0 to skip)", s.decode_tokens)
    if 0 < s.prefill_tokens < 64:
        r.problem("prefill_tokens", "is too short to say anything about prefill (64 or more, or 0 to skip)",
                  s.prefill_tokens)
    if s.min_decode_tok_s > 0 and s.decode_tokens == 0:
        r.problem("min_decode_tok_s", "needs decode_tokens > 0 (nothing would be measured)", s.min_decode_tok_s)
    if s.min_prefill_tok_s > 0 and s.prefill_tokens == 0:
        r.problem("min_prefill_tok_s", "needs prefill_tokens > 0 (nothing would be measured)", s.min_prefill_tok_s)
    if s.timeout_s < s.request_wall_s:
        r.problem("timeout_s", "must be >= request_wall_s (one request may take that long)", s.timeout_s)
    return s


def _ladder(r: Reader, engine: str) -> LadderSpec:
    lr = r.table("ladder", required=True)
    rungs: list[Rung] = []
    for rr in lr.tables("rungs", required=True):
        name = rr.str("name", f"rung{len(rungs)}", required=True,
                      pattern=r"[A-Za-z0-9][\w.-]{0,63}", pattern_hint="letters, digits, . _ -")
        default_placement = "engine" if engine == "vllm" else "autofit"
        placement = rr.str("placement", default_placement, choices=PLACEMENTS)
        args = rr.str_list("args", item=_arg_problem)
        env = rr.str_map("env")
        for var, value in env.items():
            if SHELL_META.search(value):
                rr.problem(f"env.{var}", _SHELL_META_MESSAGE, value)
        reserve = rr.int("reserve_mib", RUNG_DEFAULTS.reserve_mib, min=0)
        rounds = rr.int("calibration_rounds", RUNG_DEFAULTS.calibration_rounds, min=0, max=10)
        slack = rr.int("calibration_slack_mib", RUNG_DEFAULTS.calibration_slack_mib, min=0)
        degraded = rr.bool("accept_degraded", RUNG_DEFAULTS.accept_degraded)
        rr.finish()
        if any(x.name == name for x in rungs):
            rr.problem("name", "is used by an earlier rung; rung names must be unique", name)
        if degraded and not any(EXPERT_COUNT_OVERRIDE.search(a) for a in args):
            rr.problem("accept_degraded", "is set, but this rung overrides no <arch>.expert_used_count "
                       "(--override-kv), the only degradation it accepts: remove it", degraded)
        rungs.append(Rung(name=name, placement=placement, args=args, env=env, reserve_mib=reserve,
                          calibration_rounds=rounds, calibration_slack_mib=slack, accept_degraded=degraded))
    if not rungs and lr.has("rungs"):
        lr.problem("rungs", "needs at least one [[ladder.rungs]] entry")
    start = lr.str("start", None)
    fall = lr.str_list("fall_through", DEFAULT_FALL_THROUGH,
                       item=lambda c: None if c in FAILURE_CLASSES else
                       f"is not a failure class ({', '.join(FAILURE_CLASSES)})")
    d = LadderSpec(rungs=())
    remember = lr.bool("remember", d.remember)
    reclaim_timeout = lr.float("reclaim_timeout_s", d.reclaim_timeout_s, min=0.0, max=3600.0)
    slack = lr.int("reclaim_slack_mib", d.reclaim_slack_mib, min=0)
    lr.finish()
    if start is not None and start not in {x.name for x in rungs}:
        lr.problem("start", "names no rung", start, ", ".join(x.name for x in rungs))
        start = None
    return LadderSpec(rungs=tuple(rungs), start=start, fall_through=fall, remember=remember,
                      reclaim_timeout_s=reclaim_timeout, reclaim_slack_mib=slack)


def _hardware(r: Reader) -> HardwareSpec:
    cc = r.str("min_compute_capability", None, pattern=r"\d+\.\d+", pattern_hint='"8.6"')
    h = HardwareSpec(
        gpu_count=r.int("gpu_count", None, min=0, max=64),
        min_vram_mib=r.int("min_vram_mib", None, min=0),
        min_compute_capability=cc,
        min_vcpu=r.int("min_vcpu", None, min=1),
        min_ram_gib=r.float("min_ram_gib", None, min=0.0, max=1_000_000.0),
        warn_vcpu_per_host_gib=r.float("warn_vcpu_per_host_gib", HardwareSpec.warn_vcpu_per_host_gib, min=0.0,
                                       max=1_000_000.0),
    )
    r.finish()
    return h


def _health(r: Reader, stop_grace_s: float) -> HealthSpec:
    h = HealthSpec(
        stall_s=r.float("stall_s", HealthSpec.stall_s, min=0.5, max=DAY_S),
        max_s=r.float("max_s", HealthSpec.max_s, min=0.0, max=WEEK_S),
        poll_s=r.float("poll_s", HealthSpec.poll_s, min=0.01, max=10.0),
        stop_grace_s=r.float("stop_grace_s", stop_grace_s, min=0.0, max=600.0),
    )
    r.finish()
    return h


def _restart(r: Reader) -> RestartSpec:
    s = RestartSpec(
        max_restarts=r.int("max_restarts", RestartSpec.max_restarts, min=0),
        window_s=r.float("window_s", RestartSpec.window_s, min=1.0, max=WEEK_S),
        backoff_initial_s=r.float("backoff_initial_s", RestartSpec.backoff_initial_s, min=0.0, max=DAY_S),
        backoff_max_s=r.float("backoff_max_s", RestartSpec.backoff_max_s, min=0.0, max=DAY_S),
        stable_s=r.float("stable_s", RestartSpec.stable_s, min=0.0, max=WEEK_S),
    )
    r.finish()
    if s.backoff_max_s < s.backoff_initial_s:
        r.problem("backoff_max_s", "must be >= backoff_initial_s", s.backoff_max_s)
    return s


def _status(r: Reader) -> StatusSpec:
    s = StatusSpec(
        host=r.str("host", StatusSpec.host, pattern=r"[\w.:-]+", pattern_hint="an address such as 0.0.0.0"),
        port=r.int("port", StatusSpec.port, min=1, max=65535),
    )
    r.finish()
    return s


def _watch(r: Reader) -> WatchSpec:
    d = WatchSpec()
    repo = r.str("repo", None, pattern=HF_REPO, pattern_hint="owner/name")
    branch = r.str("branch", d.branch, pattern=r"[\w][\w./-]{0,199}", pattern_hint="a branch name")
    if branch and ".." in branch:
        r.problem("branch", "must not contain '..'", branch)
        branch = d.branch
    path = r.str("path", d.path, pattern=SAFE_PATH, pattern_hint="a relative path such as deploy.toml or "
                 "pods/a40.toml (no '..', no leading '/')")
    if path and ".." in path.split("/"):
        r.problem("path", "must not step out of the repo or directory with '..'", path)
        path = d.path
    w = WatchSpec(
        repo=repo, branch=branch, path=path,
        poll_s=r.float("poll_s", d.poll_s, min=0.1, max=86400.0),
        max_backoff_s=r.float("max_backoff_s", d.max_backoff_s, min=0.1, max=86400.0),
        dir=r.str("dir", None, pattern=r"/.*", pattern_hint="an absolute path"),
        debounce_s=r.float("debounce_s", d.debounce_s, min=0.0, max=60.0),
        report=r.bool("report", d.report),
        report_s=r.float("report_s", d.report_s, min=1.0, max=86400.0),
    )
    r.finish()
    if w.dir and ".." in Path(w.dir).parts:
        r.problem("dir", "must not contain '..'", w.dir)
    if w.max_backoff_s < w.poll_s:
        r.problem("max_backoff_s", "must be >= poll_s", w.max_backoff_s)
    if w.report_s < w.poll_s:
        r.problem("report_s", "must be >= poll_s (a pod writes its record at most once per poll_s)", w.report_s,
                  f"{w.poll_s:g} or more")
    if branch == FLEET_BRANCH or branch.startswith(CANARY_PREFIX):
        r.problem("branch", f"is where Kiln keeps the fleet's records or canary rollouts ({FLEET_BRANCH}, "
                  f"{CANARY_PREFIX}...): pods watch the branch a publish goes to", branch, "main, or a branch of yours")
    return w


def _startup(r: Reader, engine: str) -> StartupSpec:
    from .levers import LEVERS

    values: dict[str, Any] = {}
    for name, lever in LEVERS.items():
        if lever.kind is int:
            value = r.int(name, None, min=lever.range[0], max=lever.range[1])
        else:
            value = r.str(name, None, choices=lever.choices or None,
                          pattern=lever.pattern, pattern_hint=lever.hint)
        if value is None:
            continue
        why = lever.problem(value, engine)
        if why:
            allowed = lever.hint or (", ".join(lever.choices) if lever.choices else None)
            r.problem(name, why, value, allowed if lever.engine == engine else None)
            continue
        values[name] = value
    values["prefetch"] = r.bool("prefetch", True)
    values["prefetch_streams"] = r.int("prefetch_streams", 1, min=1, max=32)
    values["prefetch_widen_to"] = r.int("prefetch_widen_to", 0, min=0, max=32)
    if 0 < values["prefetch_widen_to"] <= values["prefetch_streams"]:
        r.problem("prefetch_widen_to", f"must be more than prefetch_streams ({values['prefetch_streams']}) "
                  "to widen anything", values["prefetch_widen_to"],
                  f"{values['prefetch_streams'] + 1} to 32, or 0 to keep prefetch_streams")
        values["prefetch_widen_to"] = 0
    values["prefetch_at"] = r.str("prefetch_at", StartupSpec.prefetch_at, choices=PREFETCH_AT)
    r.finish()
    return StartupSpec(**values)


def _cache(r: Reader) -> CacheSpec:
    d = CacheSpec()
    spec = CacheSpec(keep=r.bool("keep", d.keep), max_bytes=r.int("max_bytes", d.max_bytes, min=0, max=1 << 46),
                     max_entries=r.int("max_entries", d.max_entries, min=0, max=1024),
                     min_tokens=r.int("min_tokens", d.min_tokens, min=1, max=1 << 30),
                     save_s=r.float("save_s", d.save_s, min=0.0, max=3600.0),
                     restore_s=r.float("restore_s", d.restore_s, min=0.0, max=3600.0))
    r.finish()
    return spec


def _plan(r: Reader) -> PlanSpec:
    d = PlanSpec()
    spec = PlanSpec(gpu=r.str("gpu", d.gpu), cards=r.int("cards", d.cards, min=0, max=64),
                    card_mib=r.int("card_mib", d.card_mib, min=0, max=1 << 24),
                    kv_tokens=r.int("kv_tokens", d.kv_tokens, min=0, max=1 << 40),
                    decode_tok_s=r.float("decode_tok_s", d.decode_tok_s, min=0.0, max=1_000_000.0),
                    basis=r.str("basis", d.basis))
    r.finish()
    return spec


def _runpod(r: Reader, url_env: str | None) -> SelfTerminateSpec:
    d = SelfTerminateSpec()
    url = r.str("api_url", d.api_url, pattern=r"https?://[\w.:\[\]-]+(/[\w./-]*)?",
                pattern_hint=f"RunPod's API, {RUNPOD_API_URL}")
    why = runpod_url_problem(url, from_env=False) if url != d.api_url else None
    if why:
        r.problem("api_url", why, url, RUNPOD_API_URL)
        url = d.api_url
    if url_env is not None:             # the image's or pod's own environment: a stand-in, for tests
        why = runpod_url_problem(url_env, from_env=True)
        if why:
            r.problem(f"api_url (from env {RUNPOD_API_URL_ENV})", why, url_env,
                      "an https URL, or http on loopback (127.0.0.1, ::1, localhost)")
        else:
            url = url_env
    s = SelfTerminateSpec(
        terminate_on_terminal_failure=r.bool("terminate_on_terminal_failure", d.terminate_on_terminal_failure),
        terminate_grace_s=r.float("terminate_grace_s", d.terminate_grace_s, min=0.0, max=86400.0),
        api_url=url,
    )
    r.finish()
    return s


def _serverless(r: Reader, health_path: str | None) -> ServerlessSpec:
    d = ServerlessSpec()
    s = ServerlessSpec(
        exit_grace_s=r.float("exit_grace_s", d.exit_grace_s, min=0.0, max=DAY_S),
        failure_ttl_s=r.float("failure_ttl_s", d.failure_ttl_s, min=0.0, max=WEEK_S),
        volume=r.str("volume", d.volume, pattern=r"/.*", pattern_hint="an absolute path"),
        active=health_path is not None,
        health_path=health_path or d.health_path,
    )
    r.finish()
    if ".." in Path(s.volume).parts:
        r.problem("volume", "must not contain '..'", s.volume)
    return s


def runpod_url_problem(url: str, *, from_env: bool) -> str | None:
    """Why this pod's RUNPOD_API_KEY must not be sent to `url`, or None. A deploy config (which a
    published config can replace) may name only RunPod's API; the image's or pod's environment
    ($KILN_RUNPOD_API_URL) may name a stand-in: https anywhere, plain http on loopback only."""
    try:
        u = urllib.parse.urlsplit(url)
        host, port = (u.hostname or "").lower(), u.port
    except ValueError:
        return "is not a URL"
    if u.username is not None or u.password is not None or u.query or u.fragment or not host:
        return "must be a plain URL (scheme, host, path): the pod's RunPod key is sent there"
    if from_env:
        if u.scheme == "https" or (u.scheme == "http" and _loopback(host)):
            return None
        return "must be https, or http on loopback: the pod's RunPod key is sent there"
    if u.scheme == "https" and host == RUNPOD_API_HOST and port is None and u.path.rstrip("/") == "/v2":
        return None
    return (f"must be RunPod's API, {RUNPOD_API_URL}: the pod's RunPod key is sent there. A stand-in for "
            f"tests is named in the image's or pod's environment ({RUNPOD_API_URL_ENV}), not in a deploy config")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
