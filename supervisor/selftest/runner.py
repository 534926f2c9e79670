"""Run one selftest against a server and decide: probes, then decode and prefill, then floors.

It only reports: the lifecycle loop (or the CLI) turns a failed report into `selftest_failed`.
Order matters for time: the probes are quick and decide whether measuring means anything at
all (throughput of a model that fails its probes is not worth a minute of a pod's time).

Two ways to run it ([selftest] mode; supervisor/run/selftest.py picks):

- full: the probes one after another, decode on decode_tokens, prefill on prefill_tokens, warm
  prefill after cold. What a pod's boot runs, and `python -m supervisor selftest`.
- gate: what a Serverless worker's cold start runs, where a waiting user pays for every second.
  It asks the same questions and fails on the same answers; it spends less on the way:
  * the probes at once, as many as the engine serves side by side (`probe_width`: llama.cpp's
    slots from the GET /props the sampler check reads anyway, every probe on vLLM, which batches
    them; one at a time on an unknown server). Every probe still runs greedy at temperature 0 and
    is judged alone; a damaged model still fails them (tests/integration/test_selftest_gate.py);
  * measurements sized to what a floor needs. With min_decode_tok_s, decode runs alone on
    decode_tokens, or stops once the floor's verdict is settled (measure.SETTLE_TOKENS at
    SETTLE_MARGIN from it, either way). Without a floor nothing is judged on the rate: one
    streamed prose reply of GATE_DECODE_TOKENS still proves streaming and reports a rate. With
    min_prefill_tok_s, prefill runs on prefill_tokens (the floor is defined on that length: prefill
    slows as the prompt grows); without, on GATE_PREFILL_TOKENS: two chunks, the second served
    from the first's cached prefix (chunked.py's proof), so a long prompt is still built and
    still fails the gate when it fails;
  * nothing measured twice: no warm request when the chunks already proved the prefix cache; no
    /metrics scrape around a decode reply that carries the engine's own `timings` (llama.cpp).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
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
GATE_DECODE_TOKENS = 32      # the gate without a decode floor: one streamed reply (the module doc says why)
GATE_PREFILL_TOKENS = 256    # the gate without a prefill floor: two chunks of chunked.FIRST_CHUNK_TOKENS


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
                 log: Callable[[str], None] | None = None, gate: bool = False) -> Report:
    """The whole selftest, full or as the gate (the module doc). Raises RequestCancelled when the
    client is cancelled (a stop request)."""
    say = log or (lambda _msg: None)
    t0 = time.monotonic()
    deadline = Deadline(spec.timeout_s)
    set_name, probes, note = probe_set(spec.probes or family, tools=spec.tools)
    engine = client.detect()
    report = Report(url=client.url, engine=engine, probe_set=set_name,
                    floors={"min_probe_pass": spec.min_probe_pass, "min_decode_tok_s": spec.min_decode_tok_s,
                            "min_prefill_tok_s": spec.min_prefill_tok_s, "request_wall_s": spec.request_wall_s},
                    mode="gate" if gate else "full")
    if note:
        report.notes.append(note)
    try:
        _check_sampler(client, expected_sampler, report)
        greedy = client.greedy()
        report.probe_width = probe_width(client, len(probes)) if gate else 1
        if report.probe_width > 1:
            say(f"probes: {len(probes)}, {report.probe_width} at once")
        t = time.monotonic()
        report.probes = run_probes(client, probes, greedy, spec, deadline, report, say)
        report.phases["probes"] = time.monotonic() - t
        _judge_probes(report, spec)

        decode_tokens, prefill_tokens = gate_sizes(spec, report) if gate else (spec.decode_tokens, spec.prefill_tokens)
        if report.failures:
            if decode_tokens or prefill_tokens:
                report.skipped.append("decode and prefill measurements: the probes failed, so throughput "
                                      "would be measured on output not worth having")
        else:
            if decode_tokens:
                say(f"decode: timing at least {decode_tokens} tokens of prose")
                t = time.monotonic()
                report.decode = measure_decode(client, decode_tokens, wall_s=spec.request_wall_s,
                                               params=greedy, rate_hint=_probe_rate(report),
                                               remaining_s=deadline.left,
                                               settle_floor=spec.min_decode_tok_s if gate else 0.0,
                                               metrics=not (gate and engine == "llamacpp"))
                report.phases["decode"] = time.monotonic() - t
                _judge_decode(report, spec)
            if prefill_tokens and not deadline.expired():
                say(f"prefill: a {prefill_tokens}-token prompt, chunks under {spec.request_wall_s:g} s")
                t = time.monotonic()
                report.prefill = measure_prefill(client, prefill_tokens, wall_s=spec.request_wall_s,
                                                 params=greedy, remaining_s=deadline.left, warm_unless_proven=gate)
                report.phases["prefill"] = time.monotonic() - t
                _judge_prefill(report, spec)
            if deadline.expired() and not any("timed out" in f for f in report.failures):
                report.failures.append(f"timed out after {spec.timeout_s:g} s (timeout_s)")
    finally:
        report.elapsed_s = time.monotonic() - t0
    return report


def probe_width(client: Client, n: int) -> int:
    """How many probes the gate sends at once: llama.cpp's slots (GET /props `total_slots`; a request
    beyond them waits for a slot), all of them on vLLM (its scheduler batches far more sequences than a
    probe set has), one at a time on a server it does not know."""
    if client.engine == "llamacpp":
        slots = (client.props or {}).get("total_slots")
        ok = isinstance(slots, int) and not isinstance(slots, bool) and slots > 0
        return max(1, min(n, slots)) if ok else 1
    return max(1, n) if client.engine == "vllm" else 1


def gate_sizes(spec: SelftestSpec, report: Report) -> tuple[int, int]:
    """(decode tokens, prefill tokens) the gate measures: as configured where a floor judges them,
    else the least that still proves what can fail (the module doc); each cut said in the report."""
    decode, prefill = spec.decode_tokens, spec.prefill_tokens
    if spec.min_decode_tok_s <= 0 and decode > GATE_DECODE_TOKENS:
        decode = GATE_DECODE_TOKENS
        report.notes.append(f"gate: decode on {decode} tokens, not decode_tokens = {spec.decode_tokens}: no "
                            "min_decode_tok_s judges the rate (mode = \"full\" measures it all)")
    if spec.min_prefill_tok_s <= 0 and prefill > GATE_PREFILL_TOKENS:
        prefill = GATE_PREFILL_TOKENS
        report.notes.append(f"gate: prefill on {prefill} tokens, not prefill_tokens = {spec.prefill_tokens}: no "
                            "min_prefill_tok_s judges the rate (mode = \"full\" measures it all)")
    return decode, prefill


def run_probes(client: Client, probes: tuple[Probe, ...], greedy: dict[str, Any], spec: SelftestSpec,
               deadline: Deadline, report: Report, say: Callable[[str], None]) -> list[ProbeResult]:
    """Every probe, `report.probe_width` at a time, each judged on its own reply; the results in the
    probe set's order. A probe that would start past the deadline does not, and the report says so."""
    def one(probe: Probe) -> ProbeResult | None:
        if deadline.expired():
            return None
        res = run_probe(client, probe, greedy, min(spec.request_wall_s, max(0.1, deadline.left())))
        say(f"probe {probe.name}: {'pass' if res.passed else 'FAIL'} ({res.outcome.reason})")
        return res

    if report.probe_width <= 1:
        results = []
        for probe in probes:
            res = one(probe)
            if res is None:
                break
            results.append(res)
    else:
        with ThreadPoolExecutor(report.probe_width, thread_name_prefix="kiln-probe") as pool:
            results = [r for r in pool.map(one, probes) if r is not None]    # re-raises a cancel
    if len(results) < len(probes):
        report.failures.append(f"timed out after {spec.timeout_s:g} s (timeout_s) during the probes")
    return results


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
