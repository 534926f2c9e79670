"""Kiln's serverless endpoints on RunPod: the catalog check, create-or-update by name, the
restore body, the price, down. The body itself is endpoint.py; the wait and the rollout are
rollout.py.

    serverless_offer   read GET /v2/catalog/gpus?include=AVAILABILITY&product=SERVERLESS first:
                       the pools of the target's GPU type (the live `pool` field), refused --
                       naming every pool and the CUDA versions on offer -- when no GPU of them
                       reports a CUDA version the image runs (cuda_floor). Nothing is written before.
    upsert             the endpoint named like the plan: created, or PATCHed with only the fields
                       that differ (a second run writes nothing). The previous values of what the
                       PATCH changes are kept, so a failed release can be undone; and which release
                       it made (its version, `ours`), so the wait judges that release and no other.
    ours / after       which of the endpoint's releases (GET .../releases) a PATCH made, and the
                       releases made after a given one (by anyone: a teammate, CI); `describe` says
                       one in a line (version, source, build, who, when, what changed).
    restore_body       the PATCH that puts those values back (never a secret's value: a variable
                       Kiln sends as a secret reference goes back as the reference);
                       restore_command the same PATCH as a command a user runs when Kiln could not.
    drop_created       the network volume this command created, deleted again when the endpoint was not
                       written (a create that fails must not leave a volume billing on its own).
    find / resolve     an endpoint by name; `resolve` refuses, naming the endpoints that exist.
    price              the pool's serverless list rate from the catalog (RunPod's, per GPU-hour).
    delete             DELETE /v2/serverless/{id}; the network volume stays unless asked, and is never
                       deleted while another endpoint or a pod mounts it (volumes.users names them).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, Callable

from supervisor.errors import KilnError
from supervisor.serverless.failures import CLEARED_ENV

from . import volumes
from .api import RunPodAPI, RunPodAPIError
from .cuda import compatible
from .endpoint import RELEASE_FIELDS, Compute, EndpointPlan

Say = Callable[[str], None]
SECRET_PREFIX = "{{ RUNPOD_SECRET_"


class NoMatchingPool(KilnError):
    """No serverless pool offers a GPU the image can run on: nothing was created."""


@dataclass(frozen=True)
class Offer:
    pools: tuple[str, ...]
    cuda: dict[str, tuple[str, ...]]      # GPU type id -> CUDA versions >= the floor with capacity now
    full: tuple[str, ...]                 # GPU types that run it but have no capacity now
    price_per_gpu_hour: dict[str, float]  # pool -> RunPod's serverless list price per GPU-hour


def _versions(entry: dict[str, Any]) -> str:
    offered = entry.get("cudaVersions") or []
    if not offered:
        return "no CUDA version reported"
    return ", ".join(f"{v.get('version')}{'' if v.get('available') else ' (full)'}" for v in offered)


def _by_pool(gpus: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    pools: dict[str, list[dict[str, Any]]] = {}
    for g in gpus:
        if g.get("pool"):
            pools.setdefault(str(g["pool"]), []).append(g)
    return pools


def serverless_offer(api: RunPodAPI, compute: Compute, floor: str | None, gpu_id: str | None,
                     say: Say) -> tuple[Compute, Offer]:
    """The pools to ask for, from the live catalog, once a GPU of them runs the image."""
    gpus = api.gpu_types(count=compute.gpu_count, product="SERVERLESS")
    pools = _by_pool(gpus)
    on_offer = "; ".join(f"{p}: " + ", ".join(f"{g.get('id')} [{_versions(g)}]" for g in gs)
                         for p, gs in sorted(pools.items())) or "nothing"
    if compute.pools_from == "--pool":
        wanted = compute.pools
        unknown = [p for p in wanted if p not in pools]
        if unknown:
            raise NoMatchingPool(f"--pool {', '.join(unknown)}: RunPod's serverless catalog has no such pool "
                                 f"({compute.gpu_count} GPU(s) per worker); on offer: {on_offer}")
    elif not gpu_id:
        raise NoMatchingPool(f"the target names no [runpod] gpu_type: give --pool; on offer: {on_offer}")
    else:
        entry = next((g for g in gpus if g.get("id") == gpu_id), None)
        if entry is None or not entry.get("pool"):
            why = "lists no GPU type" if entry is None else "puts in no serverless pool the"
            raise NoMatchingPool(f"RunPod's serverless catalog {why} {gpu_id!r} ({compute.gpu_count} GPU(s) per "
                                 f"worker); on offer: {on_offer}. Nothing was created: give --pool")
        wanted = (str(entry["pool"]),)
        if compute.pools and tuple(compute.pools) != wanted:
            say(f"catalog: {gpu_id} is in pool {wanted[0]} (RunPod's docs table said {', '.join(compute.pools)}; "
                "the live catalog wins)")
    members = [g for p in wanted for g in pools[p]]
    cuda: dict[str, tuple[str, ...]] = {}
    full: list[str] = []
    for g in members:
        runs = compatible(g.get("cudaVersions") or [], floor) if floor else [{"version": "any", "available": True}]
        now = tuple(str(v["version"]) for v in runs if v.get("available"))
        if now:
            cuda[str(g["id"])] = now
        elif runs:
            full.append(str(g["id"]))
    if not cuda and not full:
        mine = "; ".join(f"{g.get('id')} [{_versions(g)}]" for g in members)
        raise NoMatchingPool(f"no GPU of pool {', '.join(wanted)} reports a CUDA version this image runs on "
                             f"(>= {floor}): {mine}. On offer: {on_offer}. Nothing was created: choose "
                             "another --pool, or an image built for an older CUDA")
    prices: dict[str, float] = {}
    for p in wanted:
        rates = [float(g["price"]["serverless"]) for g in pools[p]
                 if isinstance((g.get("price") or {}).get("serverless"), (int, float))]
        if rates:
            prices[p] = max(rates)
    return (Compute(pools=wanted, gpu_count=compute.gpu_count, pools_from="the live catalog"),
            Offer(wanted, cuda, tuple(full), prices))


# -- finding endpoints ------------------------------------------------------------------------
def find(api: RunPodAPI, name: str) -> dict[str, Any] | None:
    found = [e for e in api.endpoints() if e.get("name") == name]
    if len(found) > 1:
        ids = ", ".join(str(e.get("id")) for e in found)
        raise KilnError(f"{len(found)} endpoints are named {name!r} ({ids}); Kiln finds its endpoint by name: "
                        "delete the extra ones in RunPod's console")
    return found[0] if found else None


def resolve(api: RunPodAPI, name: str) -> dict[str, Any]:
    """The endpoint named `name`, or a refusal naming those that exist."""
    found = find(api, name)
    if found is None:
        there = ", ".join(f"{e.get('name')} ({e.get('id')})" for e in api.endpoints()) or "none"
        raise KilnError(f"no endpoint named {name!r} on RunPod; endpoints there: {there} (`endpoint up` creates "
                        "it; --name picks another)")
    return found


# -- releases: which one is this command's ------------------------------------------------------
# An Endpoint carries no version (the vendored schema's Endpoint); its releases do (Release.version,
# "the endpoint configuration version this release produced"), as does each worker (Worker.version,
# compared with the listing's endpointVersion). So a command that makes a release reads the
# endpoint's version before its PATCH and the releases after it: the one it made is the release
# after that version, and when others released in between, the one whose diff carries what it sent.
def version_now(listing: dict[str, Any]) -> int | None:
    """The endpoint's current version in a GET .../releases (or .../workers) answer."""
    v = listing.get("endpointVersion")
    if isinstance(v, int):
        return v
    vs = [r["version"] for r in listing.get("releases") or [] if isinstance(r, dict) and isinstance(r.get("version"), int)]
    return max(vs) if vs else None


