"""`endpoint up --wait`: until a worker of the release `up` made reports healthy, and what went
wrong when none does.

    wait_healthy   poll GET /v2/serverless/{id}/workers: a worker of the release it follows (its
                   `version` that release's; one listed without a version: not stale, isStale the
                   authoritative flag, while that release is the endpoint's latest) and IDLE or
                   RUNNING passed its health path (200: the
                   supervisor serves, its selftest passed or is off); it is healthy once it was
                   read so at every read for the settle window (SETTLE_S), not at its first 200:
                   one that falls out of ready within it failed. While it waits, one request at a
                   time goes to the endpoint's URL (RunPod's key in Authorization, as its docs
                   show), because a load-balancing endpoint at zero workers starts one only for a
                   request in flight. A worker of the release fails when it turns UNHEALTHY
                   or leaves the list before it turned healthy (its process ended); its log is read
                   at once (GET .../workers/{workerId}/logs; whether a log outlives its worker is not
                   documented: it is asked for anyway), where the supervisor's one failure line
                   names the class and cause whatever the phase. FAILED_WORKERS failed workers and
                   none healthy end the wait at once: the release is rolled back, no timeout is
                   waited out (a bad config woke ~95 billed workers in 20 s that way). A release
                   made after it (a teammate's, CI's: the listing's endpointVersion moved on) ends
                   the wait at once: its workers are never taken for the followed release's, and
                   Outcome.replaced_by names it.
    failure_line   that line, out of a worker's log.
    checked        what a healthy worker's 200 vouched for, out of its log: the selftest's PASSED
                   line (probe set, time), or that none ran (the selftest off: nothing checked the
                   model's answers).

The caller (images/cli/endpoint.py) restores the previous release when a new one fails and is
still the endpoint's latest; a release that was replaced is never rolled back (that would undo the
newer one).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import requests

from supervisor.redact import redact
from supervisor.runpod_env import RELEASE_LINE

from . import endpoints
from .api import RunPodAPI, RunPodAPIError
from .endpoint import HEALTH_CHECK_PATH

Say = Callable[[str], None]
READY = ("IDLE", "RUNNING")             # WorkerStatus: ready, or processing a request
# A release is judged by two different workers: one that fails may owe it to its host (a GPU, a
# download that stalled), two that fail with none healthy are the release's own (docs/endpoints.md: Releases
# that cannot take the endpoint down). Both are read at once; no timeout is waited out.
FAILED_WORKERS = 2
# Healthy is ready at every read for this long (`up --settle`): the first 200 alone took a worker
# whose engine died a second later. 30 s: a crash on the first requests or a first batch shows
# within seconds, and it adds half a minute to a release whose cold start takes minutes; the wake
# requests go on meanwhile, so a ready worker is not released idle before it settled.
SETTLE_S = 30.0
# The selftest's verdict in a worker's log (supervisor/selftest/report.py table, logged "selftest | ").
SELFTEST_PASSED = re.compile(r"selftest \| selftest of \S+ \(\S+\), probe set (?P<set>[^,:]+).*: PASSED in "
                             r"(?P<s>[0-9.]+) s")
# What the supervisor prints when it can never serve: as a serverless worker, one line in every
# phase (supervisor/runpod_env.py release_line: a config that does not parse, or a failure once
# running); in any mode "FAILED: <class>: <cause>".
FAILED_LINE = re.compile(r"\bFAILED: (?P<cause>\S+: .*)$")
FAILURE_LINE = re.compile(r"\bfailure (?P<cause>\w+(?: on rung \S+)?: .*)$")
# RunPod's URL for a load-balancing endpoint when its answer carries no requestUrls.
URL_PATTERN = "https://{endpoint_id}.api.runpod.ai"


def base_url(endpoint: dict[str, Any]) -> str:
    urls = endpoint.get("requestUrls") if isinstance(endpoint.get("requestUrls"), dict) else {}
    return str(urls.get("base") or URL_PATTERN.format(endpoint_id=endpoint["id"])).rstrip("/")


def health_url(endpoint: dict[str, Any]) -> str:
    urls = endpoint.get("requestUrls") if isinstance(endpoint.get("requestUrls"), dict) else {}
    return str(urls.get("health") or base_url(endpoint) + HEALTH_CHECK_PATH)


def failure_line(lines: list[str]) -> str | None:
    """The supervisor's own word on why it cannot serve: the line it logs before a serverless
    worker exits, else its last FAILED line, else its last `failure <class>` line."""
    for pattern in (RELEASE_LINE, FAILED_LINE, FAILURE_LINE):
        for line in reversed(lines):
            m = pattern.search(line)
            if m:
                return m.group("cause").strip()
    return None


@dataclass
class Outcome:
    healthy: bool
    version: int | None
    worker: str | None = None               # the healthy worker, or the failing one
    cause: str | None = None                # why not, in one line
    log_tail: list[str] = field(default_factory=list)
    failed: int = 0                         # workers of the release that failed
    settled_s: float = 0.0                  # the healthy worker was read ready this long, at every read
    replaced_by: list[dict[str, Any]] = field(default_factory=list)   # releases made after it, oldest first


class Waker:
    """One request at a time to the endpoint's URL until stopped: RunPod's load balancer starts a
    worker for a request in flight (and answers 400 after 2 minutes without one: then again)."""

    def __init__(self, url: str, api_key: str, session: requests.Session, timeout_s: float = 150.0):
        self.url, self._key, self.session, self.timeout_s = url, api_key, session, timeout_s
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, name="kiln-endpoint-wake", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.sent += 1
            try:
                self.session.get(self.url, headers={"Authorization": f"Bearer {self._key}"}, timeout=self.timeout_s)
            except requests.RequestException:
                pass                         # not answered: the next round sends again
            self.stop.wait(2.0)              # pacing between wake requests, not a wait for a condition

    def __enter__(self) -> "Waker":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()


def _log_lines(api: RunPodAPI, endpoint_id: str, worker_id: str) -> list[str]:
    try:
        events = list(api.worker_logs(endpoint_id, worker_id, tail=400, idle_s=1.0))
    except RunPodAPIError:
        return []
    return [str(e.get("line", "")) for e in events]


def _describe(workers: list[dict[str, Any]], version: int | None) -> str:
    if not workers:
        return "no worker yet"

    def other(w: dict[str, Any]) -> str:
        v = w.get("version")
        if isinstance(v, int) and version is not None and v != version:
            return f" (v{v}, another release)"
        return " (old release)" if w.get("isStale") else ""
    return ", ".join(f"{w.get('id')} {w.get('status')}{other(w)}" for w in workers)


def _of(w: dict[str, Any], version: int | None, current: int | None, latest_only: bool) -> bool:
    """Whether a listed worker runs the release followed. Its `version` says; without one (RunPod:
    "null if unknown"), a worker not stale while that release is the endpoint's latest. Without
    `latest_only` (a change that replaced no container), one of that release or an older one."""
    v = w.get("version")
    if isinstance(v, int) and version is not None:
        return v == version if latest_only else v <= version
    if version is not None and current is not None and current != version:
        return False
    return not w.get("isStale") or not latest_only


def _current(api: RunPodAPI, eid: str, listing: dict[str, Any]) -> int | None:
    v = listing.get("endpointVersion")
    if isinstance(v, int):
        return v
    try:                                     # the listing did not say ("null if unknown"): the releases do
        return endpoints.version_now(api.endpoint_releases(eid))
    except RunPodAPIError:
        return None


def _replaced(api: RunPodAPI, eid: str, version: int, current: int, failed: dict[str, list[str]],
              ready_since: dict[str, float], now: float) -> Outcome:
    """A later release replaced the one followed before a worker of it proved healthy."""
    try:
        newer = endpoints.after(api, eid, version)
    except RunPodAPIError:
        newer = []
    newer = newer or [{"version": current}]
    ready = [t for wid, t in ready_since.items() if wid not in failed]
    state = (f"a worker of it was ready for {now - min(ready):.0f} s, short of the settle window" if ready
             else "no worker of it had turned healthy")
    if failed:
        state += f"; {len(failed)} of its workers failed ({', '.join(failed)})"
    return Outcome(False, version, cause=f"release v{version} (the one this command made) was replaced by "
                   f"{'; '.join(endpoints.describe(r) for r in newer)} before it proved healthy ({state})",
                   failed=len(failed), replaced_by=newer)


def wait_healthy(api: RunPodAPI, endpoint: dict[str, Any], say: Say, *, api_key: str, timeout_s: float,
                 poll_s: float = 5.0, settle_s: float = SETTLE_S, wake: bool = True, latest_only: bool = True,
                 release: int | None = None, session: requests.Session | None = None) -> Outcome:
    """Until a worker of release `release` (the caller's own; None: the version first listed) has
    been ready for `settle_s` at every read, FAILED_WORKERS of them failed, a later release replaced
    it, or `timeout_s` passes (a worker settling then may finish its window). Without `latest_only`
    (a change that replaces no container: workers, scaling) a worker of an older release will do
    too: whether RunPod marks the running ones stale then is not documented."""
    eid = str(endpoint["id"])
    session = session or requests.Session()
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()                   # workers of the release listed so far
    failed: dict[str, list[str]] = {}        # worker id -> its log, read once it failed
    why: dict[str, str] = {}                 # worker id -> what was seen of it, when its log says nothing
    ready_since: dict[str, float] = {}       # worker id -> when it was first read ready (monotonic)
    left: set[str] = set()                   # ready, then stopped by RunPod with nothing wrong in its log
    last = ""
    version = release
    waker = Waker(health_url(endpoint), api_key, session) if wake else None
    if waker:
        waker.__enter__()
    try:
        while True:
            listing = api.endpoint_workers(eid)
            current = _current(api, eid, listing)
            if version is None:
                version = current
            workers = [w for w in listing.get("workers") or [] if isinstance(w, dict)]
            line = f"release v{version}: {_describe(workers, version)}"
            if line != last:
                say(line)
                last = line
            now = time.monotonic()
            if version is not None and current is not None and current > version:
                # Released over: the newer release's workers are not this one's to judge, healthy or
                # not, and this one no longer serves (its workers are replaced, or move on).
                return _replaced(api, eid, version, current, failed, ready_since, now)
            latest = [w for w in workers if _of(w, version, current, latest_only)]
            listed = {str(w.get("id")): str(w.get("status")) for w in latest}
            # Failed: UNHEALTHY (its health path said it can never serve), gone from the list before
            # it was ever ready (the process ended: "only active workers" are listed), or ready once
            # and then not, within the settle window (a crash a moment after it turned ready).
            # Ready and then gone with no cause in its log is a worker RunPod stopped (idle timeout,
            # fewer max workers): it settles nothing and fails nothing. Failed stays failed.
            for wid in sorted((seen | set(listed)) - set(failed) - left):
                status = listed.get(wid, "gone")
                if status in READY:
                    ready_since.setdefault(wid, now)
                elif status == "UNHEALTHY" or status == "gone" or wid in ready_since:
                    lines = _log_lines(api, eid, wid)
                    if status == "gone" and wid in ready_since and failure_line(lines) is None:
                        del ready_since[wid]
                        left.add(wid)
                        say(f"worker {wid} of release v{version} left the list after it was ready, with no "
                            "failure in its log (RunPod stops idle workers): not counted either way")
                        continue
                    if wid in ready_since:
                        why[wid] = f"turned ready, then {status} within the {settle_s:g} s settle window"
                    failed[wid] = lines
                    say(f"worker {wid} of release v{version} failed: {why.get(wid, status)}; "
                        f"{failure_line(failed[wid]) or 'its log names no cause (yet)'}")
            seen |= set(listed)
            settled = next((wid for wid, t in ready_since.items() if wid not in failed and now - t >= settle_s), None)
            if settled is not None:
                return Outcome(True, version, settled, settled_s=settle_s)
            settling = any(wid not in failed for wid in ready_since)
            if len(failed) >= FAILED_WORKERS or now >= deadline + (settle_s if settling else 0.0):
                for wid, lines in failed.items():        # a line logged after the read (the 503 came first)
                    if failure_line(lines) is None:
                        failed[wid] = _log_lines(api, eid, wid) or lines
                if len(failed) >= FAILED_WORKERS:
                    return _failed(version, failed, why, f"{len(failed)} workers of release v{version} failed and "
                                   "none turned healthy")
                return _failed(version, failed, why, f"no worker of release v{version} turned healthy within "
                               f"{timeout_s:.0f} s (last: {_describe(workers, version)})")
            time.sleep(poll_s)               # the polling interval of a condition wait with a deadline
    finally:
        if waker:
            waker.__exit__()


def checked(api: RunPodAPI, endpoint_id: str, worker_id: str) -> str:
    """What the healthy worker's 200 vouched for, from its log: the health path answers 200 once the
    engine serves and the selftest passed, or at once when the selftest is off (then nothing
    checked the model's answers)."""
    lines = _log_lines(api, endpoint_id, worker_id)
    for line in reversed(lines):
        m = SELFTEST_PASSED.search(line)
        if m:
            return f"its selftest passed (probe set {m.group('set').strip()}, {m.group('s')} s, read from its log)"
    if not lines:
        return "what its health check covered could not be read (no log): 200 means its selftest passed or is off"
    return ("no selftest ran on it (none in its log: the selftest is off in its deploy config): 200 means its "
            "engine loaded and answers its own health check; nothing checked the model's answers")


def _failed(version: int | None, failed: dict[str, list[str]], why: dict[str, str], summary: str) -> Outcome:
    """Not healthy: the first failed worker whose log or whose course says why (else the first
    failed), its cause first (the supervisor's own line before what was seen of it)."""
    causes = {wid: failure_line(lines) or why.get(wid) for wid, lines in failed.items()}
    wid = next((w for w, c in causes.items() if c), next(iter(failed), None))
    cause = causes.get(wid) if wid else None
    named = f" ({', '.join(failed)})" if failed else ""
    return Outcome(False, version, wid, f"{cause}; {summary}{named}" if cause else f"{summary}{named}",
                   failed[wid][-12:] if wid else [], failed=len(failed))


def masked(lines: list[str], secrets: list[str | None]) -> list[str]:
    return [redact(line, secrets) for line in lines]
