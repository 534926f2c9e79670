"""The router's smg has one pin (images/targets/router.toml [source]), and every place that names it
reads it or is written from it (issue 37 item 13): the hashed requirements the image installs, its lock
pin, pyproject.toml's extras (a checkout's smg) and the launcher's "Kiln pins X" check."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from images.paths import ROUTER_REQUIREMENTS
from images.pins.requirements import pinned, router_pin_problem
from images.target import load_target
from supervisor.router import launch

ROOT = Path(__file__).resolve().parents[2]


def test_every_place_that_names_the_routers_smg_names_the_targets_version():
    src = load_target("router").source
    assert pinned(ROUTER_REQUIREMENTS.read_text())["smg"] == src.version
    assert launch.pinned() == src.version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = [r for extra in project.values() for r in extra if re.match(r"smg\b", r)]
    assert named and all(r == f"smg=={src.version}" for r in named), named
    assert router_pin_problem(src.version, "smg", ROUTER_REQUIREMENTS.read_text()) is None


def test_a_router_image_whose_requirements_pin_another_smg_is_named_with_the_fix():
    said = router_pin_problem("1.12.0", "smg", "smg==1.13.0 \\\n    --hash=sha256:00\n")
    assert "1.12.0" in said and "smg==1.13.0" in said and "generate --only router-requirements" in said
