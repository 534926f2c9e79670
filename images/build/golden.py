"""The committed generated files: images/rendered/<target>/Dockerfile and
images/rendered/<target>/runpod-template.json (the RunPod template, images/runpod/template.py).

Reviewers read the real Dockerfile and template diffs, not a template-code diff
(docker-library's practice); tests re-render every target and fail on any drift.

    python -m images.build.golden          # rewrite them
    python -m images.build.golden --check  # exit 1 on drift
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..pins.lock import load_lock, pins_for
from ..runpod.template import build_template
from ..paths import RENDERED_DIR
from .render import make_context, render_dockerfile
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


def sync(files: dict[Path, str], *, check: bool, fix: str) -> int:
    """Write generated files, or with check=True report the drifted ones (exit 1) naming `fix`."""
    drift = []
    for path, text in files.items():
        if check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                drift.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(path)
    if drift:
        print(f"generated files drifted from their sources; run `{fix}`:\n  " + "\n  ".join(drift), file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m images.build.golden", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    return sync(generated(), check=args.check, fix="python -m images.build.golden")


if __name__ == "__main__":
    sys.exit(main())
