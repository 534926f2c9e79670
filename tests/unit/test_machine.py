"""The lifecycle machine, driven by random event sequences (Hypothesis) and by the named paths.

Every transition the machine asks for must be in state.ALLOWED; it never runs two engines at
once; after TERM nothing of ours runs and it asks to leave exactly once; no event sequence makes
it raise. The world here is a small model: an engine runs from the Launched event the loop would
send until the machine stops it or an EngineDown says it died; a Calibrate is asked only for a
balanced rung out of memory, and the loop answers it with Calibrated.
"""

from __future__ import annotations

import signal
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.lifecycle import events as E
from supervisor.reload.candidate import Candidate
from supervisor.config import parse_config
from supervisor.failure import Failure, FailureClass
from supervisor.lifecycle.machine import Machine
from supervisor.lifecycle.state import ALLOWED, Live, Origin, State

CONFIG = """
engine = "llamacpp"
[model]
source = "/models/m.gguf"
[ladder]
fall_through = ["oom", "config_rejected"]
[[ladder.rungs]]
name = "big"
placement = "{placement}"
[[ladder.rungs]]
name = "small"
[restart]
max_restarts = 2
backoff_initial_s = 1.0
[selftest]
enabled = {selftest}
"""


def live(selftest: bool = True, tag: str = "", placement: str = "autofit") -> Live:
    cfg = parse_config(CONFIG.format(selftest=str(selftest).lower(), placement=placement)
                       + (f"# {tag}\n" if tag else ""), env={})
    return Live(cfg, origin=Origin())


def other_live() -> Live:
    cfg = parse_config(CONFIG.format(selftest="true", placement="balanced").replace('"small"', '"tiny"'), env={})
    return Live(cfg, text="published", origin=Origin("local", "/watch/deploy.toml"))


class World:
    """Feeds events to the machine and checks what it asks for."""

    def __init__(self, m: Machine):
        self.m = m
        self.state = State.PREFLIGHT
        self.running: set[int] = set()       # engines started and not yet stopped or dead
        self.shutdowns = 0
        self.now = 0.0
        self.down: E.EngineDown | None = None     # the last EngineDown the machine took
        self.apply(m.start())

    def apply(self, effects: list[E.Effect]) -> None:
        for fx in effects:
            if isinstance(fx, E.Calibrate):
                rung = next(r for r in self.m.live.cfg.ladder.rungs if r.name == fx.rung)
                assert rung.placement == "balanced" and fx.failure.failure_class == FailureClass.OOM
                assert self.down is not None and fx.token == self.down.token and not self.running
            if isinstance(fx, E.Enter):
                assert fx.state in ALLOWED[self.state], f"{self.state.value} -> {fx.state.value}"
                self.state = fx.state
            elif isinstance(fx, E.Launch):
                assert not self.running, f"launch {fx.token} while {self.running} still runs"
            elif isinstance(fx, E.StopEngine):
                self.running.discard(fx.token)
            elif isinstance(fx, E.Shutdown):
                self.shutdowns += 1
                self.running.clear()
        assert self.state == self.m.state

    def send(self, ev: E.Event) -> list[E.Effect]:
        if isinstance(ev, E.Launched) and self.m.waiting == ("launch", ev.token):
            self.running.add(ev.token)
        if isinstance(ev, E.EngineDown):
            self.running.discard(ev.token)
            self.down = ev
        self.now += 0.5
        effects = self.m.step(ev, self.now)
        self.apply(effects)
        return effects


FAIL = st.sampled_from([Failure(c, "x") for c in (FailureClass.OOM, FailureClass.CRASHED,
                                                 FailureClass.CONFIG_REJECTED, FailureClass.SELFTEST_FAILED,
                                                 FailureClass.STALLED, FailureClass.MODEL_INCOMPATIBLE)])


