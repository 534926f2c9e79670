"""The committed renders of every target: images/rendered/<target>/Dockerfile and
images/rendered/<target>/runpod-template.json (the RunPod template, images/runpod/template.py).

Reviewers read the real Dockerfile and template diffs, not a template-code diff
(docker-library's practice); tests re-render every target and fail on any drift.

    python build.py generate --only rendered          # rewrite them (plain `generate`: every generated file)
    python build.py generate --only rendered --check  # exit 1 on drift
"""

from __future__ import annotations

from pathlib import Path

from ..pins.lock import load_lock, pins_for
from ..runpod.template import build_template
from ..paths import RENDERED_DIR
from ..build.render import make_context, render_dockerfile
from ..target import load_target, target_names


def render_all() -> dict[str, str]:
    lock = load_lock()
    out: dict[str, str] = {}
    for name in target_names():
        target = load_target(name)
        # A target with unresolved pins is committed as its floating render, and says so at the top.
        ctx = make_context(target, pins_for(target, lock), allow_floating=True)
        out[name] = render_dockerfile(ctx)
    return out


TEMPLATE_FILE = "runpod-template.json"


def render_templates() -> dict[str, str]:
    """Each target's RunPod template as `build.py template --target T` prints it."""
    lock = load_lock()
    return {name: build_template(load_target(name), pins_for(load_target(name), lock)).to_json()
            for name in target_names()}


def generated() -> dict[Path, str]:
    out = {RENDERED_DIR / name / "Dockerfile": text for name, text in render_all().items()}
    out.update({RENDERED_DIR / name / TEMPLATE_FILE: text for name, text in render_templates().items()})
    return out
