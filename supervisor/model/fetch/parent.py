"""The supervisor's side of a model fetch: run the child, watch its events, enforce the deadlines.

The download runs in a child process (`python -m supervisor.model.fetch`, child.py) that prints one JSON
event per line; `fetch()` (called by the lifecycle, which may run it on a thread beside its event
loop) watches those events: a download that moves no byte on any connection for
`model.fetch_stall_s` is killed (a stall-based deadline, not a total one: a slow link that keeps
moving is fine; counted in time this process could run, stall.py: a frozen container thawed does
not fail its own healthy download), and a stop request kills it at once. Another worker holding
the volume's lock is waited for while it moves anything on the volume, and taken over once it
moved nothing for the stall window, by one waiter: the others wait on that one (volume_lock.py).
A transient failure (no network, 429, 5xx) that ends an attempt, with no complete cached copy to
serve, is retried with backoff, resuming, for as long as the stall deadline allows.

The child gets only the environment it needs (`child_env`): never the engine's API key, the
RunPod key or anything else the supervisor holds; the Hub token travels as HF_TOKEN.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ... import hubclient
from ...config import DeployConfig
from ...errors import Cancelled, FetchError
from ...redact import redact
from ...runpod_env import worker_id
from .layout import cache_dir
from .stall import HolderWatch, StallClock
from .volume_lock import VolumeLock, lock_file

# What the child may inherit: locale, home, paths, proxies and CA bundles (a proxy with its own
# CA is common on pods and in companies), huggingface_hub's and hf_xet's own settings (HF_*),
# and what Python itself needs. Everything else stays with the supervisor.
CHILD_ENV_NAMES = {"PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "TZ", "LANG", "LANGUAGE", "LD_LIBRARY_PATH",
                   "PYTHONHOME", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX",
                   "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                   "no_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"}
CHILD_ENV_PREFIXES = ("LC_", "XDG_", "HF_")
NEVER_TO_CHILD = {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}     # the token goes in explicitly, or not at all


@dataclass
class FetchResult:
    path: Path                  # the file the engine loads
    snapshot: Path
    commit: str | None
    from_cache: bool
    note: str = ""
    total_bytes: int | None = None
    attempts: int = 1
    events: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "commit": self.commit, "from_cache": self.from_cache, "note": self.note,
                "total_bytes": self.total_bytes, "attempts": self.attempts}


def child_env(env: Mapping[str, str], token: str | None) -> dict[str, str]:
    """The fetch child's environment: an allowlist of `env`, plus the token and Kiln's settings."""
    out = {k: v for k, v in env.items()
           if (k in CHILD_ENV_NAMES or k.startswith(CHILD_ENV_PREFIXES)) and k not in NEVER_TO_CHILD}
    root = str(Path(__file__).resolve().parents[3])
    out["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if token:
        out["HF_TOKEN"] = token
    out.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if out["HF_HUB_DISABLE_TELEMETRY"] not in ("0", "false", "False"):
        out.setdefault("HF_XET_TELEMETRY_ENABLED", "false")   # hf_xet reports transfers unless told not to
    out["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    out["PYTHONUNBUFFERED"] = "1"
    return out


def fetch(cfg: DeployConfig, env: Mapping[str, str], *, token: str | None, should_stop: Callable[[], bool],
          sleep: Callable[[float], None], report: Callable[[dict[str, Any]], None] = lambda e: None,
          secrets: Sequence[str] = (), python: str = sys.executable) -> FetchResult:
    """Fetch cfg.model (an hf:// source) into the cache; the file to load, or FetchError/Cancelled.
    Another worker downloading the same model into the same cache is waited for (volume_lock.py)."""
    spec = cfg.model
    assert spec.hf_repo and spec.entry
    revision = spec.revision or "main"
    argv = [python, "-m", "supervisor.model.fetch", "--repo", spec.hf_repo, "--revision", revision,
            "--cache", str(cache_dir(cfg)), "--entry", spec.entry,
            "--connections", str(spec.fetch_connections), "--segment-mib", str(spec.fetch_segment_mib)]
    for pattern in spec.allow_patterns:
        argv += ["--allow", pattern]
    env_for_child = child_env(env, token)
    # One download per model on a shared volume: wait for another worker's, then reuse its files;
    # or take over from one that moves nothing (its blob locks are then not waited for either).
    lock = VolumeLock(lock_file(cache_dir(cfg), spec.hf_repo), worker_id(env))
    holder = HolderWatch(cache_dir(cfg), spec.hf_repo, spec.fetch_stall_s, WAIT_POLL_S, lock.held_by)
    held = turn(lock, should_stop=should_stop, sleep=sleep, report=report, holder=holder)
    if held.generation:                 # a stalled holder's (or taker's) blob locks are not waited for
        argv.append("--take-over")
    try:
        return _attempts(cfg, spec, revision, argv, env_for_child, should_stop=should_stop, sleep=sleep,
                         report=report, secrets=secrets, lock=held)
    finally:
        held.release()


WAIT_REPORT_S = 1.0           # a waiting worker says so on /status this often
WAIT_POLL_S = 0.25
LOOK_S = 0.1                  # the fetch's watch loop looks at the child's events this often


def turn(lock: VolumeLock, *, should_stop: Callable[[], bool], sleep: Callable[[float], None],
         report: Callable[[dict[str, Any]], None], holder: HolderWatch | None = None) -> VolumeLock:
    """Take the volume's lock for this model, waiting (and saying whom for) while another worker
    holds it; the lock now held. A stop request ends the wait (Cancelled). With `holder`, a holder
    that moves nothing on the volume for its stall window is taken over, by one waiter only: each
    tries the lock's `successor`, and the one that wins it holds that (generation > 0), said in a
    `take_over` event; the others wait on the winner as on any holder, and take its lock when it
    lets go (or take over from it in turn)."""
    t0 = time.monotonic()
    said = -WAIT_REPORT_S
    current = lock                      # the lock whose holder this worker waits on
    why = ("another worker is downloading this model into the shared volume; its files are reused once it is "
           "done")
    while not current.try_acquire():
        if should_stop():
            raise Cancelled("stop requested while waiting for another worker's download")
        now = time.monotonic()
        held = current.held_by() or {}
        whom = f"worker {held.get('worker', '?')} (host {held.get('host', '?')})"
        if holder is not None and holder.stalled():
            nxt = current.successor()
            if nxt.try_acquire():
                report({"event": "take_over", "from": whom, "since": held.get("since"),
                        "waited_s": round(now - t0, 1),
                        "why": f"it moved nothing on the volume for {holder.stall_s:g} s (model.fetch_stall_s): "
                               "downloading beside it"})
                return nxt
            # Another waiter took over first: wait on it, its window from now.
            current, said = nxt, -WAIT_REPORT_S
            holder.watch(current.held_by)
            why = (f"another waiter took over from {whom}, which moved nothing on the volume for "
                   f"{holder.stall_s:g} s; its files are reused once it is done")
            continue
        if now - said >= WAIT_REPORT_S:
            said = now
            report({"event": "waiting", "for": whom, "why": why, "since": held.get("since"),
                    "waited_s": round(now - t0, 1),
                    **({"holder_idle_s": round(holder.clock.idle, 1)} if holder is not None else {})})
        sleep(WAIT_POLL_S)
    waited = time.monotonic() - t0
    if waited >= WAIT_POLL_S:
        report({"event": "turn", "waited_s": round(waited, 1)})
    return current


def _attempts(cfg: DeployConfig, spec: Any, revision: str, argv: list[str], env_for_child: dict[str, str], *,
              should_stop: Callable[[], bool], sleep: Callable[[float], None],
              report: Callable[[dict[str, Any]], None], secrets: Sequence[str],
              lock: VolumeLock | None = None) -> FetchResult:
    """The fetch child, run and retried until it is done, the stall deadline ends it, or a stop."""
    from ..resolve import pick_entry
    from ...process.managed import ManagedProcess

    stall_s = spec.fetch_stall_s
    stall = StallClock(LOOK_S)             # from the lock; only time this process could run counts
    moved_before = 0                       # bytes of earlier attempts (their children counted from 0)
    backoff = 1.0
    attempts = 0
    last_error: str | None = None      # the latest transient failure, if any
    while True:
        attempts += 1
        best = 0                       # `moved` only grows within one child
        progressed = False
        events: queue.Queue[str] = queue.Queue()
        proc = ManagedProcess.start(argv, env=env_for_child, on_line=events.put, redact=list(secrets),
                                    tail_lines=50)
        final: dict[str, Any] | None = None
        try:
            while final is None:
                while True:
                    try:
                        line = events.get_nowait()
                    except queue.Empty:
                        break
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue          # a library's stray print; the tail keeps it
                    if not isinstance(ev, dict):
                        continue
                    if ev.get("event") in ("done", "error"):
                        final = ev
                    elif ev.get("event") in ("plan", "progress"):
                        moved = int(ev.get("moved") or 0)
                        if moved > best:
                            best, progressed = moved, True
                            if lock is not None:
                                lock.progressed(moved_before + best)    # what waiters judge
                        report(ev)
                    elif ev.get("event") == "retry":
                        last_error = redact(str(ev.get("why")), secrets)
                        report({"event": "retry", "why": last_error})
                if final is not None:
                    break
                if proc.poll() is not None:
                    proc.stop(0)          # joins the reader: every line it printed is queued now
                    if events.empty():
                        tail = " | ".join(proc.tail()[-3:])
                        final = {"event": "error", "kind": "other",
                                 "message": f"the fetch process exited with status {proc.poll()}: {tail}"}
                    continue
                if should_stop():
                    raise Cancelled("stop requested during the model fetch")
                idle, progressed = stall.look(progressed), False
                if idle > stall_s:
                    if last_error:
                        raise FetchError(f"could not fetch {spec.source}@{revision} and no complete copy is cached: "
                                         f"{last_error} (no progress for {stall_s:g} s, model.fetch_stall_s)")
                    raise FetchError(f"the download of {spec.source}@{revision} moved no byte for {stall_s:g} s "
                                     "(model.fetch_stall_s); what arrived is kept and resumes next time")
                sleep(LOOK_S)
        finally:
            proc.stop(2.0)
        moved_before += best
        if final["event"] == "done":
            report(final)
            snap = Path(final["snapshot"])
            return FetchResult(pick_entry(snap, spec.entry), snap, final.get("commit"), bool(final.get("from_cache")),
                               redact(final.get("note") or "", secrets), final.get("total"), attempts)
        kind, message = final.get("kind"), redact(str(final.get("message")), secrets)
        if kind not in hubclient.TRANSIENT:
            raise FetchError(f"could not fetch {spec.source}@{revision}: {message}")
        # No complete copy in the cache, and the Hub is away: retry (resuming) until the stall deadline.
        last_error = message
        left = stall_s - stall.look()
        if left <= 0:
            raise FetchError(f"could not fetch {spec.source}@{revision} and no complete copy is cached: {message} "
                             f"(no progress for {stall_s:g} s, model.fetch_stall_s)")
        report({"event": "retry", "in_s": min(backoff, left), "why": message})
        deadline = time.monotonic() + min(backoff, left)
        while time.monotonic() < deadline:
            if should_stop():
                raise Cancelled("stop requested during the model fetch")
            sleep(min(LOOK_S, max(0.0, deadline - time.monotonic())))
            stall.look()                 # the backoff is time this process could run: it counts
        backoff = min(backoff * 2, 30.0)
