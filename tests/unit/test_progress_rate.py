"""engines/health.py ProgressMeter: CPU time counts as work only at a share of a core, not as a sum
of crumbs. On the CPU machine's VM (2026-12-02) a sleeping process is charged a little CPU on each
wake-up; summed across looks, a hung and idle engine was reported as a busy spin."""

from __future__ import annotations

from supervisor.engines import health


class Still:
    """A process tree that prints nothing: only its CPU counter moves, as the test says."""

    def tree_pids(self):
        return []

    def last_output_at(self):
        return 0.0


def meter(monkeypatch, cpu_per_look: float, look_s: float = 0.1, looks: int = 30) -> list[bool]:
    m = health.ProgressMeter(Still(), cpu_alone_s=None)        # CPU would always count, if it were work
    state = {"cpu": 0.0}
    monkeypatch.setattr(m, "_counters", lambda: (state["cpu"], 0, 0))
    m._cpu, m._cpu_at = 0.0, 0.0
    seen = []
    for i in range(1, looks + 1):
        state["cpu"] += cpu_per_look
        seen.append(m.moved(now=i * look_s))
    return seen


def test_a_few_percent_of_a_core_summed_over_many_looks_is_not_work(monkeypatch):
    # 0.01 CPU s a look every 0.1 s: 10 % of a core. The old rule summed it to 0.05 s in five looks.
    assert not any(meter(monkeypatch, 0.01))


def test_a_busy_core_is_work_at_every_look(monkeypatch):
    assert all(meter(monkeypatch, 0.1))


def test_a_third_of_a_core_is_work_once_a_window_shows_it(monkeypatch):
    seen = meter(monkeypatch, 0.033)
    assert any(seen) and not all(seen)          # seen within each window, not at every look
