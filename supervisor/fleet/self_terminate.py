"""A pod that can never serve stops billing: the supervisor terminates its own RunPod pod.

A FAILED supervisor stays up so /status can say why; on RunPod that pod keeps billing by the
hour for a GPU that will never serve. With `[runpod] terminate_on_terminal_failure = true` (or
KILN_RUNPOD_TERMINATE_ON_TERMINAL_FAILURE=true), `arm()` starts a timer when the supervisor is
FAILED for good: /status stays readable for `terminate_grace_s`, then the pod is terminated
through RunPod's REST API v2, `DELETE /v2/pods/{RUNPOD_POD_ID}`. Terminate, never stop: a stopped
pod's volume bills at twice the running rate and pins the pod to its host (seed findings § "Deployment mechanics").

    handle = self_terminate.arm(cfg.runpod, env, failure="config_rejected: hardware ...", on_event=rec.event)
    ...
    handle.cancel()     # it recovered (a published config serves), or it was told to stop

`arm()` never blocks its caller: the wait and the call run in a daemon thread the handle owns.
It returns None when the option is off, or when RUNPOD_POD_ID or RUNPOD_API_KEY is missing (RunPod
sets both in every pod: RUNPOD_API_KEY is a pod-scoped key; whether that key may terminate its pod
is not documented, so a RunPod secret can replace it) -- then it logs one warning and sends nothing.
The key travels only in the Authorization header, and only to RunPod's API (or the stand-in the
pod's own environment names in $KILN_RUNPOD_API_URL; config.runpod_url_problem): never in argv, a
log line, /status or an error.
Stdlib and requests only: this module ships in the image and never imports images/.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import requests

from ..config import RUNPOD_API_URL_ENV, SelfTerminateSpec, runpod_url_problem
from ..redact import redact

log = logging.getLogger("kiln.runpod")
POD_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
RETRIES = 5                 # DELETE attempts: the API may be briefly unreachable
BACKOFF_S = 5.0             # doubled after each failed attempt
OnEvent = Callable[[str, str], None]


@dataclass
class Termination:
    """The armed timer: cancel() before the grace ends keeps the pod; `outcome` says what happened."""
    pod_id: str
    grace_s: float
    deadline: float                               # time.monotonic() when the DELETE is sent
    outcome: str | None = None                    # terminated | already gone | cancelled | failed: ...
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _done: threading.Event = field(default_factory=threading.Event, repr=False)
    thread: threading.Thread | None = field(default=None, repr=False)

    def cancel(self) -> bool:
        """Keep the pod; True when the DELETE had not been sent yet."""
        self._cancel.set()
        return self.outcome in (None, "cancelled")

    def wait(self, timeout: float | None = None) -> str | None:
        self._done.wait(timeout)
        return self.outcome

    def to_dict(self) -> dict[str, object]:
        left = max(0.0, self.deadline - time.monotonic())
        return {"pod": self.pod_id, "grace_s": self.grace_s, "in_s": round(left, 1), "outcome": self.outcome}


def arm(spec: SelfTerminateSpec, env: Mapping[str, str], *, failure: str,
        on_event: OnEvent | None = None, session: requests.Session | None = None) -> Termination | None:
    """Terminate this pod after the grace period, unless cancelled. Call once, on entering FAILED
    for good; `failure` ("class: reason", already redacted) goes to the log and /status."""
    event = on_event or (lambda name, detail: None)
    if not spec.terminate_on_terminal_failure:
        return None
    pod_id, key = env.get("RUNPOD_POD_ID", ""), env.get("RUNPOD_API_KEY", "")
    missing = [n for n, v in (("RUNPOD_POD_ID", pod_id), ("RUNPOD_API_KEY", key)) if not v]
    if missing:
        msg = (f"[runpod] terminate_on_terminal_failure is on but {' and '.join(missing)} "
               f"{'is' if len(missing) == 1 else 'are'} not set: this pod will not terminate itself and keeps "
               "billing until someone terminates it")
        log.warning("%s", msg)
        event("runpod_terminate_skipped", msg)
        return None
    if not POD_ID.fullmatch(pod_id):
        msg = f"RUNPOD_POD_ID {pod_id[:80]!r} is not a pod id: this pod will not terminate itself"
        log.warning("%s", msg)
        event("runpod_terminate_skipped", msg)
        return None
    why = _url_refused(spec.api_url, env)
    if why:                                 # the config checks this too: here is where the key would go
        msg = f"[runpod] api_url {spec.api_url[:120]!r} {why}: this pod will not terminate itself"
        log.warning("%s", msg)
        event("runpod_terminate_skipped", msg)
        return None
    t = Termination(pod_id, spec.terminate_grace_s, time.monotonic() + spec.terminate_grace_s)
    msg = (f"the supervisor can never serve ({failure[:300]}): terminating pod {pod_id} in "
           f"{spec.terminate_grace_s:g} s ([runpod] terminate_on_terminal_failure); /status stays up until then")
    log.warning("%s", msg)
    event("runpod_terminate_armed", msg)
    t.thread = threading.Thread(target=_run, args=(t, spec.api_url, key, event, session or requests.Session()),
                                name="kiln-runpod-terminate", daemon=True)
    t.thread.start()
    return t


def _url_refused(url: str, env: Mapping[str, str]) -> str | None:
    if url == env.get(RUNPOD_API_URL_ENV):
        return runpod_url_problem(url, from_env=True)
    return runpod_url_problem(url, from_env=False)


def _run(t: Termination, api_url: str, key: str, event: OnEvent, session: requests.Session) -> None:
    try:
        if t._cancel.wait(t.grace_s):
            t.outcome = "cancelled"
            log.info("pod %s: self-termination cancelled", t.pod_id)
            event("runpod_terminate_cancelled", f"pod {t.pod_id} kept")
            return
        t.outcome = _terminate(t, api_url.rstrip("/") + f"/pods/{t.pod_id}", key, event, session)
    finally:
        t._done.set()


def _terminate(t: Termination, url: str, key: str, event: OnEvent, session: requests.Session) -> str:
    backoff = BACKOFF_S
    why = "not tried"
    for attempt in range(1, RETRIES + 1):
        if t._cancel.is_set():
            return "cancelled"
        try:
            r = session.delete(url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
            status = r.status_code
            why = f"HTTP {status}: {_detail(r)}"
        except requests.RequestException as e:
            status, why = 0, f"{type(e).__name__}: {e}"
        why = " ".join(redact(why, [key]).split())[:300]
        if status in (200, 204):
            log.warning("pod %s: terminated (DELETE /v2/pods/%s)", t.pod_id, t.pod_id)
            event("runpod_terminated", f"pod {t.pod_id}")
            return "terminated"
        if status == 404:
            log.warning("pod %s: already gone (404)", t.pod_id)
            event("runpod_terminated", f"pod {t.pod_id} was already gone")
            return "already gone"
        if status in (401, 403):
            msg = (f"pod {t.pod_id}: RunPod refused to terminate it ({why}); the key in RUNPOD_API_KEY may not "
                   "terminate pods: name a RunPod secret holding one that may in the template "
                   "([runpod.secrets] RUNPOD_API_KEY)")
            log.error("%s", msg)
            event("runpod_terminate_failed", msg)
            return f"failed: {why}"
        log.error("pod %s: terminate attempt %d of %d failed: %s", t.pod_id, attempt, RETRIES, why)
        if attempt < RETRIES and t._cancel.wait(backoff):
            return "cancelled"
        backoff *= 2
    event("runpod_terminate_failed", f"pod {t.pod_id}: {why}")
    return f"failed: {why}"


def _detail(r: requests.Response) -> str:
    """RunPod's problem object (RFC 9457) in one line, or the start of the body."""
    try:
        data = r.json()
    except ValueError:
        return (r.text or r.reason or "")[:200]
    if isinstance(data, dict):
        return str(data.get("detail") or data.get("title") or data)[:200]
    return str(data)[:200]
