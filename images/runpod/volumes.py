"""Network volumes for the model cache: a volume outlives its pods, so a terminated pod's
successor finds the weights instead of downloading them again.

A network volume lives in one data center and a pod can mount it only there (NetworkMount:
"an existing NetworkVolume in the same data center as the pod"). Names are not unique on RunPod
("not required to be unique"): Kiln finds its volume by name and refuses to choose between two.
A volume bills while it exists, pods or not ($0.07/GB/month under 1 TB, standard tier:
docs.runpod.io/pods/pricing); `python build.py pods volumes --delete ID` removes it, and refuses
while an endpoint or a pod (a stopped one too) still mounts it (`users` names them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from supervisor.errors import KilnError

from .api import RunPodAPI

MIN_GB, MAX_GB = 10, 4096          # CreateNetworkVolumeRequest.size bounds


@dataclass(frozen=True)
class Volume:
    id: str
    name: str
    size_gb: int
    data_center: str
    action: str                    # created | reused


def ensure(api: RunPodAPI, name: str, size_gb: int, data_centers: tuple[str, ...]) -> Volume:
    """The volume named `name` (reused, wherever it is), or a new one in the one data center given."""
    found = [v for v in api.network_volumes() if v.get("name") == name]
    if len(found) > 1:
        where = ", ".join(f"{v.get('id')} in {v.get('dataCenter')}" for v in found)
        raise KilnError(f"--network-volume {name!r}: {len(found)} volumes have that name ({where}); "
                        "rename or delete the extra ones")
    if found:
        return _reused(found[0], f"--network-volume {name!r}", "a pod", data_centers)
    if len(data_centers) != 1:
        raise KilnError(f"--network-volume {name!r} does not exist yet: give exactly one --data-center to "
                        "create it in (a volume lives in one data center)")
    if not MIN_GB <= size_gb <= MAX_GB:
        raise KilnError(f"--network-volume-gb {size_gb}: RunPod network volumes are {MIN_GB}..{MAX_GB} GB")
    body: dict[str, Any] = {"name": name, "size": size_gb, "dataCenter": data_centers[0]}
    v = api.create_network_volume(body)
    return Volume(str(v.get("id")), name, int(v.get("size") or size_gb), str(v.get("dataCenter")), "created")


def by_id(api: RunPodAPI, volume_id: str, data_centers: tuple[str, ...], *, flag: str = "--volume",
          mounter: str = "a cluster") -> Volume:
    """The existing network volume `volume_id` (nothing is created: an id names one already made),
    refused when it is not in one of `data_centers` (when any are given)."""
    listed = api.network_volumes()
    found = next((v for v in listed if str(v.get("id")) == volume_id), None)
    if found is None:
        have = ", ".join(f"{v.get('id')} ({v.get('name')}, {v.get('dataCenter')})" for v in listed) or "none"
        raise KilnError(f"{flag} {volume_id}: no network volume with that id in this account (GET "
                        f"/v2/network-volumes lists: {have}); create one with `pods up --network-volume NAME "
                        "--data-center DC`, or in RunPod's console")
    return _reused(found, f"{flag} {volume_id}", mounter, data_centers)


def _reused(v: dict[str, Any], said: str, mounter: str, data_centers: tuple[str, ...]) -> Volume:
    dc = str(v.get("dataCenter"))
    if data_centers and dc not in data_centers:
        raise KilnError(f"{said} is in {dc}, not in --data-center {', '.join(data_centers)}: "
                        f"{mounter} mounts a network volume only in its data center (use --data-center {dc})")
    return Volume(str(v.get("id")), str(v.get("name")), int(v.get("size") or 0), dc, "reused")


def users(api: RunPodAPI, volume_id: str, *, besides: str = "") -> list[str]:
    """Who else mounts network volume `volume_id`, named: the endpoints that list it in
    networkVolumes and the pods that mount it (mounts.network[].volumeId), a stopped pod
    included (it keeps its mount), except the endpoint `besides`."""
    named = [f"endpoint {e.get('name')} ({e.get('id')})" for e in api.endpoints()
             if str(e.get("id")) != besides and volume_id in (e.get("networkVolumes") or [])]
    for pod in api.pods():
        mounts = pod.get("mounts") if isinstance(pod.get("mounts"), dict) else {}
        if any(isinstance(m, dict) and m.get("volumeId") == volume_id for m in mounts.get("network") or []):
            named.append(f"pod {pod.get('name')} ({pod.get('id')}, {pod.get('status')})")
    return named
