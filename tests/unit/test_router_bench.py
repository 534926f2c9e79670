"""P14's workload (bench/router.py) is honest about what it measures (issue 37 item 11): with its
own defaults the old one sent one request at a time in a fixed session order, so round robin sent
session s to replica s mod 3 on every turn and was session-sticky by arithmetic (1.047 with 6
sessions). The schedule is checked here without any engine: seeded, overlapping, not a multiple of
the replica count, and round robin spreading a session's turns in the order it produces."""

import sys

from kiln_dev.supervised import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
import router as bench  # noqa: E402 - bench/router.py, found through bench/ as the benches find common.py


def plans(sessions):
    d = bench.DEFAULTS
    return bench.schedule(sessions, d["turns"], seed=d["seed"], arrival_s=d["arrival_s"], think_s=d["think_s"])


def test_the_default_session_counts_are_not_multiples_of_the_replica_count():
    assert bench.DEFAULTS["sessions"] and all(n % bench.REPLICAS for n in bench.DEFAULTS["sessions"])


def test_the_schedule_is_seeded_and_its_sessions_arrive_apart():
    a, b = plans(5), plans(5)
    assert a == b                                               # the same seed, the same workload
    assert a != bench.schedule(5, 4, seed=2, arrival_s=2.0, think_s=1.0)
    arrivals = [p.arrival_s for p in a]
    assert arrivals[0] == 0 and arrivals == sorted(arrivals) and len(set(arrivals)) == 5


def test_sessions_overlap():
    for n in (5, 7):
        assert bench.most_in_flight(bench.send_order(plans(n), 1.0), 1.0) >= 3, n


def test_round_robin_is_not_session_sticky_by_arithmetic():
    for n in (5, 7):
        spread = bench.round_robin_replicas(bench.send_order(plans(n), 1.0), bench.REPLICAS)
        assert sum(1 for reps in spread.values() if len(reps) > 1) == n, spread


def test_p95_and_shares():
    assert bench.p95([float(i) for i in range(1, 21)]) == 19.0
    assert bench.p95([3.0]) == 3.0
    assert bench.shares([1.0, 1.0, 2.0]) == [0.25, 0.25, 0.5] and bench.shares([0.0, 0.0]) == [0.0, 0.0]
