"""The gate's arithmetic: how many probes at once, what is measured and how much, when a floor's
verdict is settled early. The gate against real engines and damaged models:
tests/integration/test_selftest_gate.py."""

from __future__ import annotations

from supervisor.config import SelftestSpec, parse_config
from supervisor.selftest.client import Client
from supervisor.selftest.measure import SETTLE_MARGIN, SETTLE_TOKENS, DecodeResult, DecodeSample
from supervisor.selftest.report import Report
from supervisor.selftest.runner import GATE_DECODE_TOKENS, GATE_PREFILL_TOKENS, gate_sizes, probe_width
from supervisor.run.selftest import gate_mode


def client(engine: str, props: dict | None = None) -> Client:
    c = Client("http://127.0.0.1:9", engine=engine)
    c.engine, c.props = engine, props
    return c


def test_probes_go_out_as_many_at_once_as_the_engine_serves_side_by_side():
    assert probe_width(client("llamacpp", {"total_slots": 4}), 8) == 4
    assert probe_width(client("llamacpp", {"total_slots": 16}), 8) == 8
    assert probe_width(client("llamacpp", {"total_slots": 1}), 8) == 1
    assert probe_width(client("llamacpp", {}), 8) == 1                       # no slot count: one at a time
    assert probe_width(client("llamacpp", {"total_slots": True}), 8) == 1
    assert probe_width(client("vllm"), 9) == 9
    assert probe_width(client("openai"), 9) == 1                             # a server it does not know


def report() -> Report:
    return Report(url="u", engine="llamacpp", probe_set="smollm2")


def test_without_floors_the_gate_measures_the_least_that_still_proves_what_can_fail():
    r = report()
    assert gate_sizes(SelftestSpec(decode_tokens=256, prefill_tokens=3000), r) == \
        (GATE_DECODE_TOKENS, GATE_PREFILL_TOKENS)
    assert len(r.notes) == 2 and all("mode = \"full\" measures it all" in n for n in r.notes)
    assert gate_sizes(SelftestSpec(decode_tokens=0, prefill_tokens=0), report()) == (0, 0)     # skipped stays skipped
    assert gate_sizes(SelftestSpec(decode_tokens=20, prefill_tokens=100), report()) == (20, 100)


def test_a_floor_keeps_its_measurement_whole():
    r = report()
    spec = SelftestSpec(decode_tokens=600, min_decode_tok_s=1.5, prefill_tokens=3000, min_prefill_tok_s=100)
    assert gate_sizes(spec, r) == (600, 3000) and r.notes == []


def sample(steps: int, seconds: float) -> DecodeSample:
    return DecodeSample(prompt="p", chunks=steps + 1, steps=steps, completion_tokens=steps + 1, finish_reason="length",
                        client_s=seconds, engine_steps=None, engine_s=None, metrics=None, verdict=None)


def test_a_floors_verdict_is_settled_early_only_far_from_it_and_on_enough_tokens():
    fast = DecodeResult(target_tokens=600, samples=[sample(SETTLE_TOKENS - 1, 10.0)])    # 6.3 tok/s, 64 tokens
    fast.settle(1.5)
    assert fast.settled and "4.20x the floor" in fast.settled and fast.enough
    few = DecodeResult(target_tokens=600, samples=[sample(20, 2.0)])                    # fast, but 21 tokens
    few.settle(1.5)
    assert few.settled is None and not few.enough
    near = DecodeResult(target_tokens=600, samples=[sample(99, 99 / (1.5 * SETTLE_MARGIN * 0.99))])
    near.settle(1.5)
    assert near.settled is None                                                          # just under the margin
    slow = DecodeResult(target_tokens=600, samples=[sample(99, 100.0)])                  # 0.99 tok/s: clearly under
    slow.settle(1.5)
    assert slow.settled and slow.enough
    none = DecodeResult(target_tokens=600, samples=[sample(99, 10.0)])
    none.settle(0.0)                                                                     # no floor: nothing settles
    assert none.settled is None


def test_the_gate_runs_on_a_serverless_worker_unless_the_config_says_otherwise():
    base = 'engine = "llamacpp"\n[model]\nsource = "/m.gguf"\n[[ladder.rungs]]\nname = "a"\n'
    worker = {"PORT": "8000", "PORT_HEALTH": "8001"}
    assert gate_mode(parse_config(base, env=worker)) is True
    assert gate_mode(parse_config(base, env={})) is False
    assert gate_mode(parse_config(base + '[selftest]\nmode = "full"\n', env=worker)) is False
    assert gate_mode(parse_config(base + '[selftest]\nmode = "gate"\n', env={})) is True
    assert gate_mode(parse_config(base, env={"KILN_SELFTEST_MODE": "gate"})) is True
