"""Every committed generated file: what writes it, and the one check that verifies them all.

    python build.py generate                 rewrite every generated file that drifted
    python build.py generate --check         write nothing; exit 1 naming each drifted file
    python build.py generate --only NAME     just that family (repeatable)

docker-library's apply-templates.sh + verify-templating, for Kiln. The families (FAMILIES):

  rendered       images/rendered/<target>/Dockerfile and runpod-template.json    images/generate/golden.py
  cli-reference  docs/cli.md, from the parsers' --help                           images/cli/reference.py
  module-map     docs/architecture.md's module map, from each module's docstring  images/generate/module_map.py
  tests-map      tests/README.md's map: each module and the test files importing it images/generate/tests_map.py
  engine-facts   images/engine-facts/<package>-<version>.json                    images/generate/facts.py
                 (reads each pinned llama.cpp sdist: Kiln's cache, else a download)
  requirements   supervisor/requirements.txt, every wheel hashed                 images/pins/requirements.py
                 (pip downloads the wheels: needs the package index)
  router-requirements  supervisor/router-requirements.txt: the router's smg and     images/pins/requirements.py
                 what it needs beyond the supervisor's pins, every wheel hashed
  runpod-schema  images/schemas/runpod-rest-v2.json is vendored, not generated: `python -m images.runpod.vendor
                 OPENAPI.json ...` rewrites it from RunPod's document; here it is only checked to be a closed
                 excerpt (images/runpod/vendor.py excerpt_problems)

A family whose inputs are not here (no network for a download, no package index) raises
Unavailable: it is reported by name with the reason, never passed over in silence, and makes
--check exit 1 as drift does (`--only` the others checks what can be checked offline). A file in a
directory a family owns that no source generates any more is reported too (remove it by hand:
nothing here deletes a file).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import requests

from supervisor.errors import KilnError

from . import facts as facts_generator, golden, module_map, tests_map
from ..paths import DOCS_CLI, ENGINE_FACTS_DIR, RENDERED_DIR, REPO_ROOT, ROUTER_REQUIREMENTS, RUNPOD_SCHEMA, SUPERVISOR_REQUIREMENTS
from ..pins import requirements
from ..runpod import vendor

FIX = "python build.py generate"


class Unavailable(KilnError):
    """What a family is generated from cannot be had here; the message says what and why."""


@dataclass(frozen=True)
class Family:
    name: str
    files: Callable[[], dict[Path, str]] | None   # path -> the text it must hold; raises Unavailable
    owns: tuple[tuple[Path, str], ...] = ()        # (directory, glob): every match must be generated
    check: Callable[[], list[str]] | None = None   # a vendored file's own check: problems, [] when sound


@dataclass
class Report:
    written: list[Path]
    drifted: list[tuple[Path, str]]             # (path, family)
    stale: list[tuple[Path, str]]
    problems: list[tuple[str, str]]             # (family, problem)
    unavailable: list[tuple[str, str]]          # (family, why)

    @property
    def ok(self) -> bool:
        return not (self.drifted or self.stale or self.problems or self.unavailable)


def _engine_facts() -> dict[Path, str]:
    try:
        return facts_generator.generated()
    except requests.RequestException as e:
        raise Unavailable(f"a pinned llama.cpp sdist is not in Kiln's cache and could not be downloaded ({e})") from e


def _requirements() -> dict[Path, str]:
    current = SUPERVISOR_REQUIREMENTS.read_text(encoding="utf-8") if SUPERVISOR_REQUIREMENTS.is_file() else None
    try:
        return {SUPERVISOR_REQUIREMENTS: requirements.lock(current)}
    except requirements.PipFailed as e:
        raise Unavailable(f"pip could not download the pinned wheels from its package index ({e})") from e


def _router_requirements() -> dict[Path, str]:
    current = ROUTER_REQUIREMENTS.read_text(encoding="utf-8") if ROUTER_REQUIREMENTS.is_file() else None
    try:
        return {ROUTER_REQUIREMENTS: requirements.lock(
            current, top_level=requirements.router_top_level(), base=SUPERVISOR_REQUIREMENTS.read_text(encoding="utf-8"),
            what="the router's smg and its deps")}
    except requirements.PipFailed as e:
        raise Unavailable(f"pip could not download the pinned wheels from its package index ({e})") from e


def _runpod_schema() -> list[str]:
    try:
        return vendor.excerpt_problems(json.loads(RUNPOD_SCHEMA.read_text(encoding="utf-8")))
    except (OSError, ValueError) as e:
        return [f"cannot be read as JSON ({e})"]


def families(cli_reference: Callable[[], str]) -> tuple[Family, ...]:
    """Every family. `cli_reference` renders docs/cli.md: the CLI passes it in (the CLI imports this
    module, so this module cannot import the CLI's parser)."""
    return (
        Family("rendered", golden.generated, owns=((RENDERED_DIR, "*/*"),)),
        Family("cli-reference", lambda: {DOCS_CLI: cli_reference()}),
        Family("module-map", module_map.generated),
        Family("tests-map", tests_map.generated),
        Family("engine-facts", _engine_facts, owns=((ENGINE_FACTS_DIR, "*.json"),)),
        Family("requirements", _requirements),
        Family("router-requirements", _router_requirements),
        Family("runpod-schema", None, check=_runpod_schema),      # vendored: checked, never written
    )


def run(chosen: tuple[Family, ...], *, check: bool) -> Report:
    report = Report([], [], [], [], [])
    for fam in chosen:
        try:
            files = fam.files() if fam.files else {}
        except Unavailable as e:
            report.unavailable.append((fam.name, str(e)))
            continue
        for path, text in files.items():
            if path.is_file() and path.read_text(encoding="utf-8") == text:
                continue
            if check:
                report.drifted.append((path, fam.name))
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
                report.written.append(path)
        for directory, pattern in fam.owns:
            report.stale += [(p, fam.name) for p in sorted(directory.glob(pattern)) if p.is_file() and p not in files]
        if fam.check is not None:
            report.problems += [(fam.name, p) for p in fam.check()]
    return report


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def _fix(name: str, only: bool) -> str:
    return f"{FIX} --only {name}" if only else FIX


def say(report: Report, *, check: bool, only: bool, out=sys.stdout, err=sys.stderr) -> int:
    """Print what happened; the exit status (0 all generated / all current, 1 otherwise)."""
    for p in report.written:
        print(f"wrote {_rel(p)}", file=out)
    if report.drifted:
        print(f"generate --check: {len(report.drifted)} generated file(s) drifted from their sources:", file=err)
        for p, fam in report.drifted:
            print(f"  {_rel(p)}  (fix: {_fix(fam, only)})", file=err)
    for p, fam in report.stale:
        print(f"generate: {_rel(p)}: no source generates it any more ({fam}); remove it (git rm)", file=err)
    for fam, problem in report.problems:
        if fam == "runpod-schema":
            print(f"generate: {_rel(RUNPOD_SCHEMA)}: {problem}; rewrite it from RunPod's document with "
                  "`python -m images.runpod.vendor OPENAPI.json --commit SHA --date D`", file=err)
        else:
            print(f"generate: {fam}: {problem}", file=err)
    for fam, why in report.unavailable:
        verb = "checked" if check else "regenerated"
        print(f"generate: {fam} NOT {verb}: {why}; run `{_fix(fam, True)}{' --check' if check else ''}` where "
              "that is reachable", file=err)
    if report.ok and not report.written:
        print("generate: every generated file matches its source", file=out)
    return 0 if report.ok else 1
