"""The group's rules on the primary (supervisor/cluster/group.py), on a clock the test moves: beats
taken through the same `answer` the status server calls; the other side of the protocol, and all of
it with real supervisors and the real vLLM, is tests/integration/test_cluster_real.py."""

from __future__ import annotations

import threading
from urllib.parse import quote

from supervisor.cluster.group import Group, _Seen
from supervisor.cluster.protocol import Beat, Seal
from supervisor.cluster_env import Node

SECRET = "test-cluster-secret-0123456789"
SENDERS: dict[int, Seal] = {}              # each rank's own seal (its boot id and sequence)


def sealed(beat: Beat) -> bytes:
    return SENDERS.setdefault(beat.rank, Seal(SECRET)).seal(beat)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def primary(nodes: int = 3, **kw):
    clock = Clock()
    local = {"state": "LOADING", "running": False}
    lost: list[str] = []
    node = Node(rank=0, nodes=nodes, primary_addr="10.0.0.1", primary_port=29501, node_addr="10.0.0.1",
                gpus_per_node=1, ifname="lo", arrive_s=kw.get("arrive_s", 30.0), lost_s=5.0, secret=SECRET)
    SENDERS.clear()
    g = Group(node, local=lambda: (local["state"], local["running"], ""), lost=lost.append,
              seal=Seal(SECRET), clock=clock)
    return g, clock, local, lost


def beat(g: Group, rank: int, state: str, running: bool, epoch: int, waiting: bool = False) -> int:
    code, body = g.answer(sealed(Beat(rank, state, running, epoch, waiting)))
    if code == 200:
        SENDERS[rank].open(body, g.node.nodes)       # the answer is a sealed beat too
    return code


def test_the_primary_launches_only_once_every_rank_waits_at_its_gate_with_no_engine():
    g, clock, local, _ = primary(arrive_s=30)
    cancelled = threading.Event()
    out: list[str | None] = []
    t = threading.Thread(target=lambda: out.append(g.launch_gate(cancelled)))
    t.start()
    beat(g, 1, "FETCH", False, 0, waiting=True)
    t.join(0.3)
    assert t.is_alive()                       # rank 2 never arrived: still waiting
    beat(g, 2, "FETCH", False, 0, waiting=True)
    t.join(5)
    assert out == [None]


class Ticking(Clock):
    """A clock one second on at every look: the gate's wait runs past its deadline in 30 looks."""
    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_a_rank_that_never_arrives_fails_the_gate_naming_it():
    g, clock, local, _ = primary(arrive_s=30)
    g._clock = Ticking()
    cancelled = threading.Event()
    beat(g, 1, "FETCH", False, 0, waiting=True)
    g._seen[1].at = float("inf")          # rank 1 stays fresh on the ticking clock
    why = g.launch_gate(cancelled)
    assert why is not None and "rank 2 never arrived" in why and "30 s (KILN_CLUSTER_ARRIVE_S)" in why
    assert "rank 1" not in why


def test_a_failed_rank_fails_the_gate_at_once():
    g, clock, local, _ = primary(nodes=2)
    beat(g, 1, "FAILED", False, 0)
    assert g.launch_gate(threading.Event()) == "rank 1 is FAILED"


def run_epoch(g, clock, local):
    local.update(running=True)
    g.launched()
    for r in (1, 2):
        beat(g, r, "SERVING", True, g.epoch)
    g._check()


def test_ready_waits_for_every_rank_serving_in_this_epoch():
    g, clock, local, lost = primary()
    local.update(running=True)
    g.launched()
    beat(g, 1, "SERVING", True, 1)
    beat(g, 2, "LOADING", True, 1)
    snap = g.ready_gate({"ready": True, "state": "SERVING"})
    assert snap["ready"] is False and "rank 2 LOADING" in snap["not_ready"]
    beat(g, 2, "SERVING", True, 1)
    assert g.ready_gate({"ready": True})["ready"] is True
    clock.t += 6                              # silence past KILN_CLUSTER_LOST_S
    assert "rank 1 silent for 6.0 s" in g.ready_gate({"ready": True})["not_ready"]


def test_a_rank_whose_engine_went_down_is_a_loss_once_per_epoch():
    g, clock, local, lost = primary()
    run_epoch(g, clock, local)
    assert lost == []
    beat(g, 2, "RESTARTING", False, 1)
    g._check()
    g._check()
    assert lost == ["rank 2's engine went down (rank 2 is RESTARTING, with no engine of this epoch)"]
    run_epoch(g, clock, local)                # the next epoch may lose again
    beat(g, 1, "RESTARTING", False, 2)
    g._check()
    assert len(lost) == 2 and "rank 1" in lost[1]