def expected(draw, world: World) -> E.Event | None:
    """What the loop would most likely send next: the answer the machine waits for, good or bad."""
    m = world.m
    good = draw(st.integers(0, 9)) < 7
    failure = draw(FAIL)
    if m.waiting is None:
        if m.state == State.FAILED and m.release_at is not None and draw(st.booleans()):
            world.now = max(world.now, m.release_at)      # a Serverless worker's grace is over
            return E.Tick()
        if m.state == State.RESTARTING and m.restart_at is not None:
            world.now = max(world.now, m.restart_at)
            return E.Tick()
        if m.candidate is not None and m.candidate.fetch is not None and draw(st.booleans()):
            return E.ModelReady(m.candidate.fetch, path=Path("/models/other.gguf"))
        if m.engine is not None and not good:
            return E.EngineDown(m.engine, failure)
        return None
    what, token = m.waiting
    if what == "prepare":
        return E.Prepared(token, start=draw(st.integers(0, 1))) if good else \
            E.Prepared(token, failure=Failure(FailureClass.DRIVER_INCOMPATIBLE, "old driver"))
    if what == "fetch":
        return E.ModelReady(token, path=Path("/m.gguf")) if good else \
            E.ModelReady(token, failure=Failure(FailureClass.LOAD_ERROR, "gone"))
    if what == "check":
        return E.LaunchChecked(token) if good else E.LaunchChecked(token, failure=failure)
    if what == "barrier":    # a cluster's group gate may refuse the launch (supervisor/cluster/group.py)
        return E.BarrierDone(token) if good else \
            E.BarrierDone(token, failure=Failure(FailureClass.NODE_MISSING, "rank 1 never came back"))
    if what == "launch":
        return E.Launched(token, pid=100 + token) if good else E.EngineDown(token, failure, started=False)
    if what == "health":
        if good:
            return E.HealthDone(token, ready=True)
        return draw(st.sampled_from([E.HealthDone(token, ready=False, stall_reason="quiet"),
                                     E.EngineDown(token, failure)]))
    if what == "selftest":
        if good:
            return E.SelftestDone(token)
        return draw(st.sampled_from([E.SelftestDone(token, failure=Failure(FailureClass.SELFTEST_FAILED, "x")),
                                     E.EngineDown(token, failure)]))
    if what == "stop":
        return E.EngineDown(token, Failure(FailureClass.STALLED, "quiet"))
    if what == "calibrate":
        return E.Calibrated(token, ok=good)
    return None


@st.composite
def event(draw, world: World) -> E.Event:
    if draw(st.integers(0, 9)) < 7:
        ev = expected(draw, world)
        if ev is not None:
            return ev
    m = world.m
    tokens = [t for t in (m.waiting[1] if m.waiting else None, m.engine,
                          m.candidate.fetch if m.candidate else None) if t is not None]
    token = draw(st.sampled_from(tokens + [m.seq + 7, 1])) if tokens else draw(st.integers(0, m.seq + 3))
    kind = draw(st.sampled_from(["prepared", "prepared_bad", "model", "model_bad", "checked", "checked_bad",
                                 "barrier", "launched", "healthy", "stalled", "selftest_ok", "selftest_bad",
                                 "down", "down_unstarted", "calibrated", "candidate", "candidate_bad", "tick",
                                 "hup"]))
    failure = draw(FAIL)
    if kind == "prepared":
        return E.Prepared(token, start=draw(st.integers(0, 1)))
    if kind == "prepared_bad":
        return E.Prepared(token, failure=Failure(FailureClass.DRIVER_INCOMPATIBLE, "old driver"))
    if kind == "model":
        return E.ModelReady(token, path=Path("/models/m.gguf"))
    if kind == "model_bad":
        return E.ModelReady(token, failure=Failure(FailureClass.LOAD_ERROR, "no file"))
    if kind == "checked":
        return E.LaunchChecked(token)
    if kind == "checked_bad":
        return E.LaunchChecked(token, failure=failure)
    if kind == "barrier":
        return E.BarrierDone(token)
    if kind == "launched":
        return E.Launched(token, pid=1000 + token)
    if kind == "healthy":
        return E.HealthDone(token, ready=True, elapsed_s=0.1)
    if kind == "stalled":
        return E.HealthDone(token, ready=False, stall_reason="quiet")
    if kind == "selftest_ok":
        return E.SelftestDone(token)
    if kind == "selftest_bad":
        return E.SelftestDone(token, failure=Failure(FailureClass.SELFTEST_FAILED, "degenerate"))
    if kind == "down":
        return E.EngineDown(token, failure)
    if kind == "calibrated":
        return E.Calibrated(token, ok=draw(st.booleans()))
    if kind == "down_unstarted":
        return E.EngineDown(token, failure, started=False)
    cand = Candidate(source="local", origin="/watch/deploy.toml", data=b"x")
    if kind == "candidate":
        return E.CandidateChecked(cand, draw(st.sampled_from([other_live(), live()])))
    if kind == "candidate_bad":
        return E.CandidateChecked(cand, None, ("engine: nope",))
    if kind == "hup":
        return E.Signal(signal.SIGHUP)
    world.now += draw(st.floats(0, 5))
    return E.Tick()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), selftest=st.booleans(), exit_on_failure=st.booleans(),
       placement=st.sampled_from(["autofit", "balanced"]), release=st.sampled_from([None, 0.0, 2.0]),
       group=st.booleans())