def _releases(listing: dict[str, Any]) -> list[dict[str, Any]]:
    """The releases that carry a version, oldest first."""
    rs = [r for r in listing.get("releases") or [] if isinstance(r, dict) and isinstance(r.get("version"), int)]
    return sorted(rs, key=lambda r: r["version"])


def _carries(release: dict[str, Any], patch: dict[str, Any]) -> int:
    """How many of the values a PATCH sent are among a release's diff's new values."""
    news = [d.get("new") for d in release.get("diff") or [] if isinstance(d, dict)]
    return sum(1 for value in patch.values() if any(n == value for n in news))


@dataclass(frozen=True)
class Ours:
    version: int | None                          # the release this command made; None: it cannot tell
    earlier: tuple[dict[str, Any], ...] = ()     # releases others made after it read the endpoint, before its own
    unsure: tuple[dict[str, Any], ...] = ()      # the releases it could not tell apart (version None)


def ours(listing: dict[str, Any], before: int | None, patch: dict[str, Any]) -> Ours:
    """Which release in `listing` (GET .../releases after the PATCH) the PATCH made: the one release
    after `before`, else the one whose diff carries the most of what was sent (a tie: it cannot tell)."""
    newer = [r for r in _releases(listing) if before is None or r["version"] > before]
    if not newer:                                # no release listed for it (yet): the version it is at
        return Ours(version_now(listing))
    if len(newer) == 1:
        return Ours(newer[0]["version"])
    scores = [_carries(r, patch) for r in newer]
    best = max(scores)
    if best == 0 or scores.count(best) > 1:
        return Ours(None, unsure=tuple(newer))
    mine = newer[scores.index(best)]
    return Ours(mine["version"], earlier=tuple(r for r in newer if r["version"] < mine["version"]))


