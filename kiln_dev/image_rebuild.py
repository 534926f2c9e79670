"""Does rebuilding the cpu-llamacpp image give the same layers? Two `build.py build --no-cache` builds on
the local Docker engine (FROM the registry-free base, the engine tarball fetched from this machine's
compile), compared layer by layer with images/build/layers.py. The outcome is kept in the Kiln cache
keyed by every input, so a warm CI run builds nothing.

    image_record()   hit:  the record for these inputs, once both images it names are still in the
                           engine with the layers it recorded (else they are built again)
                     miss: build twice, compare, record every layer (same or not, and how)

    ~/.cache/kiln/reproducible/image/<key>/record.json
    key = sha256 of: the build context build.py renders (every file's path, mode and sha256, the
          Dockerfile among them), the engine tarball's sha256, the base image's ID, the engine's version
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from images.binaries import obtain
from images.build import layers, render
from images.pins.lock import load_lock, pins_for
from images.target import load_target

from .cachelock import held
from .docker import docker_cli, local_base_image, require_docker
from .models import kiln_cache_dir
from .reproducible import recorded

REPO_ROOT = Path(__file__).resolve().parents[1]
TAGS = ("kiln-repro/cpu-llamacpp:first", "kiln-repro/cpu-llamacpp:second")
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")   # pip reaches PyPI through this machine's proxy


def _tree_digest(root: Path) -> list[list[str]]:
    return [[p.relative_to(root).as_posix(), oct(p.stat().st_mode & 0o777),
             hashlib.sha256(p.read_bytes()).hexdigest()]
            for p in sorted(root.rglob("*")) if p.is_file()]


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    prefix, env = docker_cli()
    return subprocess.run([*prefix, *args], capture_output=True, text=True, env=env, timeout=300, check=False)


def image_inputs(target_name: str = "cpu-llamacpp") -> tuple[dict, Path]:
    """(the inputs, the directory of the engine tarball build.py fetches from)."""
    require_docker()
    base = local_base_image()
    target = load_target(target_name)
    pins = pins_for(target, load_lock())
    _, packed = obtain.host_compile(target, pins)          # cached by its inputs: compiled once per machine
    ctx = render.make_context(target, pins, base_image=base)
    with tempfile.TemporaryDirectory(prefix="kiln-repro-ctx-") as tmp:
        render.write_context(ctx, Path(tmp) / "ctx")
        context = _tree_digest(Path(tmp) / "ctx")
    r = _docker("version", "--format", "{{.Server.Version}}")
    base_id = _docker("image", "inspect", "--format", "{{.Id}}", base).stdout.strip()
    return {"target": target_name, "context": context, "engine_tarball_sha256": packed.sha256,
            "base_image": base, "base_image_id": base_id, "docker_server": r.stdout.strip()}, packed.tarball.parent


def image_root() -> Path:
    return kiln_cache_dir() / "reproducible" / "image"


def image_record(target_name: str = "cpu-llamacpp") -> dict:
    inputs, store = image_inputs(target_name)
    slot = image_root() / hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    with held(slot.with_name(slot.name + ".lock"), what="the image rebuild comparison"):
        record = _cached(slot, inputs)
        if record is not None:
            return {**record, "cache": "hit"}
        return {**_build_twice(target_name, inputs, store, slot), "cache": "miss"}


def _layers_of(tag: str) -> list[str] | None:
    r = _docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", tag)
    return json.loads(r.stdout) if r.returncode == 0 else None


def _cached(slot: Path, inputs: dict) -> dict | None:
    record = recorded(slot, inputs)
    if record is None:
        return None
    for which, tag in zip(("first", "second"), TAGS):
        if _layers_of(tag) != [r[which] for r in record["rows"]]:
            print(f"image rebuild: {tag} is gone or has other layers than recorded: building again", file=sys.stderr)
            return None
    return record


def _build_twice(target_name: str, inputs: dict, store: Path, slot: Path) -> dict:
    env = {**os.environ, "DOCKER_HOST": require_docker()}
    builds = []
    for tag in TAGS:
        load_before = os.getloadavg()
        start = time.monotonic()
        r = subprocess.run(
            [sys.executable, str(REPO_ROOT / "build.py"), "build", "--target", target_name,
             "--base-image", inputs["base_image"], "--ca-bundle", str(CA_BUNDLE), "--binaries", "fetch",
             "--binaries-store", str(store), "--no-cache", "--tag", tag],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800, check=False, env=env)
        if r.returncode != 0:
            raise AssertionError(f"build of {tag} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
        builds.append({"tag": tag, "seconds": round(time.monotonic() - start), "loadavg_before": load_before,
                       "loadavg_after": os.getloadavg(),
                       "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    with tempfile.TemporaryDirectory(prefix="kiln-repro-saved-") as tmp:
        rows = layers.compare(layers.saved(TAGS[0], Path(tmp) / "first"), layers.saved(TAGS[1], Path(tmp) / "second"))
    record = {"inputs": inputs, "builds": builds,
              "rows": [{"index": r.index, "created_by": r.created_by, "first": r.first, "second": r.second,
                        "kiln": r.kilns, "same": r.same, "differences": len(r.differences),
                        "shown": r.differences[:20]} for r in rows]}
    slot.mkdir(parents=True, exist_ok=True)
    tmp_record = slot / "record.json.tmp"
    tmp_record.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp_record.replace(slot / "record.json")
    return record
