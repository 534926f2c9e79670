"""The Serving effect: what is recorded as the engine turns SERVING, before /ready says 200 — the
winning rung remembered (ladder memory), the boot's timings, the engine's output gathered into
batched reads, the model's record, and how much of the model stayed in host RAM."""

from __future__ import annotations

import time
from typing import Any

from ..ladder import residency
from ..ladder.memory import LadderMemory
from ..lifecycle.state import Live
from ..process.managed import ManagedProcess
from . import preflight
from .runtime import Runtime

# A serving engine's output is read at most this often: llama-server writes each of a request's ~10
# lines on its own, and a read per line cost the supervisor more CPU than all else while serving
# (P2b, bench/engine_output.py). A tenth of a second late in `docker logs` and the log file is unseen.
ENGINE_OUTPUT_BATCH_S = 0.1


def serving(rt: Runtime, live: Live, index: int, memory: LadderMemory, proc: ManagedProcess | None,
            model_records: dict[str, dict[str, Any]]) -> None:
    preflight.remember(rt, live.cfg, memory, live.cfg.ladder.rungs[index].name)
    if proc is not None:                       # its boot phases are read: gather its output (P2b)
        proc.batch_output(ENGINE_OUTPUT_BATCH_S)
    if "boot_to_ready_s" not in rt.rec.snapshot()["timings"]:
        rt.timing(boot_to_ready_s=time.monotonic() - rt.rec.start_monotonic)   # as boot.seconds counts it
    record = model_records.get(str(live.model_path))
    if record is not None:
        rt.rec.update(model=record, model_candidate=None)
    estimate, warning = residency.estimate(live.cfg, live.model_path, rt.hw,
                                           gpu_used=rt.gpu_used_visible, baseline_mib=rt.baseline_mib)
    if estimate is not None:
        rt.rec.update(placement_estimate=estimate)
    if warning:
        rt.warn(warning)