def after(api: RunPodAPI, endpoint_id: str, version: int | None) -> list[dict[str, Any]]:
    """The releases made after `version` (by anyone), oldest first; [] when none or it cannot be read."""
    if version is None:
        return []
    listing = api.endpoint_releases(endpoint_id)
    newer = [r for r in _releases(listing) if r["version"] > version]
    now = version_now(listing)
    if not newer and now is not None and now > version:          # versions listed without their releases
        newer = [{"version": now}]
    return newer


def describe(release: dict[str, Any]) -> str:
    """A release in one line: version, what made it (source, build), who, when, what changed."""
    made = str(release.get("source") or "source unknown")
    if release.get("buildId"):
        made += f" build {release['buildId']}"
    if release.get("createdByUserId"):
        made += f" by user {release['createdByUserId']}"
    if release.get("createdAt"):
        made += f", {release['createdAt']}"
    fields = ", ".join(str(d.get("field")) for d in release.get("diff") or [] if isinstance(d, dict))
    return f"v{release.get('version')} ({made}, changed: {fields or 'not listed'})"


def patch_release(api: RunPodAPI, endpoint_id: str, patch: dict[str, Any], before: int | None) \
        -> tuple[dict[str, Any], Ours]:
    """PATCH the endpoint and tell which release that made (`before`: its version when it was read)."""
    e = api.update_endpoint(endpoint_id, patch)
    try:
        return e, ours(api.endpoint_releases(endpoint_id), before, patch)
    except RunPodAPIError:
        return e, Ours(None)


def read_version(api: RunPodAPI, endpoint_id: str) -> int | None:
    try:
        return version_now(api.endpoint_releases(endpoint_id))
    except RunPodAPIError:
        return None


# -- create or update -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Change:
    action: str                          # created | updated | unchanged
    endpoint: dict[str, Any]             # RunPod's Endpoint after the change
    patch: dict[str, Any]                # what was sent ({} when created or unchanged)
    previous: dict[str, Any]             # the endpoint before (empty when created)
    ours: Ours = Ours(None)              # the release it made (created, updated), or the one it found (unchanged)

    @property
    def new_release(self) -> bool:
        """The change rolls out as workers cycle (a container or compute field changed)."""
        return self.action == "created" or any(k in RELEASE_FIELDS for k in self.patch)


def _gpu_same(existing: Any, wanted: dict[str, Any]) -> bool:
    e = existing if isinstance(existing, dict) else {}
    return (sorted(e.get("pools") or []) == sorted(wanted["pools"]) and int(e.get("count") or 1) == wanted["count"]
            and (e.get("minCudaVersion") or None) == wanted.get("minCudaVersion")
            and not e.get("allowedCudaVersions") and not e.get("excludedTypes"))


def _env_same(existing: Any, wanted: dict[str, str], secret_keys: frozenset[str]) -> bool:
    """Equal, except that a secret's variable only has to be there: whether RunPod echoes a secret
    reference or what it resolves to is not documented (never compare a value Kiln never sent)."""
    e = existing if isinstance(existing, dict) else {}
    if set(e) != set(wanted):
        return False
    return all(k in secret_keys and e[k] or e[k] == v for k, v in wanted.items())


def _kept_env(existing: Any) -> dict[str, str]:
    """What a release keeps of the endpoint's env that no target says: the failure records' clear mark
    (`endpoint failures --clear`, images/runpod/failures.py), so an `up` neither drops it nor makes a
    release of its own."""
    e = existing if isinstance(existing, dict) else {}
    return {CLEARED_ENV: str(e[CLEARED_ENV])} if e.get(CLEARED_ENV) else {}


