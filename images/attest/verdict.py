"""The GPU gate's verdict as an in-toto predicate of Kiln's own: predicateType
https://kiln.dev/selftest-verdict/v1 (a name, as DSSE and in-toto allow a type URI to be; nothing is
served there). in-toto's generic test-result predicate (https://in-toto.io/attestation/test-result/v0.1,
in-toto/attestation spec/predicates/test-result.md) lists test names by outcome; what a deployment needs
from the gate is one verdict with the selftest's measured figures and the card it ran on, so the gate's
own record is signed as it is.

Built from what the gate prints (`python -m images.ci gate`, images/ci/gate.py and images/ci/commands.py):

    {"target": T, "image": REF, "passed": bool, "state": S, "reason": R, "selftest": {...the supervisor's
     report (supervisor/selftest/report.py to_dict)...}, "gate": "local" | "runpod", "gpus": [names],
     "driver": D, "finished": RFC 3339}

The predicate (every field always present, null where the gate had nothing):

    target     the Kiln target the image was built for
    image      the reference the gate ran (a digest reference in CI)
    passed     the gate's verdict: /status ready AND a selftest that passed
    state      the supervisor's last state (READY, FAILED, ...)
    reason     why, in the gate's words
    selftest   the report's key figures: passed, summary, failures, decode_tok_s, prefill_cold_tok_s,
               probe_pass_fraction, degenerate_probes, probe_set, mode, engine, elapsed_s, rung
    gpu        {"names": [...], "count": N, "driver": D} from the pod's /status hardware, or null
    gate       where it ran: local (a GPU runner) or runpod (a pod from a staging template)
    finished   when the verdict was reached (UTC, RFC 3339)
"""

from __future__ import annotations

import re
from typing import Any

from supervisor.errors import KilnError

PREDICATE_TYPE = "https://kiln.dev/selftest-verdict/v1"
KEY_FIGURES = ("passed", "summary", "failures", "decode_tok_s", "prefill_cold_tok_s", "probe_pass_fraction",
               "degenerate_probes", "probe_set", "mode", "engine", "elapsed_s", "rung")
RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")


class VerdictError(KilnError):
    pass


def predicate(gate: Any, source: str = "the gate's verdict") -> dict[str, Any]:
    """The predicate from the gate's JSON; every problem named at once (field, value, fix)."""
    if not isinstance(gate, dict):
        raise VerdictError(f"{source}: not a JSON object (expected what `python -m images.ci gate` prints)")
    problems = []
    for name, kind in (("target", str), ("image", str), ("passed", bool), ("state", str), ("reason", str)):
        if not isinstance(gate.get(name), kind):
            problems.append(f"{name} = {gate.get(name)!r}: expected a {kind.__name__}")
    finished = gate.get("finished")
    if finished is not None and not (isinstance(finished, str) and RFC3339.fullmatch(finished)):
        problems.append(f"finished = {finished!r}: expected an RFC 3339 time such as 2026-12-01T10:00:00Z")
    selftest = gate.get("selftest")
    if selftest is not None and not isinstance(selftest, dict):
        problems.append(f"selftest = {selftest!r}: expected an object or null")
    if problems:
        raise VerdictError(f"{source}: " + "; ".join(problems) + " (make it with `python -m images.ci gate ... > "
                           "verdict.json`)")
    gpus = [g for g in gate.get("gpus") or [] if isinstance(g, str)]
    return {
        "target": gate["target"], "image": gate["image"], "passed": gate["passed"], "state": gate["state"],
        "reason": gate["reason"],
        "selftest": {k: selftest.get(k) for k in KEY_FIGURES} if isinstance(selftest, dict) else None,
        "gpu": {"names": gpus, "count": len(gpus), "driver": gate.get("driver")} if gpus else None,
        "gate": gate.get("gate"), "finished": finished,
    }


def failures(pred: Any) -> list[str]:
    """Why this predicate does not say the image passed (empty when it does)."""
    if not isinstance(pred, dict):
        return ["the verdict's predicate is not an object"]
    out = []
    if pred.get("passed") is not True:
        out.append(f"passed = {pred.get('passed')!r}")
    selftest = pred.get("selftest")
    if isinstance(selftest, dict) and selftest.get("passed") is not True:
        out.append(f"selftest.passed = {selftest.get('passed')!r}")
    if not isinstance(selftest, dict):
        out.append("no selftest report (was [selftest] enabled?)")
    return out


def describe(pred: dict[str, Any]) -> str:
    """One line: what, where, when."""
    selftest = pred.get("selftest") if isinstance(pred.get("selftest"), dict) else {}
    gpu = pred.get("gpu") if isinstance(pred.get("gpu"), dict) else None
    where = f"{gpu['count']}x {', '.join(sorted(set(gpu['names'])))}" if gpu else "no GPU recorded"
    head = "passed" if not failures(pred) else "FAILED"
    summary = selftest.get("summary") or pred.get("reason")
    return f"{head}: {summary} (target {pred.get('target')}, {where}, {pred.get('gate') or 'gate'} " \
           f"{pred.get('finished') or 'at an unrecorded time'})"
