"""The deploy config every node of the tests' loopback cluster runs (tests/integration/test_cluster_*.py;
the nodes themselves: kiln_dev/loopback_cluster.py)."""

from __future__ import annotations

from pathlib import Path

BOOT_S = 420          # one two-node boot on a loaded 2-core machine, with room to spare
LOST_S = 4            # KILN_CLUSTER_LOST_S: silence that counts as a dead or hung rank
KEY = "cluster-canary-key"
# The tiny random llama's answers are noise and the selftest's fatal code probe fails on it:
# tests/integration/test_cluster_real.py's docstring says what that leaves out.
SELFTEST = "[selftest]\nenabled = false\n"


def deploy(tmp: Path, *, model: Path, binary: Path, snapshot: Path, port: int, sport: int) -> str:
    """The one deploy config every node of the cluster runs (ports moved per node by the env)."""
    return f"""
engine = "vllm"
state_dir = "{tmp / 'state'}"
[model]
source = "{model}"
entry = "config.json"
family = "generic"
[server]
host = "127.0.0.1"
port = {port}
binary = "{binary}"
flag_snapshot = "{snapshot}"
[[ladder.rungs]]
name = "tp2"
args = ["-tp", "2", "--max-model-len", "512", "--enforce-eager"]
[ladder.rungs.env]
VLLM_CPU_KVCACHE_SPACE = "1"
NCCL_P2P_DISABLE = "1"
[health]
stall_s = 300
max_s = {BOOT_S}
stop_grace_s = 10
[restart]
backoff_initial_s = 1
max_restarts = 8
{SELFTEST}
[status]
host = "127.0.0.1"
port = {sport}
"""
