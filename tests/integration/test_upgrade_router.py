"""`python build.py upgrade --target router`: the router's smg moved like any PyPI-pinned engine, against
the real pypi.org (issue 37 item 13). It failed with `KeyError: 'router'`, then refused; with --snapshot
it labelled the image with a version while supervisor/router-requirements.txt (what the image installs)
still pinned the old one.

What is real: PyPI's smg releases (on 2026-12-05 the newest is 1.13.0, the pinned one, so the only move
there is to test is to 1.12.0, a step back: the path is the same), each version's `smg launch --help`
printed by its own wheel (installed into Kiln's cache, no GPU needed: smg is a router), the hashed
requirements pip resolves. One pin moves everywhere: images/targets/router.toml [source], its lock
pin, supervisor/router-requirements.txt and pyproject.toml's extras. The sandbox copies them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import requests

from images.build import render
from images.cli import app
from images.pins import requirements
from images.pins.lock import load_lock, pins_for
from images.target import load_target
from images.upgrade import engine as upgrade
from tests.integration.test_upgrade import cache, isolate, state  # noqa: F401 (cache: one Kiln cache, PyPI checked)

ROOT = Path(__file__).resolve().parents[2]
OLD, NEW = "1.13.0", "1.12.0"
WHEEL = "smg-{v}-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"

pytestmark = pytest.mark.slow


def pypi_sha(version: str) -> str:
    r = requests.get("https://pypi.org/simple/smg/", headers={"Accept": "application/vnd.pypi.simple.v1+json"},
                     timeout=30)
    r.raise_for_status()
    return next(f["hashes"]["sha256"] for f in r.json()["files"] if f["filename"] == WHEEL.format(v=version))


@pytest.fixture
def sandbox(tmp_path, monkeypatch, cache):
    targets = tmp_path / "targets"
    shutil.copytree(ROOT / "images" / "targets", targets)
    root = isolate(tmp_path, monkeypatch, cache, targets)
    for name, src in (("router-requirements.txt", ROOT / "supervisor" / "router-requirements.txt"),
                      ("pyproject.toml", ROOT / "pyproject.toml")):
        shutil.copy2(src, root / name)
    monkeypatch.setattr(upgrade, "ROUTER_REQUIREMENTS", root / "router-requirements.txt", raising=False)
    monkeypatch.setattr(upgrade, "PYPROJECT", root / "pyproject.toml", raising=False)
    monkeypatch.setattr(render, "ROUTER_REQUIREMENTS", root / "router-requirements.txt")
    return root


def test_the_router_moves_with_its_own_parser_and_one_pin_moves_everywhere(sandbox, capsys):
    before = state(sandbox)
    rc = app.main(["upgrade", "--target", "router", "--to", NEW, "--dry-run"])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert state(sandbox) == before                                     # --dry-run: nothing written
    assert f"smg {OLD} -> {NEW}" in out or f"{OLD} -> {NEW}" in out
    assert "`--discovery-file`" in out                                  # in 1.13.0's parser, not in 1.12.0's
    assert "Clean" in out and "router.toml" in out

    rc = app.main(["upgrade", "--target", "router", "--to", NEW])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    target = load_target("router", sandbox / "targets")
    assert (target.source.version, target.source.filename) == (NEW, WHEEL.format(v=NEW))
    sha = pypi_sha(NEW)
    pins = load_lock()["router"]
    assert pins["source.sha256"].value == sha
    text = (sandbox / "router-requirements.txt").read_text()
    assert requirements.pinned(text)["smg"] == NEW and f"--hash=sha256:{sha}" in text
    assert f'"smg=={NEW}"' in (sandbox / "pyproject.toml").read_text()
    assert f"smg=={OLD}" not in (sandbox / "pyproject.toml").read_text()
    # the image this renders labels the version it installs
    dockerfile = render.render_dockerfile(render.make_context(target, pins_for(target, load_lock())))
    assert f'io.kiln.engine.source="pypi:smg=={NEW}"' in dockerfile


def test_a_version_pypi_does_not_have_is_refused_and_nothing_is_labelled_with_it(sandbox, capsys, tmp_path):
    # the case: --snapshot 1.14.0=FILE labelled the image smg 1.14.0 while it installed 1.13.0
    help_file = tmp_path / "smg-help.txt"
    help_file.write_text("usage: smg [-h] [--host HOST]\n\noptions:\n  -h, --help  show this help\n"
                         "  --host HOST  the host (default: 127.0.0.1)\n")
    before = state(sandbox)
    rc = app.main(["upgrade", "--target", "router", "--to", "1.14.0", "--snapshot", f"1.14.0={help_file}",
                   "--snapshot", f"{OLD}={help_file}"])
    out, err = capsys.readouterr()
    assert rc == 2 and "--to 1.14.0" in err and "smg" in err and OLD in err
    assert state(sandbox) == before


def test_an_image_whose_router_pin_and_requirements_disagree_is_not_rendered(sandbox):
    req = sandbox / "router-requirements.txt"
    req.write_text(re.sub(r"^smg==\S+", f"smg=={NEW}", req.read_text(), flags=re.M))   # hand-edited, say
    target = load_target("router", sandbox / "targets")
    with pytest.raises(Exception) as e:
        render.make_context(target, pins_for(target, load_lock()))
    said = str(e.value)
    assert f"smg=={NEW}" in said and OLD in said and "generate --only router-requirements" in said
