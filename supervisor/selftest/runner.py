"""Run one selftest against a server and decide: probes, then decode and prefill, then floors.

It only reports: the lifecycle loop (or the CLI) turns a failed report into `selftest_failed`.
Order matters for time: the probes are quick and decide whether measuring means anything at
all (throughput of a model that fails its probes is not worth a minute of a pod's time).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from ..config import SamplerSpec, SelftestSpec
from ..engines.llamacpp import SAMPLER_FLAGS as LLAMA_SAMPLER_FLAGS
from .client import Client, ClientError, RequestCancelled
from .measure import measure_decode, measure_prefill
from .probes import COMPLETION, FATAL, SCORED, Outcome, Probe, probe_set
from .report import ProbeResult, Report

# [sampler] field -> the name llama-server's GET /props uses under default_generation_settings.params
SAMPLER_PROPS = {"temperature": "temperature", "min_p": "min_p", "top_p": "top_p", "top_k": "top_k",
                 "repeat_penalty": "repeat_penalty"}


# llama-server's sampler flags, every spelling (engines/llamacpp.SAMPLER_FLAGS) -> [sampler] field
SAMPLER_FLAGS = {flag: field_name for field_name, (flags, _) in LLAMA_SAMPLER_FLAGS.items() for flag in flags}


def sampler_from_argv(argv: list[str]) -> SamplerSpec:
    """The sampler defaults an engine's argv asked for (the last occurrence of a flag wins):
    [sampler] as build_argv wrote it, or a rung's own flags where they replace it."""
    values: dict[str, Any] = {}
    for i, tok in enumerate(argv):
        name, eq, inline = tok.partition("=")
        field_name = SAMPLER_FLAGS.get(name)
        raw = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
        if field_name and raw is not None:
            try:
                values[field_name] = int(raw) if field_name == "top_k" else float(raw)
            except ValueError:
                continue
    return SamplerSpec(**values)


class Deadline:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds
        self.seconds = seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def expired(self) -> bool:
        return self.left() <= 0


def run_selftest(client: Client, spec: SelftestSpec, *, family: str = "generic",
                 expected_sampler: SamplerSpec | None = None,
                 log: Callable[[str], None] | None = None) -> Report:
    """The whole selftest. Raises RequestCancelled when the client is cancelled (a stop request)."""
    say = log or (lambda _msg: None)
    t0 = time.monotonic()
    deadline = Deadline(spec.timeout_s)
    set_name, probes, note = probe_set(spec.probes or family, tools=spec.tools)
    engine = client.detect()
    report = Report(url=client.url, engine=engine, probe_set=set_name,
                    floors={"min_probe_pass": spec.min_probe_pass, "min_decode_tok_s": spec.min_decode_tok_s,
                            "min_prefill_tok_s": spec.min_prefill_tok_s, "request_wall_s": spec.request_wall_s})
    if note:
        report.notes.append(note)
    try:
        _check_sampler(client, expected_sampler, report)
        greedy = client.greedy()
        for probe in probes:
            if deadline.expired():
                report.failures.append(f"timed out after {spec.timeout_s:g} s (timeout_s) during the probes")
                break
            res = run_probe(client, probe, greedy, min(spec.request_wall_s, max(0.1, deadline.left())))
            report.probes.append(res)
            say(f"probe {probe.name}: {'pass' if res.passed else 'FAIL'} ({res.outcome.reason})")
        _judge_probes(report, spec)

        if report.failures:
            if spec.decode_tokens or spec.prefill_tokens:
                report.skipped.append("decode and prefill measurements: the probes failed, so throughput "
                                      "would be measured on output not worth having")
        else:
            if spec.decode_tokens:
                say(f"decode: timing at least {spec.decode_tokens} tokens of prose")
                report.decode = measure_decode(client, spec.decode_tokens, wall_s=spec.request_wall_s,
                                               params=greedy, rate_hint=_probe_rate(report),
                                               remaining_s=deadline.left)
                _judge_decode(report, spec)
            if spec.prefill_tokens and not deadline.expired():
                say(f"prefill: a {spec.prefill_tokens}-token prompt, chunks under {spec.request_wall_s:g} s")
                report.prefill = measure_prefill(client, spec.prefill_tokens, wall_s=spec.request_wall_s,
                                                 params=greedy, remaining_s=deadline.left)
                _judge_prefill(report, spec)
            if deadline.expired() and not any("timed out" in f for f in report.failures):
                report.failures.append(f"timed out after {spec.timeout_s:g} s (timeout_s)")
    finally:
        report.elapsed_s = time.monotonic() - t0
    return report


