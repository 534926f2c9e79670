"""A pod that can never serve stops billing: the supervisor terminates its own RunPod pod.

A FAILED supervisor stays up so /status can say why; on RunPod that pod keeps billing by the
hour for a GPU that will never serve. With `[runpod] terminate_on_terminal_failure = true` (or
KILN_RUNPOD_TERMINATE_ON_TERMINAL_FAILURE=true), `arm()` starts a timer when the supervisor is
FAILED for good: /status stays readable for `terminate_grace_s`, then the pod is terminated
through RunPod's REST API v2, `DELETE /v2/pods/{RUNPOD_POD_ID}`. Terminate, never stop: a stopped
pod's volume bills at twice the running rate and pins the pod to its host (field notes § "Terminate, never stop").

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
    on_change: Callable[["Termination"], None] | None = field(default=None, repr=False)   # /status kept current

    def changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)

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


def arm(spec: SelfTerminateSpec, env: Mapping[str, str], *, failure: str, on_event: OnEvent | None = None,
        on_change: Callable[[Termination], None] | None = None,
        session: requests.Session | None = None) -> Termination | None:
    """Terminate this pod after the grace period, unless cancelled. Call once, on entering FAILED
    for good; `failure` ("class: reason", already redacted) goes to the log and /status;
    `on_change(handle)` is called from the thread once the outcome is known."""
    event = on_event or (lambda name, detail: None)
    if not spec.terminate_on_terminal_failure:
        return None
    found = usable(spec, env, event, consequence="this pod will not terminate itself")
    if found is None:
        return None
    pod_id, key = found
    t = Termination(pod_id, spec.terminate_grace_s, time.monotonic() + spec.terminate_grace_s, on_change=on_change)
    msg = (f"the supervisor can never serve ({failure[:300]}): terminating pod {pod_id} in "
           f"{spec.terminate_grace_s:g} s ([runpod] terminate_on_terminal_failure); /status stays up until then")
    log.warning("%s", msg)
    event("runpod_terminate_armed", msg)
    t.thread = threading.Thread(target=_run, args=(t, spec.api_url, key, event, session or requests.Session()),
                                name="kiln-runpod-terminate", daemon=True)
    t.thread.start()
    return t


def usable(spec: SelfTerminateSpec, env: Mapping[str, str], event: OnEvent, *,
           consequence: str) -> tuple[str, str] | None:
    """(RUNPOD_POD_ID, RUNPOD_API_KEY) when both are there, the id is an id and the key may go to the
    URL; else one warning (log and `event`) ending in `consequence`, and None."""
    pod_id, key = env.get("RUNPOD_POD_ID", ""), env.get("RUNPOD_API_KEY", "")
    missing = [n for n, v in (("RUNPOD_POD_ID", pod_id), ("RUNPOD_API_KEY", key)) if not v]
    msg = None
    if missing:
        msg = (f"[runpod] terminate_on_terminal_failure is on but {' and '.join(missing)} "
               f"{'is' if len(missing) == 1 else 'are'} not set: {consequence} and keeps "
               "billing until someone terminates it")
    elif not POD_ID.fullmatch(pod_id):
        msg = f"RUNPOD_POD_ID {pod_id[:80]!r} is not a pod id: {consequence}"
    elif why := _url_refused(spec.api_url, env):    # the config checks this too: here is where the key would go
        msg = f"[runpod] api_url {spec.api_url[:120]!r} {why}: {consequence}"
    if msg is not None:
        log.warning("%s", msg)
        event("runpod_terminate_skipped", msg)
        return None
    return pod_id, key


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
        t.outcome = delete(t, api_url, f"/pods/{t.pod_id}", key, event, session, what=f"pod {t.pod_id}",
                           refused=REFUSED_POD)
    finally:
        t._done.set()
        t.changed()


REFUSED_POD = ("the key in RUNPOD_API_KEY may not terminate pods: name a RunPod secret holding one that may in "
               "the template ([runpod.secrets] RUNPOD_API_KEY)")


def delete(t: Termination, api_url: str, path: str, key: str, event: OnEvent, session: requests.Session, *,
           what: str, refused: str) -> str:
    """DELETE `path` under the API with retries and backoff; `what` ("pod X") names it in the log and
    events, `refused` is the fix a 401/403 says. Answers the outcome."""
    backoff = BACKOFF_S
    why = "not tried"
    for attempt in range(1, RETRIES + 1):
        if t._cancel.is_set():
            return "cancelled"
        try:
            r = session.delete(api_url.rstrip("/") + path, headers={"Authorization": f"Bearer {key}"}, timeout=30)
            status = r.status_code
            why = f"HTTP {status}: {problem_detail(r)}"
        except requests.RequestException as e:
            status, why = 0, f"{type(e).__name__}: {e}"
        why = " ".join(redact(why, [key]).split())[:300]
        if status in (200, 204):
            log.warning("%s: terminated (DELETE /v2%s)", what, path)
            event("runpod_terminated", what)
            return "terminated"
        if status == 404:
            log.warning("%s: already gone (404)", what)
            event("runpod_terminated", f"{what} was already gone")
            return "already gone"
        if status in (401, 403):
            msg = f"{what}: RunPod refused to terminate it ({why}); {refused}"
            log.error("%s", msg)
            event("runpod_terminate_failed", msg)
            return f"failed: {why}"
        log.error("%s: terminate attempt %d of %d failed: %s", what, attempt, RETRIES, why)
        if attempt < RETRIES and t._cancel.wait(backoff):
            return "cancelled"
        backoff *= 2
    event("runpod_terminate_failed", f"{what}: {why}")
    return f"failed: {why}"


def problem_detail(r: requests.Response) -> str:
    """RunPod's problem object (RFC 9457) in one line, or the start of the body."""
    try:
        data = r.json()
    except ValueError:
        return (r.text or r.reason or "")[:200]
    if isinstance(data, dict):
        return str(data.get("detail") or data.get("title") or data)[:200]
    return str(data)[:200]