def test_random_event_sequences_keep_every_transition_legal_and_leave_nothing_running(data, selftest,
                                                                                      exit_on_failure, placement,
                                                                                      release, group):
    world = World(Machine(live(selftest, placement=placement), exit_on_failure=exit_on_failure,
                          release_after_s=release, group=group))
    for _ in range(data.draw(st.integers(1, 60))):
        if world.m.done:
            break
        world.send(data.draw(event(world)))
        assert len(world.running) <= 1
    if not world.m.done:
        world.send(E.Signal(signal.SIGTERM))
    assert world.state == State.STOPPED and world.m.done
    assert world.running == set() and world.shutdowns == 1
    assert world.m.step(E.Signal(signal.SIGTERM), world.now + 1) == []     # once stopped, nothing more


# -- the named paths -------------------------------------------------------------------------------

def boot_to_serving(world: World, *, selftest: bool = True) -> int:
    m = world.m
    world.send(E.Prepared(m.waiting[1]))
    world.send(E.ModelReady(m.waiting[1], path=Path("/models/m.gguf")))
    world.send(E.LaunchChecked(m.waiting[1]))
    token = m.waiting[1]
    world.send(E.Launched(token, pid=42))
    world.send(E.HealthDone(token, ready=True))
    if selftest:
        world.send(E.SelftestDone(token))
    assert m.state == State.SERVING
    return token


def test_an_oom_falls_through_to_the_next_rung_after_the_reclaim_barrier():
    world = World(Machine(live()))
    m = world.m
    world.send(E.Prepared(m.waiting[1]))
    world.send(E.ModelReady(m.waiting[1], path=Path("/m.gguf")))
    world.send(E.LaunchChecked(m.waiting[1]))
    first = m.waiting[1]
    world.send(E.Launched(first, pid=1))
    world.send(E.EngineDown(first, Failure(FailureClass.OOM, "cudaMalloc")))
    assert m.rung == 1 and m.waiting[0] == "check"
    world.send(E.LaunchChecked(m.waiting[1]))
    assert m.waiting[0] == "barrier"          # the OOM'd rung is reclaimed before the next starts


def boot_to_launched(world: World) -> int:
    m = world.m
    world.send(E.Prepared(m.waiting[1]))
    world.send(E.ModelReady(m.waiting[1], path=Path("/m.gguf")))
    world.send(E.LaunchChecked(m.waiting[1]))
    token = m.waiting[1]
    world.send(E.Launched(token, pid=1))
    return token


def relaunched(world: World, *, pid: int) -> int:
    """RESTARTING: the backoff runs out, the barrier passes, the same rung is launched again."""
    m = world.m
    world.now = m.restart_at
    world.send(E.Tick())
    world.send(E.BarrierDone(m.waiting[1]))
    token = m.waiting[1]
    world.send(E.Launched(token, pid=pid))
    return token


def test_a_balanced_rung_out_of_memory_re_plans_its_split_and_tries_the_same_rung_again():
    world = World(Machine(live(placement="balanced")))
    m = world.m
    token = boot_to_launched(world)
    effects = world.send(E.EngineDown(token, Failure(FailureClass.OOM, "cudaMalloc", tail=("shortfall",))))
    assert [x for x in effects if isinstance(x, E.Calibrate)] == [
        E.Calibrate(token, "big", Failure(FailureClass.OOM, "cudaMalloc", tail=("shortfall",)))]
    assert m.waiting == ("calibrate", token) and not any(isinstance(x, E.RecordFailure) for x in effects)
    world.send(E.Calibrated(token, ok=True))
    assert m.rung == 0 and m.waiting[0] == "check"            # the same rung, with the new split
    world.send(E.LaunchChecked(m.waiting[1]))
    assert m.waiting[0] == "barrier"


def test_a_balanced_rung_that_cannot_re_plan_falls_through():
    world = World(Machine(live(placement="balanced")))
    m = world.m
    token = boot_to_launched(world)
    world.send(E.EngineDown(token, Failure(FailureClass.OOM, "cudaMalloc")))
    world.send(E.Calibrated(token + 1, ok=True))              # stale: changes nothing
    assert m.waiting == ("calibrate", token)
    world.send(E.Calibrated(token, ok=False))
    assert m.rung == 1 and m.waiting[0] == "check"


