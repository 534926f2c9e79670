"""Which layers two images share: the check that rebuilding an image gives the same layers.

    saved(ref, dest)        `docker save` of an image into a directory (its config and layer tars)
    layers(saved_dir)       each layer: its diff_id (the sha256 of the uncompressed layer tar, what
                            `docker image inspect` lists as RootFS.Layers) and the Dockerfile step that
                            wrote it (the config's history, empty steps skipped)
    compare(a_dir, b_dir)   one row per layer position: same or not, and for a layer that differs,
                            how (images/tarcompare.py: which files, which header fields); a row is
                            Kiln's when its step copies a staged /kiln-layer/ (images/templates/
                            _supervisor.j2): those are the layers a rebuild must reproduce

Compared by diff_id, not by the compressed digests a registry lists: compression is the pusher's
choice, the content is the build's. The image config (and so the image ID) holds creation times the
builder writes; comparing it says nothing about the layers.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.errors import KilnError

from ..tarcompare import differences
from .docker import cli_env, docker_cli

__all__ = ["KILN_STEP", "Layer", "Row", "compare", "layers", "saved"]

KILN_STEP = "/kiln-layer/ /"     # in the history of `COPY --from=<stage> /kiln-layer/ /`


@dataclass(frozen=True)
class Layer:
    diff_id: str         # sha256:<64 hex> of the uncompressed layer tar
    created_by: str      # the Dockerfile step, as the builder recorded it
    tar: Path            # the layer tar inside the saved directory


@dataclass(frozen=True)
class Row:
    index: int
    created_by: str
    first: str
    second: str
    differences: list[str] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return self.first == self.second

    @property
    def kilns(self) -> bool:
        """A layer Kiln writes (staged and dated), as opposed to the base's or a package manager's."""
        return KILN_STEP in self.created_by


def saved(ref: str, dest: Path) -> Path:
    """`docker save REF` unpacked into dest (a new directory); returns dest."""
    dest = Path(dest)
    dest.mkdir(parents=True)
    archive = dest.with_name(dest.name + ".tar")
    r = subprocess.run([docker_cli(), "save", "-o", str(archive), ref], capture_output=True, text=True,
                       env=cli_env(), check=False)
    if r.returncode != 0:
        raise KilnError(f"docker save {ref} failed: {r.stderr.strip()[:300]}; is {ref} in the local image store?")
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
    finally:
        archive.unlink(missing_ok=True)
    return dest


def layers(saved_dir: Path) -> list[Layer]:
    """The layers of a `docker save`d image, base first, each with the step that wrote it."""
    saved_dir = Path(saved_dir)
    manifest = json.loads((saved_dir / "manifest.json").read_text(encoding="utf-8"))
    if len(manifest) != 1:
        raise KilnError(f"{saved_dir}: expected one image in manifest.json, found {len(manifest)}")
    config = json.loads((saved_dir / manifest[0]["Config"]).read_text(encoding="utf-8"))
    diff_ids = config["rootfs"]["diff_ids"]
    steps = [h.get("created_by", "") for h in config.get("history", []) if not h.get("empty_layer")]
    tars = manifest[0]["Layers"]
    if not (len(diff_ids) == len(tars) and len(steps) in (0, len(diff_ids))):
        raise KilnError(f"{saved_dir}: {len(diff_ids)} diff_ids, {len(tars)} layer files and {len(steps)} "
                        "non-empty history steps do not line up")
    steps = steps or ["(no history)"] * len(diff_ids)
    return [Layer(d, s, saved_dir / t) for d, s, t in zip(diff_ids, steps, tars)]


def compare(first_dir: Path, second_dir: Path, *, explain: bool = True) -> list[Row]:
    """One row per layer position of two saved images; a differing layer says how (when explain)."""
    a, b = layers(first_dir), layers(second_dir)
    if len(a) != len(b):
        raise KilnError(f"the images have {len(a)} and {len(b)} layers: they were not built from the same "
                        "Dockerfile")
    rows = []
    for i, (la, lb) in enumerate(zip(a, b)):
        diffs = differences(la.tar, lb.tar) if explain and la.diff_id != lb.diff_id else []
        rows.append(Row(i, la.created_by, la.diff_id, lb.diff_id, diffs))
    return rows