def run_probe(client: Client, probe: Probe, greedy: dict[str, Any], timeout_s: float) -> ProbeResult:
    req = probe.request()
    t = time.monotonic()
    try:
        if probe.mode == COMPLETION:
            r = client.complete(req.pop("prompt"), timeout_s=timeout_s, **req, **greedy)
        else:
            r = client.chat(req.pop("messages"), timeout_s=timeout_s, **req, **greedy)
    except RequestCancelled:
        raise
    except ClientError as e:
        return ProbeResult(probe, Outcome(False, f"request failed: {e}"), elapsed_s=time.monotonic() - t,
                           error=str(e))
    outcome = probe.evaluate(r.text, {"finish_reason": r.finish_reason, "tool_calls": r.tool_calls})
    shown = r.text if r.text or not r.tool_calls else str(r.tool_calls)
    rate = (r.timings or {}).get("predicted_per_second")
    return ProbeResult(probe, outcome, reply=shown, finish_reason=r.finish_reason, elapsed_s=time.monotonic() - t,
                       engine_tok_s=float(rate) if isinstance(rate, (int, float)) and rate > 0 else None)


def _probe_rate(report: Report) -> float | None:
    """A first guess at decode speed (to size decode requests under the wall limit)."""
    rates = [p.engine_tok_s for p in report.probes if p.engine_tok_s and math.isfinite(p.engine_tok_s)]
    return min(rates) if rates else None


def _judge_probes(report: Report, spec: SelftestSpec) -> None:
    failed_fatal = [p.probe.name for p in report.probes if p.probe.severity == FATAL and not p.passed]
    if failed_fatal:
        report.failures.append(f"fatal probe(s) failed: {', '.join(failed_fatal)}")
    ok, n = report.counts(SCORED)
    if n and ok / n < spec.min_probe_pass:
        report.failures.append(f"{ok}/{n} scored probes passed, below min_probe_pass {spec.min_probe_pass:g}")
    if report.degenerate_probes:
        report.notes.append(f"degenerate replies: {', '.join(report.degenerate_probes)}")


def _judge_decode(report: Report, spec: SelftestSpec) -> None:
    d = report.decode
    assert d is not None
    rate = d.client_tok_s if d.valid else None
    if d.error:
        # a streamed chat request that errors is a broken engine, floor or not (as a failed prefill is)
        report.failures.append(d.error)
    if not d.enough:
        why = f"only {d.tokens} of {spec.decode_tokens} tokens of non-degenerate output were timed"
        void = [s.void for s in d.samples if s.void]
        if void:
            why += f" ({len(void)} repl{'y' if len(void) == 1 else 'ies'} void: {void[0]})"
        if spec.min_decode_tok_s > 0:
            report.failures.append(f"decode floor {spec.min_decode_tok_s:g} tok/s not verifiable: {why}")
        else:
            report.notes.append(f"decode tok/s is on fewer tokens than asked: {why}")
    if spec.min_decode_tok_s > 0 and rate is not None and rate < spec.min_decode_tok_s:
        report.failures.append(f"decode {rate:.2f} tok/s is below min_decode_tok_s {spec.min_decode_tok_s:g}")
    if d.error_pct is not None and abs(d.error_pct) > 5:
        report.notes.append(f"the client's decode timing differs from the engine's by {d.error_pct:+.1f}%")


def _judge_prefill(report: Report, spec: SelftestSpec) -> None:
    p = report.prefill
    assert p is not None
    if p.cold and p.cold.context_exceeded:
        report.skipped.append(f"prefill: a {spec.prefill_tokens}-token prompt exceeds the server's context "
                              "(lower [selftest] prefill_tokens or raise the context size)")
        return
    if p.error:
        report.failures.append(f"prefill: {p.error}")
        return
    if p.cold and p.cold.proven is False:
        report.notes.append("prefill: a chunk did not extend the cached prefix (no prefix caching): a prompt "
                            "longer than the wall limit allows cannot be built through a proxy")
    if p.prefix_cache is False:
        report.notes.append("prefill warm: the server reprocessed the whole prompt (no prefix caching)")
    if spec.min_prefill_tok_s > 0:
        rate = p.cold_tok_s
        if rate is None or rate < spec.min_prefill_tok_s:
            shown = "unmeasured" if rate is None else f"{rate:.1f} tok/s"
            report.failures.append(f"prefill cold {shown} is below min_prefill_tok_s {spec.min_prefill_tok_s:g}")


def _check_sampler(client: Client, expected: SamplerSpec | None, report: Report) -> None:
    """llama.cpp: do the server's default sampler settings (GET /props) match [sampler]?"""
    if client.engine != "llamacpp" or not client.props:
        return
    params = ((client.props.get("default_generation_settings") or {}).get("params") or {})
    seen = {k: params.get(v) for k, v in SAMPLER_PROPS.items() if v in params}
    report.sampler = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in seen.items()}
    if expected is None:
        return
    wrong = []
    for field_name in SAMPLER_PROPS:
        want = getattr(expected, field_name)
        got = seen.get(field_name)
        if want is None or got is None:
            continue
        if not math.isclose(float(got), float(want), rel_tol=1e-4, abs_tol=1e-4):   # float32 on the server
            wrong.append(f"{field_name} {got:g} (config {want:g})")
    if wrong:
        report.failures.append("the server's sampler defaults are not the config's [sampler]: " + ", ".join(wrong))
