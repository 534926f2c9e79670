"""`endpoint up --wait`: until a worker of the endpoint's latest release reports healthy, and what
went wrong when none does.

    wait_healthy   poll GET /v2/serverless/{id}/workers: a worker that is not stale (isStale, the
                   authoritative flag) and IDLE or RUNNING passed its health path (200: the
                   supervisor's selftest passed and it serves). While it waits, one request at a
                   time goes to the endpoint's URL (RunPod's key in Authorization, as its docs
                   show), because a load-balancing endpoint at zero workers starts one only for a
                   request in flight. A worker of the latest release that turns UNHEALTHY is read
                   at once (GET .../workers/{workerId}/logs, while it is still listed: whether a
                   log outlives its worker is not documented): the supervisor's last line before
                   it gives up names the failure class and cause, and once a worker has said that,
                   waiting longer cannot help.
    failure_line   that line, out of a worker's log.

The caller (images/cli/endpoint.py) restores the previous release when a new one fails.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import requests

from supervisor.redact import redact

from .api import RunPodAPI, RunPodAPIError
from .endpoint import HEALTH_CHECK_PATH

Say = Callable[[str], None]
READY = ("IDLE", "RUNNING")             # WorkerStatus: ready, or processing a request
# What the supervisor prints when it can never serve (supervisor/run/loop.py): as a serverless
# worker, one line before it exits ("serverless worker: it can never serve (<class>: <cause>); ...");
# in any mode "FAILED: <class>: <cause>".
RELEASE_LINE = re.compile(r"serverless worker: it can never serve \((?P<cause>\S+: .*)\); \S+ on port \d+ answers 503")
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


def _describe(workers: list[dict[str, Any]]) -> str:
    if not workers:
        return "no worker yet"
    return ", ".join(f"{w.get('id')} {w.get('status')}{' (old release)' if w.get('isStale') else ''}"
                     for w in workers)


def wait_healthy(api: RunPodAPI, endpoint: dict[str, Any], say: Say, *, api_key: str, timeout_s: float,
                 poll_s: float = 5.0, wake: bool = True, latest_only: bool = True,
                 session: requests.Session | None = None) -> Outcome:
    """Until a worker of the latest release is healthy, one of them gives up, or `timeout_s` passes.
    Without `latest_only` (a change that replaces no container: workers, scaling) any healthy
    worker will do: whether RunPod marks the running ones stale then is not documented."""
    eid = str(endpoint["id"])
    session = session or requests.Session()
    deadline = time.monotonic() + timeout_s
    read: dict[str, list[str]] = {}          # worker id -> its log, read once it turned UNHEALTHY
    last = ""
    version: int | None = None
    waker = Waker(health_url(endpoint), api_key, session) if wake else None
    if waker:
        waker.__enter__()
    try:
        while True:
            listing = api.endpoint_workers(eid)
            version = listing.get("endpointVersion")
            workers = [w for w in listing.get("workers") or [] if isinstance(w, dict)]
            latest = [w for w in workers if not w.get("isStale") or not latest_only]
            line = f"release v{version}: {_describe(workers)}"
            if line != last:
                say(line)
                last = line
            ready = next((w for w in latest if w.get("status") in READY), None)
            if ready is not None:
                return Outcome(True, version, str(ready.get("id")))
            for w in latest:
                wid = str(w.get("id"))
                if w.get("status") == "UNHEALTHY" and wid not in read:
                    read[wid] = _log_lines(api, eid, wid)
                    cause = failure_line(read[wid])
                    if cause:
                        return Outcome(False, version, wid, cause, read[wid][-12:])
            if time.monotonic() >= deadline:
                wid = next(iter(read), None)
                cause = failure_line(read[wid]) if wid else None
                return Outcome(False, version, wid, f"no worker of release v{version} turned healthy within "
                               f"{timeout_s:.0f} s (last: {_describe(workers)})" + (f"; {cause}" if cause else ""),
                               read[wid][-12:] if wid else [])
            time.sleep(poll_s)               # the polling interval of a condition wait with a deadline
    finally:
        if waker:
            waker.__exit__()


def masked(lines: list[str], secrets: list[str | None]) -> list[str]:
    return [redact(line, secrets) for line in lines]
