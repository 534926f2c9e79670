"""Pins: the resolved identity of everything a build pulls in.

images/lock.toml records, per target, each pin's value and where it came from
(a registry answer, `git ls-remote`, PyPI's API, or public material someone
read). Builds use only locked values; a pin that is not resolved is refused,
naming the pin and how to resolve it, unless the user allows floating — and
then the image's labels say so. Nothing here ever guesses a value.
"""

from __future__ import annotations

import datetime as _dt
import re
import subprocess
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping

from supervisor.errors import ConfigError
from supervisor.validate import Problem

from ..digest import sha256_file
from ..paths import LOCK_PATH
from ..target import Target

DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
CUDA_RE = re.compile(r"\d+\.\d+")


@dataclass(frozen=True)
class Pin:
    key: str                        # base.build | base.runtime | source.commit | source.sha256 | patch.<name>
                                    # | engine.cuda | engine.closure
    value: str | None = None
    source: str = ""                # where the value came from
    resolved_on: str = ""           # date it was resolved (YYYY-MM-DD)
    unresolved: str = ""            # why not, when value is None

    @property
    def resolved(self) -> bool:
        return self.value is not None


def required_pins(target: Target) -> list[str]:
    keys = ["base.build", "base.runtime"]
    keys.append("source.commit" if target.source.kind == "git" else "source.sha256")
    keys += [f"patch.{p.name}" for p in target.patches]
    if target.source.kind == "pypi-wheel" and target.engine != "router":
        keys.append("engine.cuda")      # what the wheel's torch installs, checked against [cuda] version
    return keys


def optional_pins(target: Target) -> list[str]:
    """Pins the lock records and reports but a build does not need (an unresolved one refuses nothing)."""
    return ["engine.closure"] if target.source.kind == "pypi-wheel" and target.engine != "router" else []


def how_to_resolve(target: Target, key: str) -> str:
    t = target.name
    if key.startswith("base."):
        ref = target.bases.build if key == "base.build" else target.bases.runtime
        return (f"run `python build.py lock --target {t}` where the registry is reachable, or check "
                f"`docker buildx imagetools inspect {ref}` and record its Digest")
    if key == "source.commit":
        return (f"run `python build.py lock --target {t}` where {target.source.url} is reachable "
                f"(`git ls-remote {target.source.url} refs/heads/{target.source.branch}`)")
    if key == "source.sha256":
        return f"run `python build.py lock --target {t}` (asks PyPI for {target.source.filename})"
    if key == "engine.cuda":
        return (f"run `python build.py lock --target {t}` (reads {target.source.package}'s and torch's "
                "metadata from PyPI, PEP 658)")
    if key == "engine.closure":
        return (f"run `python build.py lock --target {t}` where the index has every package the engine needs "
                "(writes images/closures/ and the file's sha256)")
    if key.startswith("patch."):
        name = key.split(".", 1)[1]
        return (f"run `python build.py lock --target {t} --patch-file {name}=PATH` with your copy of "
                f"the patch (records its sha256), or set [[patches]] url for {name}")
    return "unknown pin"


def _validate_value(key: str, value: str) -> str | None:
    if key.startswith("base."):
        return None if DIGEST_RE.fullmatch(value) else "must be sha256:<64 hex>"
    if key == "source.commit":
        return None if COMMIT_RE.fullmatch(value) else "must be a full 40-hex commit"
    if key == "engine.cuda":
        return None if CUDA_RE.fullmatch(value) else 'must be a CUDA major.minor, e.g. "13.0"'
    if key == "engine.closure":
        return None if SHA256_RE.fullmatch(value) else ("must be the sha256 of the closure file (64 lowercase hex; "
                                                        "else: unresolved, naming what is missing)")
    return None if SHA256_RE.fullmatch(value) else "must be 64 lowercase hex digits"


