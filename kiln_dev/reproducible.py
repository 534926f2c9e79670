"""Is the engine tarball reproducible on this machine? Two fresh compiles of the pinned sdist, in work
directories of different names and lengths, one after the other, packed and compared byte for byte.
The outcome is kept in the Kiln cache keyed by every input, so CI pays the two compiles (~30 minutes on
2 cores) once per change of input, not once per run.

    engine_record(target)   hit:  the record for these inputs, once the tarball it names still hashes to
                                  the sha256 it recorded (else it is computed again)
                            miss: compile twice, compare, record both sha256s (equal or not)

    ~/.cache/kiln/reproducible/engine/<key>/record.json, first.tar.gz, second.tar.gz
    key = sha256 of the inputs: sdist sha256, compile script sha256, compiler and CMake versions,
          the target's cmake flags, SOURCE_DATE_EPOCH
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from images.binaries import obtain, rebuild
from images.digest import sha256_file
from images.paths import COMPILE_SCRIPT
from images.pins.lock import load_lock, pins_for, source_date_epoch
from images.target import load_target

from .cachelock import held
from .models import kiln_cache_dir


def engine_inputs(target_name: str = "cpu-llamacpp") -> dict:
    target = load_target(target_name)
    pins = pins_for(target, load_lock())
    return {
        "target": target_name,
        "sdist_sha256": str(pins["source.sha256"].value),
        "compile_script_sha256": sha256_file(COMPILE_SCRIPT),
        "toolchain": rebuild.toolchain(),
        "cmake_flags": list(target.cmake_flags),
        "source_date_epoch": source_date_epoch(target, pins),
    }


def _key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def engine_root() -> Path:
    return kiln_cache_dir() / "reproducible" / "engine"


def engine_record(target_name: str = "cpu-llamacpp") -> dict:
    """The comparison for this machine's inputs: cached when its tarball still checks out, else made."""
    inputs = engine_inputs(target_name)
    slot = engine_root() / _key(inputs)
    with held(slot.with_name(slot.name + ".lock"), what="the engine rebuild comparison"):
        record = _cached(slot, inputs)
        if record is not None:
            return {**record, "cache": "hit"}
        return {**_compile_twice(target_name, inputs, slot), "cache": "miss"}


def recorded(slot: Path, inputs: dict) -> dict | None:
    """The record kept in `slot` when it was made from exactly these inputs (image_rebuild.py's too)."""
    try:
        record = json.loads((slot / "record.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if record.get("inputs") == inputs else None


def _cached(slot: Path, inputs: dict) -> dict | None:
    record = recorded(slot, inputs)
    if record is None:
        return None
    for which in ("first", "second"):
        path = slot / f"{which}.tar.gz"
        if not path.is_file() or sha256_file(path) != record.get(f"{which}_sha256"):
            print(f"reproducible: {path} no longer hashes to the recorded sha256: comparing again", file=sys.stderr)
            return None
    return record


def _compile_twice(target_name: str, inputs: dict, slot: Path) -> dict:
    target = load_target(target_name)
    pins = pins_for(target, load_lock())
    spec = obtain.expected_spec(target, pins, obtain.artifacts.os_identity())
    runs = []
    with tempfile.TemporaryDirectory(prefix="kiln-repro-") as tmp:
        # Different names and lengths: a build path in the binary shows up as a difference.
        for which, label in (("first", "1"), ("second", "second-longer")):
            load_before = os.getloadavg()
            start = time.monotonic()
            packed, work = rebuild.fresh_compile(target, pins, spec, Path(tmp) / which, label=label)
            runs.append({"which": which, "work_dir": str(work), "seconds": round(time.monotonic() - start),
                         "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                         "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         "sha256": packed.sha256, "tarball": packed.tarball,
                         "leaks": rebuild.leaks(Path(tmp) / which / "prefix", [str(work)])})
        diffs = rebuild.differences(runs[0]["tarball"], runs[1]["tarball"])
        if slot.exists():
            shutil.rmtree(slot)
        slot.mkdir(parents=True)
        for run in runs:
            shutil.copyfile(run.pop("tarball"), slot / f"{run['which']}.tar.gz")
    record = {"inputs": inputs, "first_sha256": runs[0]["sha256"], "second_sha256": runs[1]["sha256"],
              "differences": diffs, "runs": runs, "tarball_name": spec.name()}
    tmp_record = slot / "record.json.tmp"
    tmp_record.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp_record.replace(slot / "record.json")
    return record
