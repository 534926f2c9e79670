"""The selftest's verdict: a JSON-able report, the record /status shows, and a readable table."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .measure import DecodeResult, PrefillResult
from .probes import FATAL, INFO, SCORED, Outcome, Probe

REPLY_SHOWN = 200      # characters of each reply kept in the report


@dataclass
class ProbeResult:
    probe: Probe
    outcome: Outcome
    reply: str = ""
    finish_reason: str | None = None
    elapsed_s: float = 0.0
    error: str | None = None
    engine_tok_s: float | None = None      # the engine's decode rate on this reply (a sizing hint)

    @property
    def passed(self) -> bool:
        return self.outcome.passed

    def to_dict(self) -> dict[str, Any]:
        v = self.outcome.verdict
        return {"name": self.probe.name, "severity": self.probe.severity, "mode": self.probe.mode,
                "passed": self.passed, "reason": self.outcome.reason, "reply": self.reply[:REPLY_SHOWN],
                "finish_reason": self.finish_reason, "degenerate": v.degenerate if v else None,
                "elapsed_s": round(self.elapsed_s, 3), "note": self.probe.note or None}


@dataclass
class Report:
    url: str
    engine: str
    probe_set: str
    started: float = field(default_factory=time.time)
    elapsed_s: float = 0.0
    probes: list[ProbeResult] = field(default_factory=list)
    decode: DecodeResult | None = None
    prefill: PrefillResult | None = None
    sampler: dict[str, Any] | None = None         # the server's defaults against [sampler]
    floors: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    mode: str = "full"                            # full | gate (runner.py)
    probe_width: int = 1                          # probes sent at once
    phases: dict[str, float] = field(default_factory=dict)    # seconds: probes, decode, prefill

    @property
    def passed(self) -> bool:
        return not self.failures

    def counts(self, severity: str) -> tuple[int, int]:
        these = [p for p in self.probes if p.probe.severity == severity]
        return sum(1 for p in these if p.passed), len(these)

    @property
    def probe_pass_fraction(self) -> float | None:
        ok, n = self.counts(SCORED)
        return ok / n if n else None

    @property
    def degenerate_probes(self) -> list[str]:
        return [p.probe.name for p in self.probes if p.outcome.verdict and p.outcome.verdict.degenerate]

    @property
    def decode_tok_s(self) -> float | None:
        return self.decode.client_tok_s if self.decode and self.decode.valid else None

    @property
    def summary(self) -> str:
        parts = []
        ok, n = self.counts(SCORED)
        fok, fn = self.counts(FATAL)
        parts.append(f"probes {ok}/{n}" + (f", fatal {fok}/{fn}" if fn else ""))
        if self.degenerate_probes:
            parts.append(f"{len(self.degenerate_probes)} degenerate")
        if self.decode is not None:
            d = self.decode_tok_s
            parts.append(f"decode {d:.2f} tok/s on {self.decode.tokens} tokens" if d is not None
                         else "decode void")
        if self.prefill is not None and self.prefill.cold is not None and self.prefill.cold_tok_s is not None:
            parts.append(f"prefill cold {self.prefill.cold_tok_s:.1f} tok/s on {self.prefill.cold.total_tokens} tokens")
        head = "passed" if self.passed else "FAILED: " + "; ".join(self.failures)
        return f"{head} ({', '.join(p for p in parts if p)})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed, "summary": self.summary, "url": self.url, "engine": self.engine,
            "probe_set": self.probe_set, "started": round(self.started, 3), "elapsed_s": round(self.elapsed_s, 3),
            "mode": self.mode, "probe_width": self.probe_width,
            "phases_s": {k: round(v, 3) for k, v in self.phases.items()},
            "decode_tok_s": None if self.decode_tok_s is None else round(self.decode_tok_s, 3),
            "prefill_cold_tok_s": _r(self.prefill.cold_tok_s if self.prefill else None),
            "prefill_warm_s": _r(self.prefill.warm_wall_s if self.prefill else None, 4),
            "probe_pass_fraction": _r(self.probe_pass_fraction, 3),
            "degenerate_probes": self.degenerate_probes,
            "failures": list(self.failures), "notes": list(self.notes), "skipped": list(self.skipped),
            "floors": dict(self.floors), "sampler": self.sampler,
            "probes": [p.to_dict() for p in self.probes],
            "decode": self.decode.to_dict() if self.decode else None,
            "prefill": self.prefill.to_dict() if self.prefill else None,
        }

    def table(self) -> str:
        how = f", as the gate ({self.probe_width} probes at once)" if self.mode == "gate" else ""
        spent = ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items())
        lines = [f"selftest of {self.url} ({self.engine}), probe set {self.probe_set}{how}: "
                 f"{'PASSED' if self.passed else 'FAILED'} in {self.elapsed_s:.1f} s" + (f" ({spent})" if spent else "")]
        if self.probes:
            rows = [("probe", "severity", "result", "reply / reason")]
            for p in self.probes:
                reply = " ".join(p.reply.split())
                reply = reply if len(reply) <= 60 else reply[:57] + "..."
                detail = reply if p.passed else f"{p.outcome.reason}" + (f" | {reply}" if reply else "")
                rows.append((p.probe.name, p.probe.severity, "pass" if p.passed else "FAIL",
                             detail if len(detail) <= 110 else detail[:107] + "..."))
            lines += _grid(rows)
        m = [("measurement", "client", "engine", "detail")]
        if self.decode is not None:
            d = self.decode
            void = sum(1 for s in d.samples if s.void)
            n = len(d.valid)
            detail = (f"{d.tokens} tokens in {n} repl{'y' if n == 1 else 'ies'}" + (f", {void} void" if void else "")
                      + (f", client vs engine {d.error_pct:+.2f}%" if d.error_pct is not None else "")
                      + (f", /metrics {d.metrics_tok_s:.2f} tok/s" if d.metrics_tok_s else "")
                      + (f"; {d.settled}" if d.settled else "")
                      + (f"; {d.error}" if d.error else ""))
            m.append(("decode", _rate(d.client_tok_s if d.valid else None), _rate(d.engine_tok_s), detail))
        if self.prefill is not None and self.prefill.cold is not None:
            p, c = self.prefill, self.prefill.cold
            proof = {True: "each chunk extended the cached prefix", False: "a chunk did NOT extend the prefix",
                     None: "the server does not report cached tokens"}[c.proven] if len(c.chunks) > 1 else "one request"
            m.append(("prefill cold", _rate(p.cold_tok_s), _rate(p.cold_engine_tok_s),
                      f"{c.total_tokens} tokens, {len(c.chunks)} chunk(s) <= {c.max_request_s:.2f} s "
                      f"(wall limit {c.wall_limit_s:g} s); {proof}" + (f"; {p.error}" if p.error else "")))
            if p.warm_skipped:
                m.append(("prefill warm", "—", "", f"not sent: {p.warm_skipped}"))
            if p.warm_wall_s is not None:
                m.append(("prefill warm", _rate(p.warm_tok_s), "",
                          f"{p.warm_new_tokens} tokens reprocessed in {p.warm_wall_s:.3f} s, "
                          f"{p.warm_cached_tokens} from cache"
                          + ("" if p.prefix_cache is not False else " (NO prefix caching)")))
        if len(m) > 1:
            lines += [""] + _grid(m)
        if self.sampler:
            lines.append("")
            lines.append("server sampler defaults: " + ", ".join(f"{k}={v}" for k, v in self.sampler.items()))
        for label, items in (("failures", self.failures), ("notes", self.notes), ("skipped", self.skipped)):
            if items:
                lines.append(f"{label}:")
                lines += [f"  - {x}" for x in items]
        return "\n".join(lines)


def _grid(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    out = []
    for r in rows:
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return out


def _rate(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f} tok/s"


def _r(v: float | None, nd: int = 2) -> float | None:
    return None if v is None else round(v, nd)


__all__ = ["Report", "ProbeResult", "FATAL", "SCORED", "INFO"]