def test_a_rank_whose_engine_died_before_the_primary_saw_it_run_is_a_loss():
    """Its beat says it joined this epoch (a rank's epoch moves only at its launch) and runs no engine:
    it launched and lost its engine between two beats. Before, the primary waited on for an engine it
    never saw, and the rank for a newer epoch: the group stood still until a timeout (seen in
    test_cluster_real with rank 1's engine killed 0.2 s into the first boot)."""
    g, clock, local, lost = primary(nodes=2)
    local.update(running=True)
    g.launched()
    beat(g, 1, "LAUNCHING", False, 0, waiting=True)     # at its gate: the epoch before, not a loss
    g._check()
    assert lost == []
    beat(g, 1, "RESTARTING", False, 1)                  # launched into epoch 1, its engine already gone
    g._check()
    assert lost == ["rank 1's engine went down (rank 1 is RESTARTING, with no engine of this epoch)"]


def test_a_beat_reads_the_epoch_before_the_engine_so_a_launch_between_them_is_no_loss():
    """The beat thread reads while the loop launches (the engine counted, then the epoch moved on): read
    the other way round, a launch between the two reads would make 'joined the new epoch, no engine', a
    loss that never happened. Here the launch lands inside the engine's read."""
    g, clock, local, lost = primary(nodes=2)

    def local_during_a_launch():
        g.launched()                                      # the loop: engine counted, epoch 0 -> 1
        return "LAUNCHING", False, ""                     # ... but this read saw no engine yet

    g._local = local_during_a_launch
    b = g.me()
    assert (b.epoch, b.running) == (0, False)             # the epoch before: no claim to have joined 1


def test_a_silent_rank_is_dead_or_hung_and_nothing_is_lost_without_an_engine():
    g, clock, local, lost = primary()
    run_epoch(g, clock, local)
    clock.t += 4
    beat(g, 1, "SERVING", True, 1)
    clock.t += 2                              # rank 2 silent 6 s, rank 1 2 s
    g._check()
    assert lost == ["rank 2 stopped answering: no beat for 6.0 s (dead or hung)"]
    g2, clock2, local2, lost2 = primary()
    clock2.t += 60                            # not running: a loss means nothing to stop
    g2._check()
    assert lost2 == []


def test_a_bad_beat_is_refused_and_another_rank_is_not_the_primary():
    g, *_ = primary()
    assert g.answer(b"{")[0] == 403
    assert g.answer(sealed(Beat(7, "FETCH", False, 0)))[0] == 403          # no such rank
    assert g.answer(sealed(Beat(0, "FETCH", False, 0)))[0] == 400          # rank 0 is the primary itself
    assert g.answer(quote("x").encode())[0] == 403
    other = Group(Node(1, 2, "10.0.0.1", 29501, "10.0.0.2", 1, "lo", secret=SECRET),
                  local=lambda: ("FETCH", False, ""), lost=lambda _: None, seal=Seal(SECRET))
    assert other.answer(sealed(Beat(1, "FETCH", False, 0)))[0] == 409


def test_a_forged_an_old_or_a_replayed_beat_is_refused_and_changes_nothing():
    """Issue 50: one unauthenticated GET failed a cluster group (a beat of a rank FAILED), and with
    terminate_on_terminal_failure rank 0 then deleted the cluster. Beats are sealed now."""
    import json
    import time

    g, clock, local, lost = primary(nodes=2)
    forged = Beat(1, "FAILED", False, 0).encode()                              # the old, unsealed form
    assert g.answer(forged)[0] == 403
    stranger = Seal("another-clusters-secret-000000").seal(Beat(1, "FAILED", False, 0))
    code, body = g.answer(stranger)
    assert code == 403 and "seal is not this cluster's" in json.loads(body)["error"]
    good = sealed(Beat(1, "FETCH", False, 0, waiting=True))
    assert g.answer(good)[0] == 200
    assert g.answer(good)[0] == 403                                            # the same beat again: a replay
    tampered = json.loads(sealed(Beat(1, "FETCH", False, 0)))
    tampered["state"] = "FAILED"                                               # the seal no longer fits
    assert g.answer(json.dumps(tampered).encode())[0] == 403
    old = Seal(SECRET, clock=lambda: time.time() - 3600).seal(Beat(1, "FAILED", False, 0))
    code, body = g.answer(old)
    assert code == 403 and "from this node's" in json.loads(body)["error"]
    assert g._gone() is None and g.refused == 5                               # no rank counts as gone


def other_rank():
    clock = Clock()
    local = {"state": "LOADING", "running": False}
    lost: list[str] = []
    node = Node(rank=1, nodes=2, primary_addr="10.0.0.1", primary_port=29501, node_addr="10.0.0.2",
                gpus_per_node=1, ifname="lo", arrive_s=30.0, lost_s=5.0, secret=SECRET)
    g = Group(node, local=lambda: (local["state"], local["running"], ""), lost=lost.append,
              seal=Seal(SECRET), clock=clock)
    return g, clock, local, lost