def test_only_a_balanced_rung_out_of_memory_is_re_planned():
    for placement, failure in (("autofit", FailureClass.OOM), ("balanced", FailureClass.CRASHED)):
        world = World(Machine(live(placement=placement)))
        token = boot_to_launched(world)
        effects = world.send(E.EngineDown(token, Failure(failure, "x")))
        assert not any(isinstance(x, E.Calibrate) for x in effects)


def test_a_serving_balanced_rung_out_of_memory_re_plans_beside_the_restart():
    world = World(Machine(live(selftest=False, placement="balanced")))
    m = world.m
    token = boot_to_serving(world, selftest=False)
    effects = world.send(E.EngineDown(token, Failure(FailureClass.OOM, "cudaMalloc")))
    assert any(isinstance(x, E.Calibrate) for x in effects) and m.state == State.RESTARTING
    assert m.waiting is None                                   # the restart does not wait for the answer
    assert world.send(E.Calibrated(token, ok=True)) == []


def test_a_stale_health_answer_changes_nothing():
    world = World(Machine(live()))
    token = boot_to_serving(world)
    assert world.m.step(E.HealthDone(token, ready=False, stall_reason="late"), 1.0) == []


def test_a_crash_while_serving_restarts_after_the_backoff_and_a_crash_loop_fails():
    world = World(Machine(live(selftest=False)))
    m = world.m
    token = boot_to_serving(world, selftest=False)
    for i in range(3):
        world.send(E.EngineDown(token, Failure(FailureClass.CRASHED, "SIGKILL", exit_code=-9)))
        if m.state == State.FAILED:
            break
        assert m.state == State.RESTARTING and m.waiting is None
        token = relaunched(world, pid=50 + i)
        world.send(E.HealthDone(token, ready=True))
    assert m.state == State.FAILED and "crash loop" in m.last_failure.reason


def test_a_terminal_failure_on_a_relaunch_is_failed_at_once():
    world = World(Machine(live(selftest=False)))
    m = world.m
    token = boot_to_serving(world, selftest=False)
    world.send(E.EngineDown(token, Failure(FailureClass.CRASHED, "SIGSEGV")))
    token = relaunched(world, pid=7)
    world.send(E.EngineDown(token, Failure(FailureClass.PORT_IN_USE, "bind")))
    assert m.state == State.FAILED


def test_a_candidate_whose_model_downloads_leaves_the_engine_watched_and_a_crash_is_restarted():
    world = World(Machine(live(selftest=False)))
    m = world.m
    token = boot_to_serving(world, selftest=False)
    cand = Candidate(source="local", origin="/w/deploy.toml", data=b"x")
    new = other_live()
    new = Live(parse_config(CONFIG.format(selftest="false", placement="autofit").replace("/models/m.gguf", "/models/other.gguf"),
                            env={}), text="t", origin=Origin("local", "/w/deploy.toml"))
    world.send(E.CandidateChecked(cand, new))
    fetch = m.candidate.fetch
    assert m.state == State.SERVING and fetch is not None          # downloading beside the server
    world.send(E.EngineDown(token, Failure(FailureClass.CRASHED, "SIGKILL", exit_code=-9)))
    assert m.state == State.RESTARTING                              # seen at once, not after the download
    world.send(E.ModelReady(fetch, path=Path("/models/other.gguf")))
    assert m.state == State.RESTARTING and m.candidate.ready        # applied once something serves again
    token = relaunched(world, pid=9)
    world.send(E.HealthDone(token, ready=True))
    assert m.state == State.RELOADING and m.live.cfg.model.source == "/models/other.gguf"


def launched_healthy(world: World) -> list[E.Effect]:
    """A reload's (or rollback's) config prepared, checked, past the barrier, launched and healthy:
    the effects of its health answer."""
    m = world.m
    world.send(E.Prepared(m.waiting[1]))
    world.send(E.LaunchChecked(m.waiting[1]))
    world.send(E.BarrierDone(m.waiting[1]))
    token = m.waiting[1]
    world.send(E.Launched(token, pid=5))
    return world.send(E.HealthDone(token, ready=True))


