"""The fleet's shared vocabulary: where pods write what they did, and what a rollout says to them.

Every supervisor whose [watch] names a Hub repo (with `report` on, the default) keeps one JSON
record in that same repo, on a branch of its own so config commits stay clean and no pod's poll of
the config branch ever sees a report move it:

    hf://OWNER/NAME@kiln-fleet:fleet/<pod>.json     one per pod (RUNPOD_POD_ID, else the hostname)

The record says which pod, what it watches, its state, the live config (hash, Hub revision), the
last few reload verdicts (applied / unchanged / rejected / rolled_back / failed, the cause and a
short stderr tail), the last selftest, and when it was written. supervisor/fleet/reporter.py writes it
(a thread, rate-limited, masked); images/fleet/status.py reads the fleet;
images/fleet/rollout.py waits on it for a canary or a whole fleet.

A canary rollout (`publish-config --canary N`) commits the config to `kiln-canary/<branch>` with
`kiln-canary.json` beside it naming the N pods that may take it (chosen by the publisher from the
records: serving, reporting, first by pod id) and until when. Every reporting pod polls that branch
too; only a named pod takes the config, and only while the assignment is open and unexpired.

The branch names are the config's (config.py FLEET_BRANCH, CANARY_PREFIX: a pod never watches them).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ..config import CANARY_PREFIX, FLEET_BRANCH  # noqa: F401 (FLEET_BRANCH: read here by the fleet's users)

SCHEMA = 1
RECORDS_DIR = "fleet"
CANARY_FILE = "kiln-canary.json"
CANARY_SOURCE = "hub-canary"      # a candidate's source when it came from a canary branch
STALE_HEARTBEATS = 3              # a record older than this many of its heartbeats is stale
VERDICTS_KEPT = 5                 # reload verdicts a record carries, newest last
TAIL_LINES = 12                   # stderr lines a verdict carries
LINE_CHARS = 240
MAX_RECORD_BYTES = 256 * 1024     # a reader skips anything larger: no pod writes that much
POD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# The Hub's commit limit as its own 429 states it: "You have exceeded the rate limit for repository
# commits (128 per hour)" (quoted on a public dataset page and in braindecode/braindecode#947,
# 2026-03-12). The rate-limit docs (huggingface.co/docs/hub/rate-limits) give no commit figure, nor
# whether it counts per repository or per account; pods sharing a repo and a token share it either way.
HUB_COMMITS_PER_HOUR = 128
COMMIT_BUDGET_SHARE = 0.5         # heartbeats may take this share; verdicts and publishes need the rest
OK_OUTCOMES = ("applied", "unchanged")
BAD_OUTCOMES = ("rejected", "rolled_back", "failed")


def pod_id(env: Mapping[str, str]) -> str:
    """This pod's name in the fleet: RUNPOD_POD_ID (RunPod sets it), else the hostname; made safe
    for a file name (anything but letters, digits, . _ - becomes -)."""
    raw = (env.get("RUNPOD_POD_ID") or "").strip()
    if not raw:
        import socket

        raw = socket.gethostname()
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", raw)[:64].strip("-.") or "pod"
    return safe if POD_ID.fullmatch(safe) else f"p{safe}"[:64]


def canary_branch(branch: str) -> str:
    return CANARY_PREFIX + branch


def record_path(pod: str) -> str:
    return f"{RECORDS_DIR}/{pod}.json"


def _line(text: Any, n: int = LINE_CHARS) -> str | None:
    return None if text is None else str(text)[:n]


def _verdict(h: Mapping[str, Any]) -> dict[str, Any]:
    return {"at": h.get("t"), "outcome": h.get("outcome"), "source": h.get("source"), "revision": h.get("revision"),
            "config_hash": h.get("config_hash"), "cause": _line(h.get("cause"), 500),
            "stderr_tail": [_line(x) for x in (h.get("stderr_tail") or [])][-TAIL_LINES:],
            "detected_at": h.get("detected_at"), "took_s": h.get("took_s")}


def build_record(snap: Mapping[str, Any], *, pod: str, watch: Any, seq: int, now: float) -> dict[str, Any]:
    """One pod's record from its /status snapshot. Only named fields travel (never argv, env or
    the engine's key file); the reporter masks every secret in it before it leaves the pod."""
    cfg = snap.get("config") or {}
    history = (snap.get("reload") or {}).get("history") or []
    verdicts = [_verdict(h) for h in history][-VERDICTS_KEPT:]
    st = snap.get("selftest") or None
    fail = snap.get("last_failure") or None
    return {
        "kiln_fleet": SCHEMA, "pod": pod, "version": snap.get("version"),
        "watch": {"repo": watch.repo, "branch": watch.branch, "path": watch.path, "poll_s": watch.poll_s,
                  "report_s": watch.report_s},
        "state": snap.get("state"), "state_since": snap.get("since"), "ready": bool(snap.get("ready")),
        "config": {k: cfg.get(k) for k in ("hash", "revision", "from", "origin", "since")},
        "last_reload": verdicts[-1] if verdicts else None, "reloads": verdicts,
        "selftest": None if not st else {"passed": st.get("passed"), "summary": _line(st.get("summary"), 500),
                                         "decode_tok_s": st.get("decode_tok_s"), "rung": st.get("rung")},
        "last_failure": None if not fail else {"class": fail.get("class"), "reason": _line(fail.get("reason"), 500)},
        "booted_at": round(now - float(snap.get("uptime_s") or 0.0), 3), "reported_at": round(now, 3), "seq": seq,
    }