def primary_says(g: Group, state: str, running: bool, epoch: int) -> None:
    """What the other rank's beat brings back (Group._beat keeps the primary's answer this way)."""
    g._seen[0] = _Seen(Beat(0, state, running, epoch), g._clock())


def test_another_rank_joins_the_primarys_newer_epoch_and_loses_it_when_the_primary_restarts():
    g, clock, local, lost = other_rank()
    primary_says(g, "LOADING", True, 3)
    assert g.launch_gate(threading.Event()) is None
    local.update(running=True)
    g.launched()
    assert g.epoch == 3
    primary_says(g, "SERVING", True, 3)
    assert g.headless_up(threading.Event(), lambda: True, 60) is True
    g._check()
    assert lost == []
    primary_says(g, "RESTARTING", False, 3)
    g._check()
    assert lost == ["rank 0's engine went down (rank 0 is RESTARTING, with no engine running)"]


def test_another_rank_loses_a_silent_primary_and_waits_for_a_newer_epoch_before_launching():
    g, clock, local, lost = other_rank()
    primary_says(g, "SERVING", True, 1)
    assert g.launch_gate(threading.Event()) is None
    local.update(running=True)
    g.launched()
    clock.t += 6                                   # no answer from the primary since
    g._check()
    assert lost and lost[0].startswith("rank 0 (the primary) stopped answering: nothing for 6.0 s")
    primary_says(g, "SERVING", True, 1)            # the same epoch again: not a new group to join
    cancelled = threading.Event()
    out: list[str | None] = []
    t = threading.Thread(target=lambda: out.append(g.launch_gate(cancelled)))
    t.start()
    t.join(0.3)
    assert t.is_alive()
    primary_says(g, "LOADING", True, 2)
    t.join(5)
    assert out == [None]


def test_a_failed_probe_is_a_loss_once_the_beats_had_their_say():
    """A rank's engine hung or dead under a live supervisor: its beats look fine, the primary's real
    request through its own API does not answer (cluster/group.py _maybe_probe)."""
    answers: list[str | None] = ["the group's probe: no answer within 30 s (a hung rank)"]
    g, clock, local, lost = primary(nodes=2)
    g._probe = lambda: answers[0]
    local.update(running=True, state="LOADING")
    g.launched()
    g._check()                                        # not serving: no probe, and its clock starts over
    clock.t += g.node.probe_s - 1
    local.update(state="SERVING")
    g._check()
    assert not g._probing                             # serving for less than PROBE_S: not yet
    clock.t += 1
    beat(g, 1, "SERVING", True, 1)                    # rank 1 beats on, as a live supervisor does
    g._check()                                        # starts the probe in its own thread
    assert g.probe_thread is not None
    g.probe_thread.join(10)                           # the probe's own thread, ended
    assert not g._probing
    g._check()
    assert lost == []                                 # the beats get LOST_S to name a rank first
    clock.t += g.node.lost_s
    beat(g, 1, "SERVING", True, 1)
    g._check()
    assert lost == ["the group's probe: no answer within 30 s (a hung rank)"]


def test_while_the_group_forms_every_rank_says_who_it_waits_for():
    """Issue 50 item 13: with rank 2 missing, rank 0 named it, but rank 1's failure blamed "rank 0 (the primary)
    is FETCH" and /ready said only "state=FETCH" while the group waited."""
    g, clock, local, _ = primary(nodes=3, arrive_s=30)
    cancelled = threading.Event()
    t = threading.Thread(target=g.launch_gate, args=(cancelled,))
    t.start()
    try:
        beat(g, 1, "FETCH", False, 0, waiting=True)
        said = g.me()
        assert said.awaiting == "rank 2 never arrived", said
        assert g.ready_gate({"ready": False, "state": "FETCH"})["not_ready"] == \
            "the group is forming: waiting for rank 2 never arrived"
        other, _, _, _ = other_rank()
        other._seen[0] = _Seen(said, other._clock())
        other._waiting = True
        assert other.forming() == "the group is forming: rank 0 (the primary) is LOADING, waiting for rank 2 " \
                                  "never arrived"
        other._waiting = False
        ticking = Ticking()
        other._clock = ticking
        other._seen[0] = _Seen(Beat(0, "FETCH", False, 0, awaiting="rank 2 never arrived"), ticking.t + 1e9)
        why = other.launch_gate(threading.Event())
        assert why and "waiting for rank 2 never arrived" in why, why
    finally:
        cancelled.set()
        t.join(5)
