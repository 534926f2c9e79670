"""`python build.py router --replicas URL...` in front of plain OpenAI-compatible servers (two real
llama-servers, no Kiln supervisor: their readiness is their own /health): the same supervised router,
one key, one URL; a server that stops answering leaves it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from kiln_dev import children
from kiln_dev.engine import require_prefix
from kiln_dev.llama_server import LlamaServer
from kiln_dev.models import smollm2_gguf
from kiln_dev.router import KEY, router_python
from kiln_dev.supervised import REPO_ROOT, free_port, http, wait_for

pytestmark = [pytest.mark.llama, pytest.mark.slow]


def test_the_cli_runs_the_supervised_router_in_front_of_plain_servers(tmp_path):
    python = router_python()
    prefix, model = require_prefix(), smollm2_gguf()
    with LlamaServer(prefix, model, api_key=KEY) as a, LlamaServer(prefix, model, api_key=KEY) as b:
        port, sport = free_port(), free_port()
        argv = [sys.executable, "build.py", "router", "--replicas", a.url, b.url, "--port", str(port),
                "--status-port", str(sport), "--metrics-port", str(free_port()),
                "--engine-port", str(free_port()), "--poll-s", "0.5",
                "--state-dir", str(tmp_path / "state"), "--router-python", python]
        log = open(tmp_path / "router.log", "w")
        proc = children.spawn(argv, death_signal=signal.SIGTERM, start_new_session=False, stdout=log,
                              stderr=subprocess.STDOUT, env={"KILN_API_KEY": KEY, "PATH": "/usr/bin:/bin"},
                              cwd=REPO_ROOT)
        try:
            def status() -> dict:
                code, body = http(f"http://127.0.0.1:{sport}/status", timeout=2)
                return json.loads(body) if code == 200 else {}

            wait_for(lambda: http(f"http://127.0.0.1:{sport}/ready")[0] == 200, 120, "the router ready")
            # /ready needs one replica routed; the second may join a round later on a loaded machine
            wait_for(lambda: status().get("router", {}).get("routed") == 2, 30, "both servers routed")
            model_id = json.loads(http(f"http://127.0.0.1:{port}/v1/models")[1])["data"][0]["id"]
            body = json.dumps({"model": model_id, "messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 4}).encode()
            ask = lambda key: http(f"http://127.0.0.1:{port}/v1/chat/completions", data=body, timeout=60,  # noqa: E731
                                   headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
            assert ask(KEY)[0] == 200 and ask("WRONG")[0] == 401
            a.__exit__(None, None, None)                   # a server stops answering: it leaves the router
            wait_for(lambda: status().get("router", {}).get("routed") == 1, 10, "the stopped server to leave")
            assert all(ask(KEY)[0] == 200 for _ in range(3))
            st = status()
            assert st["state"] == "SERVING" and st["engine"]["argv"][2] == "supervisor.router.launch"
            assert KEY not in json.dumps(st)
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(30)
            log.close()
        out = (tmp_path / "router.log").read_text()
        assert rc == 0, out
        assert KEY not in out and "replica http://127.0.0.1" in out
        assert (tmp_path / "state" / "deploy.toml").is_file()
