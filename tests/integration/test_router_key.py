"""A router whose replicas refuse its key (issue 37 item 10): `build.py router` without KILN_API_KEY
made up a key the replicas could not accept, routed nothing, and /status said SERVING with `routed 0`
while /ready said 503. Now the CLI requires the replicas' key, and a supervised router whose replicas
all refuse its key is FAILED with that cause (a real llama-server with its own key, the real smg)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kiln_dev.engine import require_prefix
from kiln_dev.llama_server import LlamaServer
from kiln_dev.models import make_tiny_gguf
from kiln_dev.router import KEY, router_config, router_python
from kiln_dev.supervised import REPO_ROOT, Supervised, free_port, http

pytestmark = [pytest.mark.llama, pytest.mark.slow]


def test_the_cli_requires_the_replicas_key(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)}
    argv = [sys.executable, "build.py", "router", "--replicas", "http://127.0.0.1:9", "--print-config",
            "--state-dir", str(tmp_path / "state"), "--router-python", sys.executable]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=120)
    assert out.returncode == 2 and "KILN_API_KEY is not set" in out.stderr, out.stdout + out.stderr
    assert "kiln_api_key" in out.stderr and "--no-api-key" in out.stderr and out.stdout == ""
    assert not (tmp_path / "state").exists()
    fine = subprocess.run(argv + ["--no-api-key"], capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=120)
    assert fine.returncode == 0 and 'api_key = "none"' in fine.stdout, fine.stderr


def test_a_router_whose_replicas_refuse_its_key_is_failed_with_that_cause(tmp_path):
    router_python()
    with LlamaServer(require_prefix(), make_tiny_gguf(tmp_path / "tiny.gguf"), api_key=KEY) as replica:
        text = router_config(tmp_path, port=free_port(), status_port=free_port(), metrics_port=free_port(),
                             replicas=[(replica.url, replica.url + "/health")])
        with Supervised(tmp_path, text, env={"KILN_API_KEY": "not-the-replicas-key-7d21"}) as router:
            st = router.wait_state("FAILED", "SERVING", timeout=120)
            assert st["state"] == "FAILED", json.dumps(st)[:2000]
            failure = st["last_failure"]
            assert failure["class"] == "config_rejected" and "key" in failure["reason"], failure
            assert failure["evidence"].startswith("kiln router: no replica accepts the router's key"), failure
            log = router.log()
            assert f"{replica.url} answered 401" in log and "not-the-replicas-key-7d21" not in log
            assert http(router.url("/ready"))[0] == 503
