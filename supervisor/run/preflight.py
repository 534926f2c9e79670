"""PREFLIGHT for one config: what must be true before any engine of it starts.

    the hardware (probed once, at boot; its GPU memory then is the reclaim barrier's baseline)
    the engine module, and its binary in this image            -> engine_missing
    the API key (env, file, or generated into the volume)       -> config_rejected
    the driver's CUDA (NVML) against the image's CUDA floor     -> driver_incompatible
    the [hardware] expectations against this host               -> config_rejected
    the engine's flag snapshot (rungs are linted against it)    -> a warning when absent
    where the walk starts: ladder.start, or the rung that won last time on this hardware

Runs at boot and before every reload or rollback walk, on the loop thread: it is quick (no
network). Each failure names what was found, what is needed and the fix.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..engines import apikey
from ..host import cuda, hardware
from ..engines import registry as engines
from ..config import DeployConfig
from ..errors import ConfigError
from ..failure import Failure, FailureClass
from ..ladder.memory import LadderMemory, image_identity, memory_key, start_index
from .runtime import Runtime

log = logging.getLogger("kiln")


def begin(rt: Runtime, boot: DeployConfig, *, status: bool) -> None:
    """PID 1's first steps, once: a subreaper, what an earlier run left behind ended, every child
    journaled, the Hub token read (and every secret known to the redaction), and a busy status port
    said in one clear line before anything starts."""
    from .. import hubclient
    from ..process import leftovers
    from ..process.managed import REGISTRY
    from ..process.pid1 import become_subreaper

    become_subreaper()
    try:
        rt.run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:                # a full disk: the engine's log says so when it is opened (launch.py)
        rt.unwritten(f"the run directory ({rt.run_dir})", f"cannot create the run directory {rt.run_dir}: "
                     f"{e.strerror or e}; the engine's log and the children journal are not kept")
    leftovers.end_leftovers(rt.run_dir, log)
    REGISTRY.journal_to(rt.run_dir, rt.writes)      # a journal the full disk refuses is a warning
    rt.hub_token = hubclient.token(rt.env)
    rt.secrets.add(rt.hub_token, rt.env.get("HF_TOKEN"), rt.env.get("RUNPOD_API_KEY"))
    if status:
        from ..status.listen import STATUS_PORT_FIX, check_free

        check_free("status.port", boot.status.host, boot.status.port, STATUS_PORT_FIX)


def probe(rt: Runtime) -> None:
    rt.hw = rt.hardware_probe()
    rt.rec.update(hardware=rt.hw.to_dict())
    # The probe just read each visible card's memory: that is the baseline (no second NVML session).
    rt.baseline_mib = [g.memory_used_mib for g in rt.hw.gpus] or None


def prepare(rt: Runtime, cfg: DeployConfig, memory: LadderMemory) -> tuple[Failure | None, int]:
    """(failure, first rung): the failure when cfg cannot run here, else None and where to start."""
    rt.cfg, rt.balancers, rt.relaunch_env, rt.launched_env = cfg, {}, {}, {}
    try:
        rt.engine = engines.get(cfg.engine)
    except KeyError as e:
        return Failure(FailureClass.CONFIG_REJECTED, str(e.args[0])), 0
    if not engines.binary_present(cfg.server.binary):
        return Failure(FailureClass.ENGINE_MISSING, engines.missing_binary_message(cfg.server.binary, cfg.engine)), 0
    try:
        key = apikey.resolve(cfg.server.api_key, rt.shared, rt.env)
        rt.secrets.add(key.value)
        rt.key_file = apikey.engine_key_file(key, rt.run_dir)     # a full disk: a problem, never an exit
    except ConfigError as e:
        return Failure(FailureClass.CONFIG_REJECTED, str(e)), 0
    rt.api_key = key.value
    log.info("API key: %s", key.origin)
    if cfg.engine == "router":           # the key that may change where traffic goes: masked like the others
        from ..router.control import read_operator_key

        rt.secrets.add(read_operator_key(cfg.router.operator_key, rt.env))
    if key.value is None:
        rt.rec.warn("the engine runs without an API key (server.api_key = \"none\")")
    # The driver before the hardware guard: a driver too old for this image's CUDA is the cause to
    # name, whatever else differs (beside the flag snapshot: the engine's share/kiln/cuda.json).
    failure, warning = cuda.preflight(Path(cfg.server.flag_snapshot).parent / "cuda.json", probe=rt.driver_probe)
    if warning:
        rt.warn(warning)
    if failure is not None:
        return failure, 0
    assert rt.hw is not None
    mismatches = hardware.check(cfg.hardware, rt.hw)
    if mismatches:
        return Failure(FailureClass.CONFIG_REJECTED, "hardware does not match the config: " + "; ".join(mismatches)), 0
    snap_path = Path(cfg.server.flag_snapshot)
    rt.snapshot = rt.engine.load_snapshot(snap_path) if snap_path.is_file() else None
    if rt.snapshot is None and (cfg.server.flag_snapshot or cfg.engine != "router"):
        rt.rec.warn(f"no flag snapshot at {snap_path}: rungs are not linted against the engine's flags")
    key_for_memory = memory_key(cfg, rt.hw, image_identity())
    remembered = memory.recall(key_for_memory) if cfg.ladder.remember else None
    first, why = start_index(cfg, remembered)
    rt.rec.event("ladder", f"starting at rung {first} ({why})")
    if remembered is not None and cfg.ladder.rungs[first].name == remembered:
        # the winner won with what a failure made it relaunch with: start with it, not with the failure
        if env := memory.recall_env(key_for_memory, engines.relaunch_values(rt.engine)):
            rt.relaunch_env[remembered] = env
            rt.rec.event("relaunch", f"{remembered}: remembered from its last win: "
                                     f"{', '.join(f'{k}={v}' for k, v in env.items())}")
    return None, first


def remember(rt: Runtime, cfg: DeployConfig, memory: LadderMemory, rung: str) -> None:
    if cfg.ladder.remember and rt.hw is not None:
        memory.remember(memory_key(cfg, rt.hw, image_identity()), rung, rt.relaunch_env.get(rung))
