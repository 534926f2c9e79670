"""A cluster's node refused before anything runs, and a rank that never arrives, with real
supervisors on loopback (issue 40). No engine starts in either case (the refusal comes at
PREFLIGHT, the missing rank holds the primary at its launch gate), so these boot no vLLM: the
config names the real CPU build only so that everything before the launch is what a cluster runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln_dev import vllm_cpu
from kiln_dev.loopback_cluster import node_env
from kiln_dev.supervised import Supervised, free_port
from tests.support.cluster import deploy


@pytest.fixture(scope="module")
def engine() -> dict[str, Path]:
    return {"binary": vllm_cpu.require_vllm(), "model": vllm_cpu.require_model("tiny"),
            "snapshot": vllm_cpu.snapshot_file()}


def primary(tmp: Path, engine: dict[str, Path], **extra: str) -> Supervised:
    sport = free_port()
    text = deploy(tmp, port=free_port(), sport=sport, **engine)
    env = node_env(0, nodes=2, master_port=free_port(), primary_status=sport, extra=extra)
    return Supervised(tmp, text, env=env)


def test_a_rank_that_never_arrives_fails_the_group_after_the_stated_timeout_naming_it(tmp_path, engine):
    with primary(tmp_path, engine, KILN_CLUSTER_ARRIVE_S="6", KILN_CLUSTER_MIN_SHM_GIB="0.01") as sup:
        st = sup.wait_state("FAILED", "SERVING", timeout=120)
        assert st["state"] == "FAILED" and st["last_failure"]["class"] == "node_missing", st["last_failure"]
        reason = st["last_failure"]["reason"]
        assert "rank 1 never arrived" in reason and "6 s (KILN_CLUSTER_ARRIVE_S)" in reason
        assert "(the primary's status port)" in reason
        assert st["launches"] == 0 if "launches" in st else True      # nothing launched without the group
        assert not (st.get("engine") or {}).get("pid")
        assert sup.stop() == 3                                         # FAILED before anything served


def test_a_node_with_the_wrong_interface_or_too_little_shm_is_refused_with_the_fix(tmp_path, engine):
    with primary(tmp_path, engine, KILN_CLUSTER_IFNAME="nosuch0", KILN_CLUSTER_MIN_SHM_GIB="100000") as sup:
        st = sup.wait_state("FAILED", "SERVING", timeout=120)
        assert st["state"] == "FAILED" and st["last_failure"]["class"] == "config_rejected"
        reason = st["last_failure"]["reason"]
        assert "network interface 'nosuch0'" in reason and "set KILN_CLUSTER_IFNAME" in reason
        assert "below the 100000 GiB" in reason and "give the pod more shared memory" in reason
        assert "cluster" in st and st["cluster"]["rank"] == 0
        sup.stop()