def differences(existing: dict[str, Any], body: dict[str, Any], secret_keys: frozenset[str]) -> dict[str, Any]:
    """The UpdateEndpointRequest that brings `existing` to `body`: only the fields that differ."""
    patch: dict[str, Any] = {}
    for key, want in body.items():
        if key in ("name", "type"):
            continue
        have = existing.get(key)
        if key == "gpu":
            if not _gpu_same(have, want):
                # minCudaVersion does not clear an exact list, and pools without excludedTypes
                # clears the exclusions: both said explicitly.
                patch["gpu"] = {**want, "allowedCudaVersions": []}
        elif key == "env":
            want = {**want, **_kept_env(have)}
            if not _env_same(have, want, secret_keys):
                patch["env"] = want
        elif key == "workers":
            if any((have or {}).get(k) != v for k, v in want.items()):
                patch["workers"] = want
        elif have != want:
            patch[key] = want
    return patch


def upsert(api: RunPodAPI, plan: EndpointPlan, *, down: str = "`endpoint down`") -> Change:
    """Create the endpoint named like the plan, or PATCH the one with that name to it. `down`: the
    command that deletes it, for a refusal to say."""
    body = plan.body
    found = find(api, plan.name)
    if found is None:
        e = api.create_endpoint(body)
        try:                                         # the endpoint's first release: nobody else's yet
            first = _releases(api.endpoint_releases(str(e["id"])))
        except RunPodAPIError:
            first = []
        return Change("created", e, {}, {}, Ours(first[0]["version"] if first else None))
    if found.get("type") not in (None, "LOAD_BALANCER"):
        raise KilnError(f"endpoint {plan.name!r} ({found.get('id')}) is a {found.get('type')} endpoint and an "
                        f"endpoint's type cannot change: {down} deletes it, or choose another --name")
    if ("gpu" in body) != bool(found.get("gpu")):
        family = "GPU" if found.get("gpu") else "CPU"
        raise KilnError(f"endpoint {plan.name!r} ({found.get('id')}) is a {family} endpoint and its compute "
                        f"family cannot change: {down} deletes it, or choose another --name")
    eid = str(found["id"])
    # The version first, then the endpoint: what a restore would put back is that version's, or a
    # later one's (then the releases listed after the PATCH name the one between: `earlier`).
    before = read_version(api, eid)
    existing = api.endpoint(eid) if before is not None else found
    patch = differences(existing, body, plan.secret_keys)
    if not patch:
        return Change("unchanged", existing, {}, existing, Ours(before))
    e, mine = patch_release(api, eid, patch, before)
    return Change("updated", e, patch, existing, mine)


def restore_body(change: Change, secret_keys: frozenset[str], refs: dict[str, str]) -> dict[str, Any]:
    """The PATCH that puts back what `change` replaced among the release fields. `refs` are the
    secret references Kiln sends: a secret's variable goes back as its reference, never as a
    value RunPod may have answered in its place."""
    before = change.previous
    out: dict[str, Any] = {}
    for key in change.patch:
        if key not in RELEASE_FIELDS or key not in before:
            continue
        value = before[key]
        if key == "env" and isinstance(value, dict):
            value = {k: (refs[k] if k in secret_keys and k in refs and not str(v).startswith(SECRET_PREFIX) else v)
                     for k, v in value.items()}
        elif key == "gpu" and isinstance(value, dict):
            value = {"pools": list(value.get("pools") or []), "count": int(value.get("count") or 1),
                     "allowedCudaVersions": list(value.get("allowedCudaVersions") or []),
                     "minCudaVersion": value.get("minCudaVersion") or "",
                     **({"excludedTypes": value["excludedTypes"]} if value.get("excludedTypes") else {})}
        out[key] = value
    return out


def restore_command(api: RunPodAPI, endpoint_id: str, body: dict[str, Any]) -> str:
    """The shell command that sends the restore PATCH, for when Kiln could not: the key is read
    from $RUNPOD_API_KEY where it runs, never written out; secrets are references in `body`."""
    url = f"{api.base_url}/serverless/{endpoint_id}"
    return (f"curl -fsS -X PATCH {shlex.quote(url)} -H \"Authorization: Bearer $RUNPOD_API_KEY\" "
            f"-H 'Content-Type: application/json' --data {shlex.quote(json.dumps(body, separators=(',', ':')))}")


