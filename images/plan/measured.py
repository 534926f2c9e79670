"""Kiln's own measurements, kept as data the planner reads beside the field notes' rows (images/plan/measured.json).

A pod booted from a plan reports on /status what it measured after its selftest (the `plan` section:
supervisor/plan/check.py; the `selftest` section's decode tok/s). `bench/plan_record.py` turns one
such /status into a row here; speed.py then prefers it to a bandwidth bound for that model, engine,
GPU kind and count. Each row names where it came from and when. A vLLM pod's row also carries the KV
cache vLLM said it has at boot (plan.checks kv_tokens and kv_cache_gib: supervisor/plan/engine_log.py),
where /status has it; rows without them load as before.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

from supervisor.errors import KilnError

from .seed import SpeedRow

DATA = Path(__file__).with_name("measured.json")


def load(path: Path | None = None) -> tuple[SpeedRow, ...]:
    path = path or DATA
    if not path.is_file():
        return ()
    rows = json.loads(path.read_text())
    return tuple(SpeedRow(match=tuple(r["match"]), engine=r["engine"], gpu=r["gpu"], count=r["count"],
                          resident=r["resident"], streams=r["streams"], decode_tok_s=r["decode_tok_s"],
                          prefill_tok_s=r.get("prefill_tok_s"), source=r["source"], kv_tokens=r.get("kv_tokens"),
                          kv_cache_gib=r.get("kv_cache_gib")) for r in rows)


def _measured(checks: Any, name: str) -> Any:
    row = checks.get(name) if isinstance(checks, dict) else None
    return row.get("measured") if isinstance(row, dict) else None


def row_from_status(status: dict[str, Any], *, match: tuple[str, ...], where: str) -> SpeedRow:
    """A one-stream row from a supervisor's /status: the plan it was booted from (GPU kind, count:
    only resident plans carry one) and the decode its selftest measured."""
    plan, selftest = status.get("plan") or {}, status.get("selftest") or {}
    decode = selftest.get("decode_tok_s")
    if not plan.get("gpu") or not plan.get("cards"):
        raise KilnError(f"{where}: /status has no plan section: was the pod booted from a `plan` deploy config?")
    if not selftest.get("passed") or not decode:
        raise KilnError(f"{where}: the selftest has not passed with a decode measured (selftest: {selftest})")
    engine = plan.get("engine") or ""
    day = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    tokens, gib = _measured(plan.get("checks"), "kv_tokens"), _measured(plan.get("checks"), "kv_cache_gib")
    return SpeedRow(match=match, engine=str(engine), gpu=str(plan["gpu"]), count=int(plan["cards"]), resident=True,
                    streams=1, decode_tok_s=float(decode), prefill_tok_s=selftest.get("prefill_cold_tok_s"),
                    source=f"Kiln's measurement: the selftest of {where}, {day}",
                    kv_tokens=int(tokens) if tokens is not None else None,
                    kv_cache_gib=float(gib) if gib is not None else None)


def append(row: SpeedRow, path: Path | None = None) -> None:
    path = path or DATA
    rows = json.loads(path.read_text()) if path.is_file() else []
    rows.append({"match": list(row.match), "engine": row.engine, "gpu": row.gpu, "count": row.count,
                 "resident": row.resident, "streams": row.streams, "decode_tok_s": row.decode_tok_s,
                 "prefill_tok_s": row.prefill_tok_s, "source": row.source,
                 **{k: v for k, v in (("kv_tokens", row.kv_tokens), ("kv_cache_gib", row.kv_cache_gib))
                    if v is not None}})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rows, indent=1) + "\n")
    os.replace(tmp, path)
