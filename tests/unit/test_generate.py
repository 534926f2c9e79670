"""`python build.py generate [--check]`: one command writes every committed generated file, one check
verifies them all (docker-library's apply-templates + verify-templating); drift, files no source makes
any more, and what could not be checked here are each named with the command that fixes them."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from images.generate import families as generate
from images.cli import app
from images.cli.reference import render as render_reference
from images.runpod import vendor
from images.paths import RUNPOD_SCHEMA

ROOT = Path(__file__).resolve().parents[2]
OFFLINE = ("rendered", "cli-reference", "module-map", "tests-map", "engine-facts", "runpod-schema")   # requirements asks pip's index


def build_py(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "build.py"), *args], capture_output=True, text=True, cwd=ROOT)


def test_every_family_is_listed_and_the_committed_files_have_not_drifted():
    names = [f.name for f in generate.families(lambda: "")]
    assert names == ["rendered", "cli-reference", "module-map", "tests-map", "engine-facts", "requirements", "router-requirements",
                     "runpod-schema"]
    r = build_py("generate", "--check", *(a for n in OFFLINE for a in ("--only", n)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "generate: every generated file matches its source" and r.stderr == ""


def _family(tmp: Path, files: dict[str, str], **kw) -> generate.Family:
    return generate.Family("demo", lambda: {tmp / k: v for k, v in files.items()}, **kw)


def _say(report: generate.Report, **kw) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = generate.say(report, out=out, err=err, **kw)
    return rc, out.getvalue(), err.getvalue()


def test_check_names_each_drifted_file_and_the_fix_and_writes_nothing(tmp_path):
    (tmp_path / "a.txt").write_text("old\n")
    fam = _family(tmp_path, {"a.txt": "new\n", "b.txt": "b\n", "same.txt": "same\n"})
    (tmp_path / "same.txt").write_text("same\n")
    report = generate.run((fam,), check=True)
    assert [p.name for p, _ in report.drifted] == ["a.txt", "b.txt"] and report.written == []
    assert (tmp_path / "a.txt").read_text() == "old\n" and not (tmp_path / "b.txt").exists()
    rc, _, err = _say(report, check=True, only=True)
    assert rc == 1
    assert f"  {tmp_path / 'a.txt'}  (fix: python build.py generate --only demo)" in err.splitlines()


def test_generate_writes_only_what_drifted_then_check_passes(tmp_path):
    (tmp_path / "same.txt").write_text("same\n")
    before = (tmp_path / "same.txt").stat().st_mtime_ns
    fam = _family(tmp_path, {"d/new.txt": "new\n", "same.txt": "same\n"})
    report = generate.run((fam,), check=False)
    assert report.written == [tmp_path / "d" / "new.txt"] and (tmp_path / "same.txt").stat().st_mtime_ns == before
    assert _say(report, check=False, only=False)[0] == 0
    assert generate.run((fam,), check=True).ok


def test_a_file_no_source_makes_any_more_is_named_never_deleted(tmp_path):
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "Dockerfile").write_text("x\n")
    (tmp_path / "gone").mkdir()
    (tmp_path / "gone" / "Dockerfile").write_text("y\n")
    fam = _family(tmp_path, {"kept/Dockerfile": "x\n"}, owns=((tmp_path, "*/Dockerfile"),))
    report = generate.run((fam,), check=False)
    rc, _, err = _say(report, check=False, only=False)
    assert rc == 1 and (tmp_path / "gone" / "Dockerfile").exists()
    assert f"generate: {tmp_path / 'gone' / 'Dockerfile'}: no source generates it any more (demo); remove it (git rm)" \
        in err.splitlines()


def test_what_cannot_be_checked_here_is_named_and_fails_the_check(tmp_path):
    def offline() -> dict[Path, str]:
        raise generate.Unavailable("pip could not download the pinned wheels (no index)")

    ok = _family(tmp_path, {"a.txt": "a\n"})
    (tmp_path / "a.txt").write_text("a\n")
    report = generate.run((ok, generate.Family("requirements", offline)), check=True)
    rc, _, err = _say(report, check=True, only=False)
    assert rc == 1 and report.drifted == []
    assert err.strip() == ("generate: requirements NOT checked: pip could not download the pinned wheels (no index); "
                           "run `python build.py generate --only requirements --check` where that is reachable")


def test_the_cli_reference_family_renders_the_parser_build_py_runs():
    assert "generate" in [c.name for c in app.COMMANDS]
    cli_reference = next(f for f in generate.families(lambda: render_reference(app.parser()))
                         if f.name == "cli-reference")
    ((path, text),) = cli_reference.files().items()
    assert path == ROOT / "docs" / "cli.md" and text == path.read_text(encoding="utf-8")
    assert "## `python build.py generate`" in text and "## `python build.py pods up`" in text


def test_the_vendored_runpod_schema_is_checked_to_be_a_closed_excerpt():
    doc = json.loads(RUNPOD_SCHEMA.read_text(encoding="utf-8"))
    assert vendor.excerpt_problems(doc) == []
    doc["components"]["schemas"]["Unreached"] = {"type": "object"}
    del doc["paths"]["/v2/pods"]["post"]
    assert vendor.excerpt_problems(doc) == ["operations Kiln calls are missing: POST /v2/pods"]
    doc = json.loads(RUNPOD_SCHEMA.read_text(encoding="utf-8"))
    doc["components"]["schemas"]["Unreached"] = {"type": "object"}
    assert vendor.excerpt_problems(doc) == ["components.schemas nothing reaches: Unreached"]
    doc = json.loads(RUNPOD_SCHEMA.read_text(encoding="utf-8"))
    del doc["components"]["schemas"]["Pod"]
    assert vendor.excerpt_problems(doc) == ["a $ref reaches 'Pod', which the file does not hold"]


def test_the_router_image_installs_the_smg_its_target_pins():
    # issue 37 item 13: the pin was hard-coded beside the target's, and could differ from it
    from images.pins import requirements
    from images.target import load_target

    src = load_target("router").source
    assert requirements.router_top_level() == (f"{src.package}=={src.version}",)
    assert f"{src.package}=={src.version}" in (ROOT / "supervisor" / "router-requirements.txt").read_text()