def load_lock(path: Path | None = None) -> dict[str, dict[str, Pin]]:
    path = path or LOCK_PATH          # read at call time: tests point LOCK_PATH at a copy
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(str(path), [Problem("(toml)", f"is not valid TOML: {e}")]) from None
    except UnicodeDecodeError as e:
        raise ConfigError(str(path), [Problem("(file)", f"is not UTF-8 text ({e.reason} at byte {e.start})")]) from None
    except OSError as e:
        raise ConfigError(str(path), [Problem("(file)", f"cannot be read ({e.strerror})")]) from None
    problems: list[Problem] = []
    out: dict[str, dict[str, Pin]] = {}
    for tname, pins in data.items():
        if not isinstance(pins, dict):
            problems.append(Problem(tname, "must be a table of pins", pins))
            continue
        out[tname] = {}
        for key, entry in pins.items():
            where = f'{tname}."{key}"'
            if not isinstance(entry, dict):
                problems.append(Problem(where, "must be a table", entry))
                continue
            unknown = set(entry) - {"value", "source", "resolved_on", "unresolved"}
            if unknown:
                problems.append(Problem(where, "has unknown fields", sorted(unknown),
                                        "value, source, resolved_on, unresolved"))
            value = entry.get("value")
            if value is not None:
                err = _validate_value(key, str(value))
                if err:
                    problems.append(Problem(f"{where}.value", err, value))
                    value = None
                elif not entry.get("source"):
                    problems.append(Problem(f"{where}.source", "is required: say where the value came from"))
            elif not entry.get("unresolved"):
                problems.append(Problem(where, "needs either value (+ source) or unresolved (why)"))
            out[tname][key] = Pin(key, value, entry.get("source", ""), str(entry.get("resolved_on", "")),
                                  entry.get("unresolved", ""))
    if problems:
        raise ConfigError(str(path), problems)
    return out


def pins_for(target: Target, lock: Mapping[str, Mapping[str, Pin]]) -> dict[str, Pin]:
    """The target's required pins (an absent one unresolved), and its optional ones where resolved."""
    have = lock.get(target.name, {})
    pins = {k: have.get(k, Pin(k, None, unresolved="not in images/lock.toml")) for k in required_pins(target)}
    pins.update({k: have[k] for k in optional_pins(target) if k in have and have[k].resolved})
    return pins


def missing(target: Target, pins: Mapping[str, Pin]) -> list[str]:
    """One line per unresolved pin: which, why, and how to resolve it."""
    return [f"{k}: unresolved ({p.unresolved or 'no value'}); to resolve: {how_to_resolve(target, k)}"
            for k, p in pins.items() if not p.resolved]


def source_date_epoch(target: Target, pins: Mapping[str, Pin]) -> int:
    """SOURCE_DATE_EPOCH for a build of the target: 00:00 UTC of the day the lock last changed its source
    pin (``resolved_on`` of source.sha256, or source.commit for a git source).

    A re-lock that finds the same source leaves ``resolved_on`` as it was (refresh()), so the value moves
    only when the source does. 0 when the pin has no date (unresolved: a floating build promises no
    rebuild). Compilers, tar and Python's bytecode compiler read it instead of the clock."""
    pin = pins.get("source.commit" if target.source.kind == "git" else "source.sha256")
    if pin is None or not pin.resolved or not pin.resolved_on:
        return 0
    try:
        day = _dt.date.fromisoformat(pin.resolved_on)
    except ValueError:
        raise ConfigError(str(LOCK_PATH), [Problem(f'{target.name}."{pin.key}".resolved_on',
                                                   "must be a date YYYY-MM-DD", pin.resolved_on)]) from None
    return int(_dt.datetime(day.year, day.month, day.day, tzinfo=_dt.timezone.utc).timestamp())


