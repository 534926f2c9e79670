"""The barrier between two rungs: nothing of the previous one may hold memory when the next starts.

A rung that fails with a class in `fall_through` (OOM, config rejection) hands over to the next
rung. Before that one starts, `reclaim()` makes sure no process of ours survives (vLLM workers
that outlive their API server keep VRAM and make the next start OOM, vllm#55510) and GPU memory is
back near the baseline taken before the first launch. The loop runs it as a task (the Barrier
effect) and records its report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import psutil

from ..process.managed import ProcessRegistry


@dataclass(frozen=True)
class ReclaimReport:
    killed: tuple[int, ...]
    vram_back: bool | None        # None: no GPU to check
    waited_s: float
    used_mib: tuple[int, ...] = ()

    def describe(self) -> str:
        parts = [f"reclaim {self.waited_s:.3f}s"]
        if self.killed:
            parts.append(f"killed survivors {list(self.killed)}")
        if self.vram_back is False:
            parts.append(f"GPU memory NOT back to baseline (used MiB {list(self.used_mib)})")
        return ", ".join(parts)


def reclaim(registry: ProcessRegistry, *, baseline_mib: Sequence[int] | None,
            gpu_used: Callable[[], list[int] | None], timeout_s: float, slack_mib: int,
            sleep: Callable[[float], None] = time.sleep) -> ReclaimReport:
    start = time.monotonic()
    killed: list[int] = []
    for pid in registry.survivors(role="engine"):
        try:
            psutil.Process(pid).kill()
            killed.append(pid)
        except psutil.Error:
            pass
    if killed:
        psutil.wait_procs([p for p in (_proc(pid) for pid in killed) if p], timeout=5)
    if not baseline_mib:
        return ReclaimReport(tuple(killed), None, time.monotonic() - start)
    deadline = start + timeout_s
    used: list[int] = []
    while True:
        used = gpu_used() or []
        if used and all(u <= b + slack_mib for u, b in zip(used, baseline_mib)):
            return ReclaimReport(tuple(killed), True, time.monotonic() - start, tuple(used))
        if time.monotonic() >= deadline:
            return ReclaimReport(tuple(killed), False, time.monotonic() - start, tuple(used))
        sleep(0.05)


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None
