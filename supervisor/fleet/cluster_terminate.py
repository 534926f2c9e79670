"""A cluster that can never serve stops billing: rank 0 deletes its own RunPod Instant Cluster.

On a cluster node (cluster_env.active: NUM_NODES > 1) [runpod] terminate_on_terminal_failure cannot
mean self_terminate's `DELETE /v2/pods/{RUNPOD_POD_ID}`: a cluster's member pods "cannot be modified
or deleted via the pod endpoints", and one node gone would leave the others billing. So the whole
cluster is deleted (`DELETE /v2/clusters/{id}`: every member pod terminated with it), and only by
the primary, rank 0. The group failing for good shows there: a rank FAILED on its own makes rank 0
FAILED `node_missing` at its next launch gate (at once while that rank beats FAILED, after
KILN_CLUSTER_ARRIVE_S once it is silent: supervisor/cluster/group.py), so rank 0 reaches FAILED
whenever the group does. Every other rank deletes nothing and says on /status that rank 0 owns the
termination.

    handle = cluster_terminate.arm(cfg.runpod, env, failure="node_missing: ...", on_event=rec.event)

`arm()` is the entry point on every node: off a cluster it is self_terminate.arm, unchanged.

RunPod documents no variable naming a node's cluster, so the cluster is found, never guessed: the
clusters are listed (`GET /v2/clusters`), narrowed to the name in $KILN_CLUSTER_NAME when set
(`build.py cluster plan/up` puts it in every node's env), then each candidate's member pods
(`GET /v2/clusters/{id}/pods`); the one cluster whose members include RUNPOD_POD_ID is deleted after
`terminate_grace_s`. No such cluster, several, a 401/403 or an API error that outlasts the retries:
one warning (log and /status event), nothing deleted. The rest is self_terminate's: the grace (the
search runs first, so /status names the cluster while it waits), cancel() when a published config
serves, retries with backoff, the key only in the Authorization header and only to RunPod's API or
$KILN_RUNPOD_API_URL, never in a log line, /status or an error. Stdlib and requests only.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import requests

from ..cluster_env import CLUSTER_NAME_ENV, active
from ..config import SelfTerminateSpec
from ..redact import redact
from . import self_terminate
from .self_terminate import POD_ID, OnEvent, Termination, delete, problem_detail

log = logging.getLogger("kiln.runpod")
REFUSED = ("the key in RUNPOD_API_KEY may not list or delete clusters: name a RunPod secret holding one that may "
           "in the template ([runpod.secrets] RUNPOD_API_KEY), or delete the cluster yourself")


@dataclass
class ClusterTermination(Termination):
    """self_terminate's handle, plus this node's rank and the cluster once found."""
    rank: int = 0
    cluster: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "rank": self.rank, "cluster": self.cluster}


class _Again(Exception):
    """An API error worth another try (5xx, 429, no connection, an answer that is not the document's)."""


class _Stop(Exception):
    """Why nothing will be deleted: said once, not retried."""


def arm(spec: SelfTerminateSpec, env: Mapping[str, str], *, failure: str, on_event: OnEvent | None = None,
        on_change: Callable[[Termination], None] | None = None,
        session: requests.Session | None = None) -> Termination | None:
    """On a cluster node: rank 0 deletes its cluster after the grace, unless cancelled; other ranks
    answer a handle whose outcome says rank 0 owns it. Anywhere else: self_terminate.arm.
    `on_change(handle)` is called from the thread when the cluster is found and when it is done."""
    if not active(env):
        return self_terminate.arm(spec, env, failure=failure, on_event=on_event, on_change=on_change,
                                  session=session)
    event = on_event or (lambda name, detail: None)
    if not spec.terminate_on_terminal_failure:
        return None
    rank = (env.get("NODE_RANK") or "").strip()
    if not rank.isdigit():
        msg = (f"NODE_RANK {rank[:20]!r} is not a rank: this node cannot tell whether it is rank 0, which deletes "
               "the cluster; nothing will be deleted")
        log.warning("%s", msg)
        event("runpod_terminate_skipped", msg)
        return None
    if int(rank) != 0:
        msg = (f"rank {int(rank)}: the cluster's termination is rank 0's ([runpod] terminate_on_terminal_failure): "
               "the group failing for good shows there, and rank 0 deletes the whole cluster; this node deletes "
               "nothing")
        log.warning("%s", msg)
        event("runpod_terminate_left_to_rank0", msg)
        t = ClusterTermination(env.get("RUNPOD_POD_ID", "")[:64], spec.terminate_grace_s, time.monotonic(),
                               outcome="left to rank 0", rank=int(rank))
        t._done.set()
        return t
    found = self_terminate.usable(spec, env, event, consequence="this cluster will not delete itself")
    if found is None:
        return None
    pod_id, key = found
    name = (env.get(CLUSTER_NAME_ENV) or "").strip() or None
    t = ClusterTermination(pod_id, spec.terminate_grace_s, time.monotonic() + spec.terminate_grace_s,
                           on_change=on_change)
    msg = (f"the group can never serve ({failure[:300]}): deleting this pod's cluster"
           f"{f' (named {name!r})' if name else ''} in {spec.terminate_grace_s:g} s, every node with it "
           "([runpod] terminate_on_terminal_failure); /status stays up until then")
    log.warning("%s", msg)
    event("runpod_terminate_armed", msg)
    t.thread = threading.Thread(target=_run, args=(t, spec.api_url, key, name, event, session or requests.Session()),
                                name="kiln-runpod-cluster-terminate", daemon=True)
    t.thread.start()
    return t


def _run(t: ClusterTermination, api_url: str, key: str, name: str | None, event: OnEvent,
         session: requests.Session) -> None:
    try:
        t.cluster = _search(t, api_url, key, name, event, session)
        if t.cluster is not None:
            log.warning("pod %s is a member of cluster %s: deleting it when the grace ends", t.pod_id, t.cluster)
            t.changed()
            if t._cancel.wait(max(0.0, t.deadline - time.monotonic())):
                t.outcome = "cancelled"
            else:
                t.outcome = delete(t, api_url, f"/clusters/{t.cluster}", key, event, session,
                                   what=f"cluster {t.cluster}", refused=REFUSED)
        if t.outcome == "cancelled":
            log.info("cluster self-termination cancelled")
            event("runpod_terminate_cancelled", f"cluster {t.cluster or '(not looked up yet)'} kept")
    finally:
        t._done.set()
        t.changed()


def _search(t: ClusterTermination, api_url: str, key: str, name: str | None, event: OnEvent,
            session: requests.Session) -> str | None:
    """find() with self_terminate's retries; None (the outcome set, one warning said) when it fails."""
    backoff, why, retries = self_terminate.BACKOFF_S, "not tried", self_terminate.RETRIES
    for attempt in range(1, retries + 1):
        if t._cancel.is_set():
            t.outcome = "cancelled"
            return None
        try:
            return find(api_url, key, t.pod_id, name, session)
        except _Stop as e:
            why = " ".join(redact(str(e), [key]).split())[:400]
            break
        except _Again as e:
            why = " ".join(redact(str(e), [key]).split())[:300]
            log.error("finding this pod's cluster: attempt %d of %d failed: %s", attempt, retries, why)
        if attempt < retries and t._cancel.wait(backoff):
            t.outcome = "cancelled"
            return None
        backoff *= 2
    msg = f"this pod's cluster was not deleted: {why}"
    log.warning("%s", msg)
    event("runpod_terminate_failed", msg)
    t.outcome = f"failed: {why}"
    return None


def find(api_url: str, key: str, pod_id: str, name: str | None, session: requests.Session) -> str:
    """The id of the one cluster (named `name`, when given) whose member pods include `pod_id`.
    Raises _Stop (no match, several, refused) or _Again (an error worth retrying)."""
    listed = _get(session, api_url, "/clusters", key)
    clusters = listed.get("clusters") if isinstance(listed, dict) else None
    if not isinstance(clusters, list):
        raise _Again("GET /v2/clusters: the answer has no `clusters` list")
    candidates = [c for c in clusters if isinstance(c, dict) and (name is None or c.get("name") == name)]
    hits = []
    for c in candidates:
        cid = str(c.get("id") or "")
        if not POD_ID.fullmatch(cid):           # never put what is not an id into a URL
            continue
        members = _get(session, api_url, f"/clusters/{cid}/pods", key)
        if members is None:                     # deleted since it was listed
            continue
        pods = members.get("pods") if isinstance(members, dict) else None
        if not isinstance(pods, list):
            raise _Again(f"GET /v2/clusters/{cid}/pods: the answer has no `pods` list")
        if any(isinstance(p, dict) and p.get("id") == pod_id for p in pods):
            hits.append(cid)
    named = f" named {name!r} ({CLUSTER_NAME_ENV})" if name else ""
    if not hits:
        raise _Stop(f"no cluster{named} lists pod {pod_id} among its member pods ({len(candidates)} looked at): "
                    "nothing deleted; delete the cluster yourself (`build.py cluster down`)")
    if len(hits) > 1:
        raise _Stop(f"{len(hits)} clusters{named} list pod {pod_id} among their member pods ({', '.join(hits)}): "
                    "nothing deleted; delete the right one yourself")
    return hits[0]


def _get(session: requests.Session, api_url: str, path: str, key: str) -> Any:
    """The JSON answer, or None on 404; _Stop on 401/403, _Again on anything else."""
    try:
        r = session.get(api_url.rstrip("/") + path, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    except requests.RequestException as e:
        raise _Again(f"GET /v2{path}: {type(e).__name__}: {e}") from None
    if r.status_code == 404:
        return None
    if r.status_code in (401, 403):
        raise _Stop(f"GET /v2{path}: HTTP {r.status_code}: {problem_detail(r)}; {REFUSED}")
    if r.status_code != 200:
        raise _Again(f"GET /v2{path}: HTTP {r.status_code}: {problem_detail(r)}")
    try:
        return r.json()
    except ValueError:
        raise _Again(f"GET /v2{path}: the answer is not JSON") from None
