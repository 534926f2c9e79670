"""Stand-ins for the machine: a fake `nvidia-smi`, a fake `pynvml`, and cgroup/proc sysroots."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
NVIDIA_SMI = HERE / "nvidia-smi"          # executable; KILN_FAKE_SMI picks the machine
SYSROOTS = HERE / "sysroots"              # checked-in trees for probe(sysroot=...)
