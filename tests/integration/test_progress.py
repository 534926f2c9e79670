"""What counts as loading progress (supervisor/engines/health.py ProgressMeter), on real processes:
a read of the weights through mmap shows only as resident memory, and CPU time alone stops counting
past its bound (issue 24: a hung NCCL start-up busy-spins and counted as loading forever)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kiln_dev.supervised import wait_for
from supervisor.engines.health import ProgressMeter
from supervisor.process.managed import ManagedProcess

HELPER = Path(__file__).resolve().parents[1] / "support" / "proc" / "silent_load.py"


@pytest.fixture
def started():
    procs: list[ManagedProcess] = []

    def start(*args: str) -> ManagedProcess:
        lines: list[str] = []
        p = ManagedProcess.start([sys.executable, str(HELPER), *args], on_line=lines.append)
        procs.append(p)
        wait_for(lambda: any(x.startswith("ready") for x in lines), 20, "the helper to be ready")
        return p

    yield start
    for p in procs:
        p.stop(1.0)


def test_weights_read_through_mmap_count_as_progress_without_output_or_read_calls(started, tmp_path):
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"\1" * (128 << 20))
    p = started("mmap", str(weights), str(tmp_path))
    meter = ProgressMeter(p, cpu_alone_s=0.0)          # CPU alone never counts here: only the evidence
    for n in range(2):
        (tmp_path / f"go-{n}").touch()
        wait_for(lambda: (tmp_path / f"done-{n}").exists(), 20, f"chunk {n} read")
        assert meter.moved(), f"64 MiB mapped in (chunk {n}) is progress"
    assert not meter.moved()                           # nothing new since: no progress


def test_cpu_alone_counts_within_its_bound_and_is_a_spin_past_it(started):
    p = started("spin")
    unbounded = ProgressMeter(p)                       # CPU always counts: the old rule
    bounded = ProgressMeter(p, cpu_alone_s=0.0)
    wait_for(lambda: unbounded.moved(), 20, "CPU time to show")
    assert wait_for(lambda: not bounded.moved() and bounded.spinning, 20, "the spin to be seen as one")