def test_a_published_config_that_fails_rolls_back_and_says_why():
    world = World(Machine(live(selftest=False)))
    m = world.m
    token = boot_to_serving(world, selftest=False)
    cand = Candidate(source="local", origin="/w/deploy.toml", data=b"x")
    recorded: list[E.RecordReload] = []
    effects = m.step(E.CandidateChecked(cand, Live(other_live().cfg.__class__(**{
        **other_live().cfg.__dict__, "selftest": live(selftest=False).cfg.selftest}), text="t")), 1.0)
    world.apply(effects)
    assert m.state == State.RELOADING and any(isinstance(x, E.StopEngine) and x.token == token for x in effects)
    world.send(E.Prepared(m.waiting[1]))
    world.send(E.LaunchChecked(m.waiting[1], failure=Failure(FailureClass.CONFIG_REJECTED, "lint: --bad")))
    world.send(E.LaunchChecked(m.waiting[1], failure=Failure(FailureClass.CONFIG_REJECTED, "lint: --bad",
                                                             tail=tuple(f"stderr {i}" for i in range(20)))))
    assert m.state == State.ROLLBACK
    effects = launched_healthy(world)
    recorded = [x for x in effects if isinstance(x, E.RecordReload)]
    assert m.state == State.SERVING and [r.outcome for r in recorded] == ["rolled_back"]
    assert recorded[0].causes[0].startswith("config_rejected: lint")
    assert recorded[0].tail == tuple(f"stderr {i}" for i in range(8, 20))    # the fleet record carries it


def test_a_published_config_that_serves_is_marked_good_before_applied_is_recorded():
    """Once /status says "applied", a restart boots the new config: the book's last-good is written
    first (a CI run at e529a17 read "applied" beside the last-good warning of the write still to come)."""
    world = World(Machine(live(selftest=False)))
    m = world.m
    boot_to_serving(world, selftest=False)
    cand = Candidate(source="local", origin="/w/deploy.toml", data=b"x")
    new = Live(parse_config(CONFIG.format(selftest="false", placement="autofit").replace('"small"', '"tiny"'), env={}),
               text="t", origin=Origin("local", "/w/deploy.toml"))
    world.send(E.CandidateChecked(cand, new))
    assert m.state == State.RELOADING
    effects = launched_healthy(world)
    told = [("good" if isinstance(x, E.MarkGood) else x.outcome) for x in effects
            if isinstance(x, (E.MarkGood, E.RecordReload))]
    assert m.state == State.SERVING and told == ["good", "applied"]


def test_a_cluster_rank_whose_engine_crashes_before_the_group_served_restarts_with_the_group_not_failed():
    """Issue 40: in a group a rank's engine dies when its peer does (vLLM's distributed init and the group's
    loss alike), so a crash during the first boot is no verdict on the config: the group restarts under the
    restart policy (backoff, cap, then FAILED) as it does once serving. Off a cluster the walk still ends."""
    for group, crash_state in ((True, "health"), (True, "selftest"), (False, "health")):
        world = World(Machine(live(), group=group))
        m = world.m
        token = boot_to_launched(world)
        if crash_state == "selftest":
            world.send(E.HealthDone(token, ready=True))
            assert m.state == State.SELFTEST
        world.send(E.EngineDown(token, Failure(FailureClass.CRASHED, "the group lost a rank: rank 1's engine is down")))
        if not group:
            assert m.state == State.FAILED
            continue
        assert m.state == State.RESTARTING and m.rung == 0 and m.restart_at is not None
        token = relaunched(world, pid=9)
        world.send(E.HealthDone(token, ready=True))
        world.send(E.SelftestDone(token))
        assert m.state == State.SERVING
        assert m.good is m.live                   # the first config that served is the rollback target


def test_a_cluster_rank_crashing_through_every_boot_restart_is_failed_by_the_cap():
    world = World(Machine(live(), group=True))
    m = world.m
    token = boot_to_launched(world)
    for i in range(4):
        world.send(E.EngineDown(token, Failure(FailureClass.CRASHED, "the group lost a rank")))
        if m.state == State.FAILED:
            break
        token = relaunched(world, pid=20 + i)
    assert m.state == State.FAILED and "crash loop" in m.last_failure.reason


def test_a_cluster_rank_with_a_terminal_failure_at_boot_still_ends_its_walk():
    world = World(Machine(live(), group=True))
    m = world.m
    token = boot_to_launched(world)
    world.send(E.EngineDown(token, Failure(FailureClass.MODEL_INCOMPATIBLE, "unknown architecture")))
    assert m.state == State.FAILED
