"""The TCP relay (RunPod's TCP port, which skips the ~125 s HTTP proxy) in front of the real
llama-server: requests, streaming and the engine's own API key pass through unchanged."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from kiln_dev import children
from kiln_dev.engine import require_prefix
from kiln_dev.models import make_tiny_gguf
from kiln_dev.supervised import free_port, http, wait_for
from supervisor.relay import TcpRelay

pytestmark = pytest.mark.llama


@pytest.fixture
def server(tmp_path):
    prefix = require_prefix()
    model = make_tiny_gguf(tmp_path / "tiny.gguf")
    port = free_port()
    key = tmp_path / "key"
    key.write_text("relay-key\n")
    p = children.spawn([prefix / "bin/llama-server", "-m", model, "--host", "127.0.0.1", "--port", str(port),
                        "-t", "1", "-c", "512", "--api-key-file", key],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: http(f"http://127.0.0.1:{port}/health")[0] == 200, 30, "llama-server")
        yield port
    finally:
        children.stop(p, 10)


def test_requests_and_streams_pass_through_with_the_key_still_required(server):
    relay = TcpRelay("127.0.0.1", 0, "0.0.0.0", server)
    relay.start()
    try:
        base = f"http://127.0.0.1:{relay.port}"
        assert http(f"{base}/health")[0] == 200
        body = json.dumps({"prompt": "hi", "n_predict": 8}).encode()
        assert http(f"{base}/completion", data=body, headers={"Content-Type": "application/json"})[0] == 401
        code, out = http(f"{base}/completion", data=body, headers={"Content-Type": "application/json",
                                                                 "Authorization": "Bearer relay-key"})
        assert code == 200 and json.loads(out)["tokens_predicted"] == 8
        stream = json.dumps({"prompt": "hi", "n_predict": 8, "stream": True}).encode()
        code, out = http(f"{base}/completion", data=stream, headers={"Content-Type": "application/json",
                                                                   "Authorization": "Bearer relay-key"})
        assert code == 200 and out.count(b"data: ") >= 8
    finally:
        relay.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", relay.port), timeout=2).recv(1)


def test_an_engine_that_is_not_up_yet_closes_the_connection_cleanly():
    relay = TcpRelay("127.0.0.1", 0, "127.0.0.1", free_port())
    relay.start()
    try:
        assert http(f"http://127.0.0.1:{relay.port}/health")[0] == 0
    finally:
        relay.stop()
