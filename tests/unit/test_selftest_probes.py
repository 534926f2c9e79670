"""Probe sets and their judges, on real replies (tests/fixtures/selftest) and on the field notes'
quoted outputs; the severity rules that turn probe results into a verdict."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from supervisor.config import SelftestSpec
from supervisor.selftest import probes
from supervisor.selftest.probes import FATAL, INFO, SCORED, Outcome
from supervisor.selftest.report import ProbeResult, Report
from supervisor.selftest.runner import _judge_probes, sampler_from_argv

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "selftest"
SMOL = json.loads((FIX / "smollm2-135m-q4_1-replies.json").read_text())


def by_name(name: str, pset: str = "kimi-k3") -> probes.Probe:
    return next(p for p in probes.SETS[pset] if p.name == name)


def test_every_probe_is_well_formed():
    for set_name, ps in probes.SETS.items():
        names = [p.name for p in ps]
        assert len(names) == len(set(names)), set_name
        assert any(p.severity == FATAL for p in ps), f"{set_name} has no code-exactness probe"
        for p in ps:
            assert p.severity in probes.SEVERITIES and p.mode in (probes.CHAT, probes.COMPLETION, probes.TOOLS)
            assert p.expect or p.judge, p.name
            for rx in p.expect + p.reject:
                re.compile(rx)


@pytest.mark.parametrize("name", [p.name for p in probes.SMOLLM2])
def test_smollm2_answers_its_own_set(name):
    rec = SMOL["probes"][f"smollm2/{name}"]
    out = probes.SETS["smollm2"][[p.name for p in probes.SMOLLM2].index(name)].evaluate(
        rec["reply"], {"finish_reason": rec["finish_reason"]})
    assert out.passed, (rec["reply"], out.reason)


def test_smollm2_fails_the_questions_it_gets_wrong():
    # What it said, recorded: "12 + 30 = 32." and "17:30 + 14:00 = 21:30 hours."
    assert not by_name("arithmetic", "generic").evaluate(SMOL["probes"]["generic/arithmetic"]["reply"]).passed
    assert not by_name("train-duration", "generic").evaluate(SMOL["probes"]["generic/train-duration"]["reply"]).passed
    assert not by_name("code-invert").evaluate(SMOL["probes"]["kimi-k3/code-invert"]["reply"]).passed


def test_the_seed_s_kimi_k3_answers_pass_its_probes():
    # field notes § "Output quality and sampler": what Kimi-K3 answered.
    assert by_name("capital-japan").evaluate(" Tokyo, Washington, Stockholm, Berlin").passed
    assert by_name("train-duration").evaluate("The trip takes 3 hours 30 minutes.").passed
    assert by_name("train-duration").evaluate("The trip duration is 3.5 hours.").passed
    assert by_name("code-invert").evaluate("    return {v: k for k, v in d.items()}\n").passed
    assert by_name("code-fibonacci").evaluate(
        "    if n < 2:\n        return n\n    return fibonacci(n-1) + fibonacci(n-2)\n").passed
    assert by_name("french-knowledge").evaluate(" 1789, avec la prise de la Bastille.").passed


def test_code_exactness_catches_the_seed_s_speculation_corruption():
    add = probes.CODE_ADD
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    assert add.evaluate(good).passed and add.severity == FATAL
    # n-gram speculation on Kimi-Linear (field notes § "n-gram speculation corrupts Kimi-Linear's code"): a fragment re-spliced
    assert not add.evaluate("def add(a, b):\n    return a -b):\n    return a -").passed
    assert not add.evaluate("def add(a, b):\n    return a - b").passed
    fib = by_name("code-fibonacci")
    assert not fib.evaluate("    return fibonacci(n-1(n-1) + fibonacci(n-2)\n").passed


def test_a_loop_that_contains_the_answer_fails():
    loop = "Tokyo is the capital. " + "The capital of Japan is Tokyo. " * 10
    out = by_name("capital-japan", "generic").evaluate(loop)
    assert not out.passed and out.reason.startswith("degenerate")


def test_french_free_form_is_reported_not_fatal_on_kimi_k3():
    fr = by_name("french-free-form")
    assert fr.severity == INFO and "Width50" in fr.note
    good = ("Paris est la capitale de la France et la plus grande ville du pays. Elle est traversée par la "
            "Seine et connue dans le monde entier pour ses monuments, comme la tour Eiffel et le Louvre.")
    assert fr.evaluate(good).passed
    assert not fr.evaluate("Paris est une ville où les gens s'fotrenci dans la rue et la cunce est belle.").passed
    assert not fr.evaluate(SMOL["prose"]["Écris un court paragraphe en français sur la ville de Paris."]).passed
    out = fr.evaluate("Paris is the capital of France and a city of art, food and history on the Seine.")
    assert not out.passed and "not French" in out.reason


def test_chinese_continuation():
    zh = by_name("chinese-continuation")
    assert zh.evaluate("大地一片生机勃勃。小草从土里探出头来，花儿竞相开放，鸟儿在枝头欢快地歌唱。").passed
    assert not zh.evaluate(SMOL["prose"]["Write a paragraph in Chinese about spring."]).passed


def call(city: str, name: str = "get_weather", args: str | None = None) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": args or json.dumps({"city": city})}}


@pytest.mark.parametrize("calls,finish,ok,why", [
    ([call("Paris"), call("Tokyo")], "tool_calls", True, "ok"),
    ([call("Tokyo"), call("paris")], "tool_calls", True, "ok"),
    ([], "stop", False, "no tool calls"),
    ([call("Paris")], "tool_calls", False, "call each"),
    ([call("Paris"), call("Tokyo", name="get_time")], "tool_calls", False, "not get_weather"),
    ([call("Paris"), call("", args="{city: Tokyo")], "tool_calls", False, "not JSON"),
    ([call("Paris"), call("Tokyo")], "stop", False, "finish_reason"),
])
def test_tool_call_probe(calls, finish, ok, why):
    out = probes.TOOL_CALL.evaluate("", {"tool_calls": calls, "finish_reason": finish})
    assert out.passed is ok and why in out.reason


def test_probe_sets_by_family():
    name, ps, note = probes.probe_set("kimi-k3")
    assert name == "kimi-k3" and note is None and probes.TOOL_CALL not in ps
    name, ps, note = probes.probe_set("llama-9000", tools=True)
    assert name == "generic" and "no probe set for family 'llama-9000'" in note and ps[-1] is probes.TOOL_CALL
    assert any(p.severity == FATAL and p.name == "code-fibonacci" for p in probes.SETS["kimi-linear"])


def result(name: str, severity: str, passed: bool) -> ProbeResult:
    return ProbeResult(probes.Probe(name, "q", severity=severity), Outcome(passed, "ok" if passed else "wrong"))


def report_of(*results: ProbeResult) -> Report:
    r = Report(url="http://x", engine="llamacpp", probe_set="t")
    r.probes = list(results)
    return r


def test_severities_decide_the_verdict():
    spec = SelftestSpec(min_probe_pass=0.75)
    r = report_of(result("a", SCORED, True), result("b", SCORED, True), result("c", SCORED, True),
                  result("d", SCORED, False), result("fr", INFO, False), result("code", FATAL, True))
    _judge_probes(r, spec)
    assert r.passed, r.failures                               # 3/4 scored; info never counts
    r = report_of(result("a", SCORED, True), result("b", SCORED, False), result("code", FATAL, True))
    _judge_probes(r, spec)
    assert r.failures == ["1/2 scored probes passed, below min_probe_pass 0.75"]
    r = report_of(result("a", SCORED, True), result("code", FATAL, False))
    _judge_probes(r, spec)
    assert r.failures == ["fatal probe(s) failed: code"]
    assert "FAILED: fatal probe(s) failed: code" in r.summary and "probes 1/1, fatal 0/1" in r.summary


def test_the_report_table_and_record():
    r = report_of(result("capital-japan", SCORED, True), result("code-add", FATAL, False))
    _judge_probes(r, SelftestSpec())
    d = r.to_dict()
    assert d["passed"] is False and d["decode_tok_s"] is None and d["probes"][1]["severity"] == "fatal"
    json.dumps(d)
    table = r.table()
    assert "FAILED" in table and "code-add" in table and "FAIL" in table


def test_the_sampler_the_argv_asked_for():
    argv = ["llama-server", "--model", "m", "--temp", "0.3", "--min-p", "0.1", "--repeat-penalty", "1.05",
            "-t", "1", "--top-k=20"]
    s = sampler_from_argv(argv)
    assert (s.temperature, s.min_p, s.repeat_penalty, s.top_k, s.top_p) == (0.3, 0.1, 1.05, 20, None)


def test_the_configs_probe_set_names_are_the_selftests_sets():
    # config.py (the base) names the sets a config may ask for; the probes live with the selftest
    from supervisor.config import PROBE_SETS
    from supervisor.selftest.probes import SETS

    assert sorted(PROBE_SETS) == sorted(SETS)