# -- what it costs, and down ------------------------------------------------------------------------
# A worker bills from its start until it is stopped, whatever its health: an UNHEALTHY one is a running
# container the load balancer no longer routes to (serverless/load-balancing/overview.mdx @a900806e),
# not a stopped one. THROTTLED waits for a machine and has none yet.
BILLED = ("RUNNING", "IDLE", "INITIALIZING", "UNHEALTHY")


def billed(workers: list[dict]) -> int:
    """How many of an endpoint's workers bill now (GET /v2/serverless/{id}/workers' `workers`)."""
    return sum(1 for w in workers if isinstance(w, dict) and w.get("status") in BILLED)


def price(api: RunPodAPI, endpoint: dict[str, Any]) -> tuple[float | None, str]:
    """RunPod's serverless list price for one worker of `endpoint` per hour, and where it comes from."""
    gpu = endpoint.get("gpu") if isinstance(endpoint.get("gpu"), dict) else None
    if not gpu:
        return None, "a CPU endpoint: the GPU catalog lists no rate for it (see runpod.io/pricing)"
    count = int(gpu.get("count") or 1)
    pools = set(gpu.get("pools") or [])
    rates = [float(g["price"]["serverless"]) for g in api.gpu_types(count=count, product="SERVERLESS")
             if g.get("pool") in pools and isinstance((g.get("price") or {}).get("serverless"), (int, float))]
    if not rates:
        return None, f"the catalog gives no serverless rate for pool {', '.join(sorted(pools))}"
    return max(rates) * count, (f"RunPod's catalog list price (price.serverless) for pool {', '.join(sorted(pools))}, "
                                f"x{count} GPU(s); negotiated discounts are not reflected")


def volume_for(api: RunPodAPI, name: str, size_gb: int, data_centers: tuple[str, ...], say: Say) -> volumes.Volume:
    vol = volumes.ensure(api, name, size_gb, data_centers)
    say(f"network volume {vol.name}: {vol.action} ({vol.id}, {vol.size_gb} GB in {vol.data_center}; workers mount "
        "it at /runpod-volume and are placed in its data center); it bills while it exists")
    return vol


def drop_created(api: RunPodAPI, vol: volumes.Volume | None, say: Say) -> None:
    """After the endpoint that was to mount it was not written (an API error, an interrupt): delete
    the network volume when this command created it and nothing mounts it, so it does not bill on
    alone. A volume that was reused, or that something mounts after all (an interrupted create
    that RunPod carried out), is kept; a delete that fails names the command that does it."""
    if vol is None or vol.action != "created":
        return
    try:
        users = volumes.users(api, vol.id)
        if users:
            say(f"network volume {vol.name} ({vol.id}): kept, {', '.join(users)} mounts it")
            return
        api.delete_network_volume(vol.id)
    except (KilnError, OSError) as e:
        say(f"network volume {vol.name} ({vol.id}) was created for this endpoint and could not be deleted ({e}); "
            f"it bills while it exists: `python build.py pods volumes --delete {vol.id}` deletes it")
        return
    say(f"network volume {vol.name} ({vol.id}): deleted again (created by this command for the endpoint, "
        "which was not written)")


def delete(api: RunPodAPI, endpoint: dict[str, Any], say: Say, *, delete_volumes: bool = False,
           down: str = "`endpoint down`") -> list[str]:
    """Delete the endpoint (its workers end with it); its network volumes too when asked, and only
    when nothing else mounts them: otherwise nothing is deleted and the users are named. Returns
    the ids of the volumes kept. `down`: the command that deletes it, for a refusal to name."""
    eid = str(endpoint["id"])
    if delete_volumes:
        shared = {str(v): volumes.users(api, str(v), besides=eid) for v in endpoint.get("networkVolumes") or []}
        shared = {v: users for v, users in shared.items() if users}
        if shared:
            named = "; ".join(f"{v} is mounted by {', '.join(users)}" for v, users in shared.items())
            raise KilnError(f"--delete-volume: {named}: deleting it would take their weights and caches away. "
                            f"Nothing was deleted; {down} (without --delete-volume) deletes endpoint "
                            f"{endpoint.get('name')} and keeps the volume")
    if api.delete_endpoint(eid):
        say(f"endpoint {endpoint.get('name')} ({eid}): deleted, with its workers")
    else:
        say(f"endpoint {endpoint.get('name')} ({eid}): already gone")
    kept = []
    for vid in endpoint.get("networkVolumes") or []:
        if delete_volumes:
            api.delete_network_volume(str(vid))
            say(f"network volume {vid}: deleted, with the weights on it")
        else:
            kept.append(str(vid))
    return kept
