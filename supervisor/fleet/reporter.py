"""The fleet reporter: this pod's record on the Hub (supervisor/fleet/record.py says where and what).

A daemon thread beside the loop. The loop only pokes it (`poke()`: a flag and an event, never I/O)
when a reload is decided or the state changes; the thread builds the record from the /status
snapshot, masks every secret in it (supervisor/redact.py), and uploads it through huggingface_hub:

  * at most one write per `[watch] poll_s` (pokes in between are coalesced into the next write),
    and at least one per `[watch] report_s` (the heartbeat a reader tells a silent pod by); the
    loop pokes for verdicts and settled states (SERVING, FAILED, RESTARTING, STOPPED), not for the
    steps of a walk;
  * a failed write (no network, 429, 5xx, auth) is retried with the interval doubled up to
    `max_backoff_s`, the first success resets it: a Hub outage changes nothing on the pod but
    this thread's own schedule, shows on /status (`watch.report`) and in one log line each way;
  * on shutdown one last record (state STOPPED) is tried, bounded, so the fleet sees it go.

The fleet branch is created from the repo's main branch on the first write (the Hub has no empty
branches); only `fleet/` on it means anything.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable, Sequence

from . import record as fleet
from .. import hubclient
from ..config import WatchSpec
from ..redact import redact, redact_data

log = logging.getLogger("kiln.fleet")
FINAL_WRITE_S = 3.0        # how long shutdown waits for the last record
SETTLE_S = 0.05            # a poke's burst (SERVING, then the verdict) goes out as one write


class Reporter:
    def __init__(self, spec: WatchSpec, *, pod: str, token: str | None, snapshot: Callable[[], dict[str, Any]],
                 secrets: Callable[[], Sequence[str]] = lambda: ()):
        assert spec.repo
        self.spec = spec
        self.pod = pod
        self.token = token
        self.snapshot = snapshot
        self.secrets = secrets
        self.path = fleet.record_path(pod)
        self.where = f"hf://{spec.repo}@{fleet.FLEET_BRANCH}:{self.path}"
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._dirty = True                 # the first record goes out at once
        self._thread: threading.Thread | None = None
        self._status: dict[str, Any] = {"pod": pod, "where": self.where, "writes": 0, "errors": 0,
                                        "consecutive_errors": 0, "last_ok_at": None, "last_error": None,
                                        "unreachable_since": None, "interval_s": spec.poll_s, "seq": 0}

    # -- the loop's side: never blocks ---------------------------------------------------
    def poke(self) -> None:
        self._dirty = True
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._guarded, name="kiln-fleet-report", daemon=True)
        self._thread.start()

    def stop(self, final_s: float = FINAL_WRITE_S) -> None:
        """Stop, after one last record (the state by then is STOPPED) or `final_s`, whichever first."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(final_s)

    def status(self) -> dict[str, Any]:
        with self._lock:
            out = dict(self._status)
        if out.get("unreachable_since"):
            out["unreachable_for_s"] = round(time.time() - out["unreachable_since"], 1)
        return out

    # -- the thread --------------------------------------------------------------------------
    def _guarded(self) -> None:
        try:
            self._loop()
        except Exception:  # noqa: BLE001 - a reporter bug must show, and must not take PID 1 down
            log.exception("fleet report stopped")

    def _loop(self) -> None:
        from huggingface_hub import HfApi

        api = HfApi(token=self.token or False)
        spec = self.spec
        earliest = 0.0                    # monotonic: no write before this (the pace, or a backoff)
        heartbeat_at = 0.0                # a write is due by then even when nothing changed
        interval = spec.poll_s
        branch_ready = False
        while True:
            stopping = self._stop.is_set()
            now = time.monotonic()
            want = stopping or self._dirty or now >= heartbeat_at
            if want and (stopping or now >= earliest):
                if not stopping:
                    self._stop.wait(SETTLE_S)
                self._dirty = False
                try:
                    if not branch_ready:
                        api.create_branch(spec.repo, branch=fleet.FLEET_BRANCH, exist_ok=True)
                        branch_ready = True
                    self._write(api)
                    interval = spec.poll_s
                    earliest, heartbeat_at = time.monotonic() + spec.poll_s, time.monotonic() + spec.report_s
                except Exception as e:  # noqa: BLE001 - every failure is an outage to ride out
                    branch_ready = branch_ready and hubclient.error_kind(e) != hubclient.NOT_FOUND
                    self._dirty = True
                    interval = min(max(interval * 2, spec.poll_s), spec.max_backoff_s)
                    earliest = time.monotonic() + interval
                    self._failed(e, interval)
                if stopping:
                    return
                continue
            if stopping:
                return
            self._wake.wait(max(0.0, (earliest if want else heartbeat_at) - now))
            self._wake.clear()

    def _write(self, api: Any) -> None:
        with self._lock:
            seq = self._status["seq"] + 1
        record = fleet.build_record(self.snapshot(), pod=self.pod, watch=self.spec, seq=seq, now=time.time())
        body = json.dumps(redact_data(record, self.secrets()), indent=1, sort_keys=True).encode()
        api.upload_file(path_or_fileobj=body, path_in_repo=self.path, repo_id=self.spec.repo,
                        revision=fleet.FLEET_BRANCH,
                        commit_message=f"kiln fleet: {self.pod} {record['state']} (report {seq})")
        with self._lock:
            st = self._status
            st["writes"] += 1
            st.update(seq=seq, state=record["state"])
            down = hubclient.outage_over(st, self.spec.poll_s)
        if down is not None:
            log.info("fleet report: the Hub takes %s again after %.1f s", self.where, down)

    def _failed(self, e: BaseException, interval: float) -> None:
        kind = hubclient.error_kind(e)
        why = redact(hubclient.describe(e), self.secrets())
        with self._lock:
            first = hubclient.outage_counted(self._status, kind, why, interval)
        if first:
            log.warning("fleet report: cannot write %s (%s: %s); the server keeps serving, retrying with backoff "
                        "up to %g s", self.where, kind, why, self.spec.max_backoff_s)