# -- writing ------------------------------------------------------------------
def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dump_lock(lock: Mapping[str, Mapping[str, Pin]]) -> str:
    lines = ["# Resolved pins for every target. Written by `python build.py lock`; builds use only these.",
             "# Every value says where it came from; an unresolved pin says why and is refused at build",
             "# time unless --allow-floating (and then the image is labelled floating).", ""]
    for tname in sorted(lock):
        for key, pin in sorted(lock[tname].items()):
            lines.append(f'[{tname}."{key}"]')
            if pin.value is not None:
                lines.append(f"value = {_q(pin.value)}")
                lines.append(f"source = {_q(pin.source)}")
                if pin.resolved_on:
                    lines.append(f"resolved_on = {_q(pin.resolved_on)}")
            else:
                lines.append(f"unresolved = {_q(pin.unresolved)}")
            lines.append("")
    return "\n".join(lines)


def save_lock(lock: Mapping[str, Mapping[str, Pin]], path: Path | None = None) -> bool:
    """Write the lock atomically; leave the file untouched (bytes and mtime) when nothing changed.
    Returns whether it wrote."""
    path = path or LOCK_PATH
    text = dump_lock(lock)
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ConfigError(str(path), [Problem("(file)", f"cannot be written ({e.strerror})")]) from None
    return True


# -- resolving (needs the network) ---------------------------------------------
Resolver = Callable[[Target, str], str]


def refresh(target: Target, lock: dict[str, dict[str, Pin]], *, resolvers: Mapping[str, Resolver],
            patch_files: Mapping[str, Path] | None = None,
            today: str | None = None) -> list[str]:
    """Try to resolve every pin of a target; keep old values where resolving fails.

    Returns one report line per pin. A failed resolution never erases a value
    that was resolved before: an outage must not unpin a working build.
    """
    today = today or _dt.date.today().isoformat()
    patch_files = patch_files or {}
    current = pins_for(target, lock)
    have = lock.get(target.name, {})
    for key in optional_pins(target):
        current[key] = have.get(key, Pin(key, None, unresolved="not yet checked"))
    report: list[str] = []
    for key, pin in current.items():
        try:
            if key.startswith("patch.") and key.split(".", 1)[1] in patch_files:
                f = patch_files[key.split(".", 1)[1]]
                value, source = sha256_file(f), f"sha256 of the user-supplied file {f.name}"
            else:
                resolver = resolvers.get(key) or resolvers[key.split(".")[0]]
                value, source = resolver(target, key).split("|", 1)
            err = _validate_value(key, value)
            if err:
                raise ValueError(f"resolver returned {value!r}: {err}")
            if (pin.value, pin.source) != (value, source):
                # resolved_on says when the value last changed: a refresh that finds the same
                # value leaves the pin, and so the file, as it was.
                current[key] = Pin(key, value, source, today)
            report.append(f"{key}: {value} ({source})")
        except Exception as e:  # noqa: BLE001 - every failure is reported per pin
            note = f"{type(e).__name__}: {e}"
            if pin.resolved:
                report.append(f"{key}: kept {pin.value} (refresh failed: {note})")
            else:
                if _without_date(pin.unresolved) != note:
                    current[key] = replace(pin, unresolved=f"{note} (on {today})")
                report.append(f"{key}: UNRESOLVED ({note})")
    lock[target.name] = current
    return report


def _without_date(unresolved: str) -> str:
    """An unresolved note as refresh() wrote it, less its trailing " (on YYYY-MM-DD)"."""
    return re.sub(r" \(on \d{4}-\d{2}-\d{2}\)$", "", unresolved)


def git_commit_resolver(target: Target, key: str) -> str:
    out = subprocess.run(["git", "ls-remote", "--", target.source.url, f"refs/heads/{target.source.branch}"],
                         capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"git ls-remote failed: {out.stderr.strip()[:200]}")
    line = out.stdout.split()
    if not line:
        raise RuntimeError(f"branch {target.source.branch} not found at {target.source.url}")
    return f"{line[0]}|git ls-remote {target.source.url} refs/heads/{target.source.branch}"
