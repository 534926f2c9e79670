"""A Kiln supervisor's status page, read from outside (CI's gate, `pods up`, `pods status`).

/ready turns 200 only after the supervisor serves (and its selftest passed, when on); /status
says where it is: download bytes, the ladder rung, the selftest, the last failure. Reading never
raises: no answer (yet) is None.
"""

from __future__ import annotations

from typing import Any

import requests


def read_status(status_url: str, session: requests.Session, timeout: float = 15.0) -> dict[str, Any] | None:
    """GET <status_url>/status as JSON; None while nothing (or something else) answers."""
    try:
        r = session.get(status_url.rstrip("/") + "/status", timeout=timeout)
        if r.status_code != 200:
            return None
        data = r.json()
        return data if isinstance(data, dict) and "state" in data else None
    except (requests.RequestException, ValueError):
        return None


def is_ready(status_url: str, session: requests.Session, timeout: float = 15.0) -> bool:
    try:
        return session.get(status_url.rstrip("/") + "/ready", timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


def human_bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return "?"


def progress_line(snap: dict[str, Any]) -> str:
    """One line from /status: state, download, rung, selftest or failure."""
    state = str(snap.get("state"))
    parts = [state]
    model = snap.get("model") if isinstance(snap.get("model"), dict) else {}
    fetch = model.get("fetch") if isinstance(model.get("fetch"), dict) else {}
    if state == "FETCH" and fetch:
        if "total" in fetch:
            parts.append(f"download {human_bytes(fetch.get('done'))} of {human_bytes(fetch.get('total'))}")
        elif fetch.get("event"):
            parts.append(f"download: {fetch['event']}")
    rung = snap.get("rung") if isinstance(snap.get("rung"), dict) else {}
    if rung.get("name") and state not in ("PREFLIGHT", "FETCH"):
        where = f" ({rung['index'] + 1} of {rung['count']})" if isinstance(rung.get("index"), int) and \
            isinstance(rung.get("count"), int) else ""
        parts.append(f"rung {rung['name']}{where}")
    selftest = snap.get("selftest") if isinstance(snap.get("selftest"), dict) else None
    if state == "SELFTEST":
        parts.append("selftest running")
    elif selftest:
        if selftest.get("passed") is True:
            decode = selftest.get("decode_tok_s")
            parts.append("selftest passed" + (f", decode {decode:.1f} tok/s" if isinstance(decode, (int, float))
                                              else ""))
        elif selftest.get("passed") is False:
            parts.append(f"selftest failed: {selftest.get('summary') or '?'}")
    elif snap.get("ready") is True:
        parts.append("selftest off")
    if state == "FAILED":
        failure = snap.get("last_failure") if isinstance(snap.get("last_failure"), dict) else {}
        parts.append(f"{failure.get('class') or '?'}: {str(failure.get('reason') or failure.get('message') or '')[:200]}")
    return ", ".join(parts)
