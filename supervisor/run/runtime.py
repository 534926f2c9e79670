"""What the loop knows about the machine it runs on and the config it prepared: one place, so the
stage modules (preflight, launch, selftest stage) take it as an argument instead of reaching into
the loop. Only the loop thread writes it; tasks read what they were started with.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping

from .. import cluster_env
from ..host import cuda
from ..config import DeployConfig
from ..engines.flags import FlagSnapshot
from ..failure import Failure
from ..host.hardware import Hardware
from ..process.statefile import Writes
from ..redact import Secrets
from ..runpod_env import worker_dir
from .record import Record

log = logging.getLogger("kiln")


def own_state_dir(cfg: DeployConfig, env: Mapping[str, str]) -> Path:
    """Where this supervisor keeps what no other may write. Where several supervisors may share
    state_dir on one volume (a Serverless endpoint's workers; a cluster's nodes, NUM_NODES > 1), a
    directory of its own under it (runpod_env.py "The volume"); a pod's is state_dir itself. What
    they share (the Hub cache, the compile caches, the generated API key) stays in state_dir."""
    if cfg.serverless.active or cluster_env.active(env):
        return worker_dir(cfg.state_dir, env)
    return Path(cfg.state_dir)


@dataclass
class Runtime:
    env: Mapping[str, str]
    state_dir: Path                           # this supervisor's own (own_state_dir)
    rec: Record
    secrets: Secrets
    hardware_probe: Callable[[], Hardware]
    gpu_used: Callable[[], list[int] | None]
    driver_probe: Callable[[], Any] = cuda.driver_cuda   # the driver's CUDA version (NVML)
    hw: Hardware | None = None
    baseline_mib: list[int] | None = None     # GPU memory in use before our first launch
    # set by preflight.prepare for the config about to be walked
    cfg: DeployConfig | None = None
    engine: ModuleType | None = None          # supervisor/engines/<name>
    snapshot: FlagSnapshot | None = None
    api_key: str | None = None
    key_file: Path | None = None
    balancers: dict[str, Any] = field(default_factory=dict)   # rung name -> ladder/balanced.py Balancer
    prefetch: Any = None                      # model/prefetch.py Prefetch of this boot, set by the loop
    # rung name -> environment forced on its relaunches after a failure that asks for it (the engine's
    # RELAUNCH_ENV: a vLLM whose forked EngineCore met CUDA runs with spawn); reset with the config
    relaunch_env: dict[str, dict[str, str]] = field(default_factory=dict)
    # rung name -> the values its last launch had for the variables a RELAUNCH_ENV sets (a relaunch
    # that would change nothing is not made)
    launched_env: dict[str, dict[str, str | None]] = field(default_factory=dict)
    hub_token: str | None = None
    shared_dir: Path | None = None            # what every worker or node on the volume shares (None: state_dir)
    # a cluster's rank (run/cluster.py): vLLM's node flags, and the interface variables as defaults
    node_argv: list[str] = field(default_factory=list)
    node_env: dict[str, str] = field(default_factory=dict)
    # the state files' writes (reload book, ladder memory, children journal): a full disk is a warning
    writes: Writes = field(init=False)

    def __post_init__(self) -> None:
        self.writes = Writes(self.unwritten)

    @property
    def shared(self) -> Path:
        """Where what all of an endpoint's workers or a cluster's nodes share lives (the generated API
        key); a pod's state_dir."""
        return self.shared_dir or self.state_dir

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def prompt_cache_dir(self) -> Path:
        """Where saved slots live (supervisor/promptcache/): shared, so a Serverless worker restores what an
        earlier worker of its endpoint saved, and a pod's next boot what its last one did."""
        return self.shared / "prompt-cache"

    def gpu_used_visible(self) -> list[int] | None:
        """Used MiB on the GPUs the engine can see, in the probe's order (the baseline's order)."""
        used = self.gpu_used()
        if used is None or self.hw is None:
            return None
        try:
            return [used[g.index] for g in self.hw.gpus]
        except IndexError:
            return None

    def record_failure(self, fail: Failure) -> None:
        """The failure on /status (masked), in the history and in the log, with its hints."""
        self.rec.bump("failures", fail.failure_class.value)
        d = fail.to_dict()
        d["reason"] = self.secrets.redact(str(d["reason"]))
        d["stderr_tail"] = [self.secrets.redact(x) for x in d["stderr_tail"]][-40:]
        self.rec.update(last_failure=d)
        self.rec.event("failure", f"{fail.failure_class.value}: {d['reason'][:300]}")
        log.error("failure %s%s: %s", fail.failure_class.value, f" on rung {fail.rung}" if fail.rung else "",
                  d["reason"])
        for hint in fail.hints:
            log.error("  hint: %s", self.secrets.redact(hint))

    def warn(self, message: str) -> None:
        self.rec.warn(message)
        log.warning("%s", message)

    def unwritten(self, what: str, warning: str | None) -> None:
        """A state file that cannot be written (the full disk's warning on /status), or can again."""
        if self.rec.stand(f"unwritten:{what}", warning):
            if warning is not None:
                log.warning("%s", warning)
            else:
                log.info("%s is written again", what)

    def timing(self, **kv: float) -> None:
        self.rec.merge("timings", **{k: round(v, 4) for k, v in kv.items()})