# -- reading records ------------------------------------------------------------------------------

def age_s(rec: Mapping[str, Any], now: float) -> float | None:
    t = rec.get("reported_at")
    return max(0.0, now - float(t)) if isinstance(t, (int, float)) else None


def report_s(rec: Mapping[str, Any]) -> float:
    """The pod's heartbeat as its record says ([watch] report_s), 600 s when it says nothing usable."""
    try:
        return max(1.0, float((rec.get("watch") or {}).get("report_s") or 600.0))
    except (TypeError, ValueError):
        return 600.0


def stale_after_s(rec: Mapping[str, Any]) -> float:
    return STALE_HEARTBEATS * report_s(rec)


def is_stale(rec: Mapping[str, Any], now: float) -> bool:
    age = age_s(rec, now)
    return age is None or age > stale_after_s(rec)


def live(rec: Mapping[str, Any], now: float) -> bool:
    """Reporting and not shut down: a pod a rollout can count on to answer."""
    return not is_stale(rec, now) and rec.get("state") not in ("STOPPING", "STOPPED")


def heartbeat_commits_per_hour(records: list[Mapping[str, Any]], now: float) -> float:
    """What the live pods' heartbeats alone commit to the Hub in an hour (at least one a report_s)."""
    return sum(3600.0 / report_s(r) for r in records if live(r, now))


def commit_budget_warning(records: list[Mapping[str, Any]], now: float) -> str | None:
    """One line when the heartbeats take more than their share of the Hub's commit limit, with the
    report_s that would bring them back under it; None otherwise."""
    rate = heartbeat_commits_per_hour(records, now)
    budget = HUB_COMMITS_PER_HOUR * COMMIT_BUDGET_SHARE
    if rate <= budget:
        return None
    n = sum(1 for r in records if live(r, now))
    need = int(-(-3600.0 * n // budget))
    return (f"heartbeats: {n} live pod(s) commit ~{rate:.0f} records an hour, more than {budget:.0f} "
            f"(half of the Hub's {HUB_COMMITS_PER_HOUR} commits an hour, as its 429 states it): writes will be "
            f"refused and verdicts delayed; set [watch] report_s >= {need} on every pod")


def watches(rec: Mapping[str, Any], branch: str, path: str) -> bool:
    w = rec.get("watch") or {}
    return w.get("branch") == branch and w.get("path") == path


def verdict_for(rec: Mapping[str, Any], revision: str, source: str | None = None) -> dict[str, Any] | None:
    """The pod's verdict on the config at `revision` (from `source`), newest first; None if none yet."""
    for v in reversed(rec.get("reloads") or []):
        if v.get("revision") == revision and (source is None or v.get("source") == source):
            return v
    return None


def choose_canaries(records: list[Mapping[str, Any]], n: int, now: float) -> list[str]:
    """The N pods a canary goes to: live and SERVING, first by pod id (predictable: the same pods
    take every canary while they are healthy)."""
    ok = sorted(str(r["pod"]) for r in records if live(r, now) and r.get("state") == "SERVING" and r.get("pod"))
    return ok[:n]


# -- the canary assignment ------------------------------------------------------------------------

def assignment(*, pods: list[str], branch: str, path: str, config_hash: str, now: float, expires_at: float,
               state: str = "open", outcome: str | None = None) -> dict[str, Any]:
    return {"kiln_canary": SCHEMA, "state": state, "outcome": outcome, "pods": pods, "branch": branch, "path": path,
            "config_hash": config_hash, "published_at": round(now, 3), "expires_at": round(expires_at, 3)}


def assigned(doc: Any, *, pod: str, path: str, now: float) -> str | None:
    """None when the assignment gives this pod the canary config; else why not (for /status)."""
    if not isinstance(doc, dict) or doc.get("kiln_canary") != SCHEMA:
        return f"{CANARY_FILE} is not a Kiln canary assignment"
    if doc.get("state") != "open":
        return f"the rollout is over ({doc.get('outcome') or doc.get('state')})"
    if doc.get("path") != path:
        return f"it is for {doc.get('path')!r}, this pod watches {path!r}"
    expires = doc.get("expires_at")
    if not isinstance(expires, (int, float)) or now > expires:
        return "the assignment expired"
    pods = doc.get("pods")
    if not isinstance(pods, list) or pod not in pods:
        return f"canary for {', '.join(map(str, pods or [])) or 'nobody'}, not this pod"
    return None
