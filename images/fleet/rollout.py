"""What `publish-config --canary N` and `--wait` do once the config is validated: a canary rollout,
and waiting on the fleet's verdicts (supervisor/fleet/record.py says where they live).

    --canary N   the fleet is read; N live SERVING pods watching BRANCH:PATH are chosen (first by
                 pod id); the config and kiln-canary.json naming them go to kiln-canary/BRANCH in one
                 commit; their verdicts on that commit are awaited (--timeout). All applied (or
                 unchanged): the same bytes are committed to BRANCH, which the rest watch, and the
                 assignment is closed. One rolled back, rejected or failed it: nothing is promoted,
                 its cause and stderr tail are printed. With --wait, then as below for BRANCH.
    --wait       after the commit to BRANCH: every pod that was reporting on BRANCH:PATH is awaited
                 until it applied, left unchanged, rolled back, rejected or failed that commit; the
                 table of verdicts is printed.

Exit codes (one line on stderr says which, beside any table on stdout):
    0 promoted / published, and with --wait every pod took it
    1 the Hub refused or could not be reached (still so when the deadline passed)
    2 refused here: nothing was published (too few pods for --canary N)
    3 a canary (or with --wait, a pod) rolled back, rejected or failed it
    4 timed out waiting for a verdict (the pods that gave none are named, stale ones said so)

The Hub being away while waiting is ridden out until the deadline (reads retried with backoff);
the pods never depend on this command: they keep serving whatever they decided.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from supervisor.fleet import record as fleet
from supervisor import hubclient
from .status import FleetReader, ago, table

EXIT_OK, EXIT_HUB, EXIT_REFUSED, EXIT_NOT_TAKEN, EXIT_TIMEOUT = 0, 1, 2, 3, 4
PACE_MIN_S, PACE_MAX_S = 0.2, 5.0        # how often the fleet is read: see pace()


@dataclass
class RolloutTarget:
    """What one publish-config rolls out and where (repo, branch, path, the config's bytes and hash), the
    Hub client and fleet reader it goes through, its deadline, and how it speaks (masked, one prefix)."""
    api: Any
    reader: FleetReader
    repo: str
    branch: str
    path: str
    data: bytes
    config_hash: str
    timeout_s: float
    mask: Callable[[str], str]
    message: str | None = None
    out: Any = field(default_factory=lambda: sys.stdout)
    err: Any = field(default_factory=lambda: sys.stderr)

    @property
    def where(self) -> str:
        return f"hf://{self.repo}@{self.branch}:{self.path}"

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def fail(self, code: int, line: str, *detail: str) -> int:
        print(f"publish-config: {self.mask(line)}", file=self.err, flush=True)
        for d in detail:
            print(f"  {self.mask(d)}", file=self.err, flush=True)
        return code

    def hub_error(self, e: BaseException) -> str:
        return f"{hubclient.error_kind(e)}: {self.mask(hubclient.describe(e))}"


@dataclass
class Waited:
    answer: Any = None                     # what `check` answered, None at the deadline
    records: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None               # the last read failed with this (the Hub away)
    down_since: float | None = None


def pods_on(t: RolloutTarget, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if fleet.watches(r, t.branch, t.path)]


def pace(records: list[Mapping[str, Any]]) -> float:
    """Half the pods' poll interval (one small request per read), within PACE_MIN_S..PACE_MAX_S."""
    polls = [float((r.get("watch") or {}).get("poll_s") or PACE_MAX_S) for r in records]
    return min(max(min(polls, default=PACE_MAX_S) / 2, PACE_MIN_S), PACE_MAX_S)


def wait_until(t: RolloutTarget, check: Callable[[list[dict[str, Any]]], Any], deadline: float, every_s: float) -> Waited:
    """Read the fleet every `every_s` until `check(records)` answers or the deadline; a failed read
    is retried (backing off up to PACE_MAX_S) and remembered, so the caller can tell an outage."""
    w = Waited()
    interval = every_s
    while True:
        try:
            w.records = pods_on(t, t.reader.read())
            w.error, w.down_since, interval = None, None, every_s
            w.answer = check(w.records)
            if w.answer is not None:
                return w
        except Exception as e:  # noqa: BLE001 - an outage to ride out until the deadline
            w.error = t.hub_error(e)
            w.down_since = w.down_since or time.monotonic()
            interval = min(interval * 2, PACE_MAX_S)
        left = deadline - time.monotonic()
        if left <= 0:
            return w
        time.sleep(min(interval, left))    # the pace of a poll loop against a deadline


def outage(t: RolloutTarget, w: Waited, what: str) -> int:
    down = time.monotonic() - (w.down_since or time.monotonic())
    return t.fail(EXIT_HUB, f"Hub outage: the fleet's verdicts could not be read for the last {down:.1f} s "
                            f"({w.error}); {what}; the pods keep serving what they had")


def _silence(rec: Mapping[str, Any] | None, now: float) -> str:
    if rec is None:
        return "it has no record any more"
    age = fleet.age_s(rec, now)
    hb = (rec.get("watch") or {}).get("report_s")
    stale = (f", stale: silent for more than {fleet.STALE_HEARTBEATS} heartbeats of {hb:g} s, it may be down"
             if fleet.is_stale(rec, now) and isinstance(hb, (int, float)) else "")
    return f"last report {ago(age)}{stale}; state {rec.get('state')}"


def _tail(v: Mapping[str, Any]) -> list[str]:
    lines = [str(x) for x in v.get("stderr_tail") or []]
    return (["stderr tail:"] + [f"  {x}" for x in lines]) if lines else []


# -- canary ---------------------------------------------------------------------------------------

def canary(t: RolloutTarget, n: int, *, then_wait: bool) -> int:
    try:
        records = pods_on(t, t.reader.read())
    except Exception as e:  # noqa: BLE001 - one line
        return t.fail(EXIT_HUB, f"the fleet could not be read ({t.hub_error(e)}); nothing was published")
    now = time.time()
    chosen = fleet.choose_canaries(records, n, now)
    if len(chosen) < n:
        seen = ", ".join(f"{r.get('pod')} {'STALE' if fleet.is_stale(r, now) else r.get('state')}"
                         for r in sorted(records, key=lambda r: str(r.get("pod")))) or "none"
        return t.fail(EXIT_REFUSED, f"--canary {n}: only {len(chosen)} pod(s) report SERVING on {t.where} "
                                    f"(pods: {seen}); nothing was published")
    from huggingface_hub import CommitOperationAdd

    cbranch = fleet.canary_branch(t.branch)
    doc = fleet.assignment(pods=chosen, branch=t.branch, path=t.path, config_hash=t.config_hash, now=now,
                           expires_at=now + t.timeout_s)
    try:
        t.api.create_branch(t.repo, branch=cbranch, revision=t.branch, exist_ok=True)
        info = t.api.create_commit(t.repo, [CommitOperationAdd(t.path, t.data),
                                            CommitOperationAdd(fleet.CANARY_FILE, _json(doc))],
                                   revision=cbranch, commit_message=f"kiln: canary {t.path} (config "
                                   f"{t.config_hash[:12]}) for {', '.join(chosen)}")
    except Exception as e:  # noqa: BLE001 - one line
        return t.fail(EXIT_HUB, f"the Hub refused or could not be reached ({t.hub_error(e)}); nothing was promoted")
    sha = info.oid
    t.say(f"canary: {t.path} (config {t.config_hash[:12]}) committed to hf://{t.repo}@{cbranch}: commit {sha}; "
          f"canary pod(s) {', '.join(chosen)}; waiting up to {t.timeout_s:g} s for their verdicts")

    def verdicts(recs: list[dict[str, Any]]) -> dict[str, Any] | None:
        by_pod = {str(r.get("pod")): r for r in recs}
        got = {p: fleet.verdict_for(by_pod[p], sha, fleet.CANARY_SOURCE) for p in chosen if p in by_pod}
        if any(v and v.get("outcome") in fleet.BAD_OUTCOMES for v in got.values()):
            return got                     # one bad verdict is enough to stop
        return got if len(got) == len(chosen) and all(got.values()) else None

    w = wait_until(t, verdicts, time.monotonic() + t.timeout_s, pace(records))
    untouched = f"not promoted ({t.where} untouched)"
    if w.answer is None:
        if w.error:                         # no closing commit: the Hub is away (the assignment expires)
            return outage(t, w, f"canary commit {sha[:12]} is on hf://{t.repo}@{cbranch}, {t.where} untouched")
        _close(t, cbranch, doc, "timed out")
        by_pod = {str(r.get("pod")): r for r in w.records}
        now = time.time()
        silent = [p for p in chosen if not (by_pod.get(p) and fleet.verdict_for(by_pod[p], sha, fleet.CANARY_SOURCE))]
        return t.fail(EXIT_TIMEOUT, f"timed out after {t.timeout_s:g} s: no verdict on canary commit {sha[:12]} from "
                                    + "; ".join(f"{p} ({_silence(by_pod.get(p), now)})" for p in silent)
                                    + f"; {untouched}")
    bad = {p: v for p, v in w.answer.items() if v and v.get("outcome") in fleet.BAD_OUTCOMES}
    if bad:
        _close(t, cbranch, doc, "stopped")
        pod, v = sorted(bad.items())[0]
        return t.fail(EXIT_NOT_TAKEN, f"canary {pod} {str(v.get('outcome')).replace('_', ' ')} {sha[:12]}: "
                                      f"{v.get('cause')}; {untouched}", *_tail(v))
    for pod, v in sorted(w.answer.items()):
        t.say(f"canary {pod}: {v.get('outcome')} {sha[:12]}" + (f" ({v['took_s']:g} s)" if v.get("took_s") else ""))
    commit = _promote(t, sha, chosen)
    if isinstance(commit, int):
        _close(t, cbranch, doc, "promotion failed")
        return commit
    _close(t, cbranch, doc, "promoted")
    if then_wait:
        return wait_fleet(t, commit, records)
    return EXIT_OK


def _promote(t: RolloutTarget, canary_sha: str, chosen: list[str]) -> str | int:
    """The canary's bytes committed to the branch the rest watch; the new commit, or an exit code."""
    deadline = time.monotonic() + t.timeout_s
    delay = PACE_MIN_S
    while True:
        try:
            info = t.api.upload_file(path_or_fileobj=t.data, path_in_repo=t.path, repo_id=t.repo, revision=t.branch,
                                     commit_message=t.message or f"kiln: promote {t.path} (config "
                                     f"{t.config_hash[:12]}) after canary {', '.join(chosen)} applied "
                                     f"{canary_sha[:12]}")
            break
        except Exception as e:  # noqa: BLE001 - transient: again until the deadline
            if hubclient.error_kind(e) not in hubclient.TRANSIENT or time.monotonic() + delay > deadline:
                return t.fail(EXIT_HUB, f"the canary passed, but the promotion to {t.where} failed "
                                        f"({t.hub_error(e)}); publish again to retry")
            time.sleep(delay)             # backoff before the next attempt
            delay = min(delay * 2, PACE_MAX_S)
    t.say(f"promoted {t.path} to hf://{t.repo}@{t.branch}: commit {info.oid} (config {t.config_hash[:12]}) "
          f"after canary {', '.join(chosen)}")
    return info.oid


def _close(t: RolloutTarget, cbranch: str, doc: dict[str, Any], outcome: str) -> None:
    """End the assignment, so no pod takes the canary config later (it also expires by itself)."""
    closed = {**doc, "state": "closed", "outcome": outcome}
    try:
        t.api.upload_file(path_or_fileobj=_json(closed), path_in_repo=fleet.CANARY_FILE, repo_id=t.repo,
                          revision=cbranch, commit_message=f"kiln: canary {outcome}")
    except Exception as e:  # noqa: BLE001 - best effort: the assignment expires anyway
        t.say(f"note: the canary assignment could not be closed ({t.hub_error(e)}); it expires by itself")


def _json(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, indent=1, sort_keys=True).encode()


# -- the whole fleet --------------------------------------------------------------------------------

def wait_fleet(t: RolloutTarget, commit: str, before: list[dict[str, Any]]) -> int:
    """Wait for every pod that was live on BRANCH:PATH before the publish to decide `commit`."""
    now = time.time()
    expected = sorted(str(r.get("pod")) for r in before if fleet.live(r, now))
    if not expected:
        t.say(f"no pod reports on {t.where}: nothing to wait for")
        return EXIT_OK
    t.say(f"waiting up to {t.timeout_s:g} s for {len(expected)} pod(s) to decide {commit[:12]}: {', '.join(expected)}")

    def decided(recs: list[dict[str, Any]]) -> dict[str, Any] | None:
        by_pod = {str(r.get("pod")): r for r in recs}
        got = {p: fleet.verdict_for(by_pod[p], commit) for p in expected if p in by_pod}
        return got if len(got) == len(expected) and all(got.values()) else None

    w = wait_until(t, decided, time.monotonic() + t.timeout_s, pace(before))
    now = time.time()
    by_pod = {str(r.get("pod")): r for r in w.records}
    got = {p: fleet.verdict_for(by_pod[p], commit) if p in by_pod else None for p in expected}
    if w.records:
        t.say(table([by_pod[p] for p in expected if p in by_pod], now, verdicts=got))
    if w.answer is None:
        if w.error:
            return outage(t, w, f"{commit[:12]} is on {t.where}")
        silent = [p for p in expected if not got.get(p)]
        return t.fail(EXIT_TIMEOUT, f"timed out after {t.timeout_s:g} s: no verdict on {commit[:12]} from "
                                    + "; ".join(f"{p} ({_silence(by_pod.get(p), now)})" for p in silent))
    bad = {p: v for p, v in got.items() if v and v.get("outcome") in fleet.BAD_OUTCOMES}
    if bad:
        first = sorted(bad.items())[0][1]
        return t.fail(EXIT_NOT_TAKEN, f"{len(bad)} of {len(expected)} pod(s) did not take {commit[:12]}: "
                                      + "; ".join(f"{p} {v.get('outcome')}: {v.get('cause')}" for p, v in
                                                  sorted(bad.items())), *_tail(first))
    t.say(f"all {len(expected)} pod(s) took {commit[:12]}")
    return EXIT_OK
