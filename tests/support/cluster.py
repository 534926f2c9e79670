"""The deploy config every node of the tests' loopback cluster runs (tests/integration/test_cluster_*.py;
the nodes themselves: kiln_dev/loopback_cluster.py)."""

from __future__ import annotations

from pathlib import Path

from kiln_dev.loopback_cluster import node_deploy

BOOT_S = 420          # one two-node boot on a loaded 2-core machine, with room to spare
LOST_S = 4            # KILN_CLUSTER_LOST_S: silence that counts as a dead or hung rank
KEY = "cluster-canary-key"
# The tiny random llama's answers are noise and the selftest's fatal code probe fails on it: the
# lifecycle tests run without it; tests/integration/test_cluster_selftest.py runs it on a real model.
SELFTEST = "[selftest]\nenabled = false\n"


def deploy(tmp: Path, *, model: Path, binary: Path, snapshot: Path, port: int, sport: int) -> str:
    """The one deploy config every node of the cluster runs (ports moved per node by the env)."""
    return node_deploy(tmp, model=model, binary=binary, snapshot=snapshot, port=port, sport=sport, boot_s=BOOT_S,
                       selftest=SELFTEST)
