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


def test_no_workload_finds_another_workloads_prompts_in_a_cache():
    """Every workload of a run (and the calibration prompt) has prompts of its own from the first
    word: until 2026-12-05 the 7-session workloads repeated the 5-session ones' first five system
    prompts word for word, and their first turns came from cache (cache_n 1337 of 1338)."""
    tags = [tag for _, _, tag in bench.workloads([5, 7])] + [bench.CALIBRATION_TAG]
    assert len(set(tags)) == len(tags) == 5
    prompts = [(tag, s, bench.system_prompt(tag, s, 300)) for tag in tags for s in range(7)]
    for i, (tag_a, s_a, a) in enumerate(prompts):
        for tag_b, s_b, b in (x for x in prompts[i + 1:] if x[0] != tag_a):
            common = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            assert common < len("[w1"), (tag_a, s_a, tag_b, s_b, common)     # the tag leads: not even the header


def test_the_no_queueing_estimate_charges_what_each_turn_computed():
    def row(turn, ttft, prompt_n, cache_n):
        return {"turn": turn, "ttft": ttft, "prompt_n": prompt_n, "cache_n": cache_n}
    ca = [row(0, 50.0, 2600, 0), row(1, 1.0, 25, 2600), row(2, 1.0, 25, 2630), row(3, 3.0, 25, 2660)]  # warm: 1.0
    rr = [row(0, 60.0, 2600, 0), row(1, 40.0, 2620, 5), row(2, 0.5, 25, 2630), row(3, 41.0, 1400, 1280)]
    est, cold, later, warm = bench.no_queueing_ratio(ca, rr, per_s=100.0)
    assert (cold, later, warm) == (2, 3, 1.0)                  # 1400 of 2680 computed: cold; 25 of 2655: warm
    assert est == (26.0 + 3 * 1.0) / (26.0 + 26.2 + 1.0 + 14.0)
    # a round robin that found every later turn warm leaves cache-aware nothing to win
    assert bench.no_queueing_ratio(ca, [row(0, 60.0, 2600, 0)] + [row(t, 1.0, 25, 2600) for t in (1, 2, 3)],
                                   100.0)[0] == 1.0


def test_p95_and_shares():
    assert bench.p95([float(i) for i in range(1, 21)]) == 19.0
    assert bench.p95([3.0]) == 3.0
    assert bench.shares([1.0, 1.0, 2.0]) == [0.25, 0.25, 0.5] and bench.shares([0.0, 0.0]) == [0.0, 0.0]
