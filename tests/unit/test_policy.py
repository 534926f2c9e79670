"""The supervisor's decisions (supervisor/lifecycle/policy.py), one question at a time: where the
ladder falls through, whether a rung re-plans first, which failures are never retried, when a
restart becomes a crash loop, what the backoff does, and what the supervisor exits with.
tests/unit/test_machine.py drives them through the machine; this pins each one alone."""

from __future__ import annotations

import pytest

from supervisor.config import LadderSpec, RestartSpec, Rung
from supervisor.failure import Failure, FailureClass
from supervisor.lifecycle import policy
from supervisor.lifecycle.policy import CrashLoop, GiveUp, Restart

F = FailureClass
LADDER = LadderSpec(rungs=(Rung("big"), Rung("mid"), Rung("small")), fall_through=("oom", "config_rejected"))
SPEC = RestartSpec(max_restarts=2, window_s=60.0, backoff_initial_s=1.0, backoff_max_s=4.0, stable_s=30.0)


@pytest.mark.parametrize("cls, index, expected", [
    (F.OOM, 0, 1),                    # in fall_through: the next rung
    (F.CONFIG_REJECTED, 1, 2),
    (F.OOM, 2, None),                 # the last rung: the walk is over
    (F.CRASHED, 0, None),             # not in fall_through: no other rung would fare better
    (F.SELFTEST_FAILED, 0, None),
])
def test_next_rung_falls_through_only_for_the_ladder_s_classes(cls, index, expected):
    assert policy.next_rung(LADDER, index, Failure(cls, "x")) == expected


def test_a_recalibrated_rung_tries_again_before_falling_through():
    assert policy.next_rung(LADDER, 1, Failure(F.OOM, "x"), recalibrated=True) == 1
    assert policy.next_rung(LADDER, 2, Failure(F.OOM, "x"), recalibrated=True) == 2


@pytest.mark.parametrize("placement, cls, expected", [
    ("balanced", F.OOM, True),
    ("balanced", F.CRASHED, False),
    ("autofit", F.OOM, False),
    ("manual", F.OOM, False),
    ("engine", F.FORK_UNSAFE, True),      # a vLLM forked into CUDA: relaunched with spawn first
    ("engine", F.CRASHED, False),
])
def test_a_balanced_rung_out_of_memory_or_a_fork_into_cuda_re_plans_first(placement, cls, expected):
    assert policy.calibrates(Rung("r", placement=placement), Failure(cls, "x")) is expected


def test_terminal_classes_are_never_retried_and_the_rest_are():
    for cls in FailureClass:
        assert policy.is_terminal(Failure(cls, "x")) is (cls in policy.TERMINAL)
    assert policy.is_terminal(None) is False
    assert {F.OOM, F.CRASHED, F.STALLED}.isdisjoint(policy.TERMINAL)
    assert {F.LOAD_ERROR, F.DRIVER_INCOMPATIBLE, F.SELFTEST_FAILED} <= policy.TERMINAL


def test_a_crash_restarts_after_the_backoff_which_doubles_up_to_its_cap():
    d = policy.after_crash(SPEC, Failure(F.CRASHED, "x"), now=10.0, restarts=(), backoff_s=1.0, relaunch=False)
    assert d == Restart(delay_s=1.0, restarts=(10.0,), next_backoff_s=2.0)
    d = policy.after_crash(SPEC, Failure(F.CRASHED, "x"), now=20.0, restarts=(10.0,), backoff_s=4.0,
                           relaunch=False)
    assert isinstance(d, Restart) and d.next_backoff_s == 4.0 and d.restarts == (10.0, 20.0)


def test_more_restarts_than_allowed_inside_the_window_is_a_crash_loop():
    failure = Failure(F.CRASHED, "SIGKILL", exit_code=-9, tail=("last line",), rung="big")
    d = policy.after_crash(SPEC, failure, now=30.0, restarts=(10.0, 20.0), backoff_s=2.0, relaunch=False)
    assert isinstance(d, CrashLoop)
    assert d.failure.failure_class == F.CRASHED and d.failure.exit_code == -9 and d.failure.tail == ("last line",)
    assert "crash loop: 3 failures within 60 s" in d.failure.reason and d.failure.reason.endswith("SIGKILL")


def test_restarts_older_than_the_window_do_not_count():
    d = policy.after_crash(SPEC, Failure(F.CRASHED, "x"), now=100.0, restarts=(10.0, 20.0), backoff_s=1.0,
                           relaunch=False)
    assert isinstance(d, Restart) and d.restarts == (100.0,)


def test_a_relaunch_that_fails_terminally_gives_up_at_once_and_a_first_crash_does_not():
    terminal = Failure(F.PORT_IN_USE, "bind")
    assert policy.after_crash(SPEC, terminal, now=1.0, restarts=(), backoff_s=1.0, relaunch=True) == GiveUp(terminal)
    assert isinstance(policy.after_crash(SPEC, terminal, now=1.0, restarts=(), backoff_s=1.0, relaunch=False),
                      Restart)


def test_an_engine_that_ran_stable_earns_a_fresh_backoff():
    assert policy.backoff_after_uptime(SPEC, 30.0, 4.0) == 1.0
    assert policy.backoff_after_uptime(SPEC, 29.9, 4.0) == 4.0


def test_leaving_failed_exits_with_the_engine_s_status_or_nothing_served():
    assert policy.failed_exit_code(None) == policy.EXIT_NOTHING_SERVED == 3
    assert policy.failed_exit_code(0) == 3           # nothing failed with a status of its own
    assert policy.failed_exit_code(7) == 7
    assert policy.failed_exit_code(-9) == 137        # killed by SIGKILL: 128 + 9
    assert policy.exit_code_for(-15) == 143 and policy.exit_code_for(0) == 0


def test_only_a_crash_restarts_a_cluster_group_that_never_served():
    assert policy.group_restarts(Failure(FailureClass.CRASHED, "the group lost a rank"))
    for c in FailureClass:
        if c != FailureClass.CRASHED:
            assert not policy.group_restarts(Failure(c, "x")), c    # what the config decides still walks or fails
