"""Two no-cache builds of the cpu-llamacpp image on the local Docker engine give the same layers for
everything Kiln writes: the supervisor's venv, the engine, the supervisor and its configs.

Real builds (`build.py build --no-cache`, BuildKit in Docker 20.10, FROM the registry-free base, the
engine tarball this machine compiled), compared by diff_id with images/build/layers.py.
kiln_dev/image_rebuild.py keeps the outcome in the Kiln cache keyed by the build context, the engine
tarball, the base image and the engine version: a warm run checks the two images are still there with
the recorded layers and builds nothing. The apt layer is not Kiln's and differs on this builder
(docs/images.md, "Rebuild and compare"): the test records it and asserts nothing about it.
"""

from __future__ import annotations

import json

import pytest

from kiln_dev.image_rebuild import image_record

pytestmark = [pytest.mark.docker, pytest.mark.llama, pytest.mark.slow]


@pytest.fixture(scope="module")
def record() -> dict:
    rec = image_record("cpu-llamacpp")
    print(json.dumps({"cache": rec["cache"], "builds": rec["builds"],
                      "rows": [{k: r[k] for k in ("index", "kiln", "same", "differences", "created_by")}
                               for r in rec["rows"]]}, indent=2))
    return rec


def test_every_layer_kiln_writes_is_the_same_after_a_no_cache_rebuild(record):
    kiln = [r for r in record["rows"] if r["kiln"]]
    assert len(kiln) == 3, [r["created_by"] for r in record["rows"]]     # venv, engine, supervisor + configs
    differing = [r for r in kiln if not r["same"]]
    assert not differing, "\n".join(f"layer {r['index']} ({r['created_by']}): {r['first']} vs {r['second']}\n  "
                                    + "\n  ".join(r["shown"]) for r in differing)


def test_the_layers_that_differ_are_the_package_managers_only(record):
    others = [r for r in record["rows"] if not r["same"] and not r["kiln"]]
    assert all("apt-get" in r["created_by"] for r in others), [r["created_by"] for r in others]
    assert record["rows"][0]["same"]          # the base image's layer, untouched
