"""The field notes' A40 lesson (NCCL_P2P_DISABLE=1 for tensor parallelism, field notes
§ "Tensor parallelism on A40 pairs") binds only configs that can land on an A40 (issue 40 item 3): a config whose
[hardware] min_compute_capability keeps it on NVLink nodes (H100 9.0, B200 10.0) may leave P2P on,
while every config that can still run on an A40 is held to it, as before."""

from __future__ import annotations

import pytest

from supervisor.config import parse_config
from supervisor.engines import vllm
from tests.unit.test_vllm_engine import HELP


@pytest.fixture(scope="module")
def snap():
    return vllm.load_snapshot(HELP)


def config(cc: str | None, env: str = ""):
    hardware = f'[hardware]\nmin_compute_capability = "{cc}"\n' if cc else ""
    return parse_config(f"""
engine = "vllm"
[model]
source = "hf://org/model"
entry = "config.json"
family = "generic"
{hardware}[ladder]
[[ladder.rungs]]
name = "tp8"
args = ["-tp", "8", "-pp", "2"]
{env}""", env={})


def lint(c, snap):
    return [str(i) for i in vllm.lint_rung(c, 0, c.ladder.rungs[0], snap)]


@pytest.mark.parametrize("cc", ["9.0", "10.0"])
def test_a_config_kept_off_a40s_may_leave_p2p_on(cc, snap):
    assert lint(config(cc), snap) == []


@pytest.mark.parametrize("cc", [None, "8.0", "8.6"])
def test_a_config_that_can_land_on_an_a40_still_needs_p2p_disabled(cc, snap):
    issues = lint(config(cc), snap)
    assert len(issues) == 1 and "NCCL_P2P_DISABLE" in issues[0] and "min_compute_capability above 8.6" in issues[0]
    assert lint(config(cc, '[ladder.rungs.env]\nNCCL_P2P_DISABLE = "1"\n'), snap) == []
