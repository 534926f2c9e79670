"""The supervisor's TCP relay (RunPod's TCP port) and its host-vCPU warning, with the real server."""

from __future__ import annotations

import json

import pytest

from kiln_dev.engine import require_prefix
from kiln_dev.models import make_tiny_gguf
from kiln_dev.supervised import Supervised, config, free_port, http, wait_for

pytestmark = pytest.mark.llama


def test_the_tcp_port_reaches_the_engine_and_a_cpu_bound_placement_is_warned(tmp_path):
    prefix = require_prefix()
    model = make_tiny_gguf(tmp_path / "tiny.gguf")
    port, sport, tport = free_port(), free_port(), free_port()
    rungs = '[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "512"]\n'
    text = config(binary=str(prefix / "bin/llama-server"), model=str(model), port=port, status_port=sport,
                  state_dir=tmp_path / "state", rungs=rungs,
                  # a threshold no real host meets for this tiny model: the warning must fire
                  extra="[hardware]\nwarn_vcpu_per_host_gib = 1000000\n",
                  snapshot=str(prefix / "share/kiln/llama-server.help.txt"))
    with Supervised(tmp_path, text, env={"KILN_API_KEY": "tcp-key", "KILN_TCP_PORT": str(tport)}) as sup:
        sup.wait_state("SERVING")
        # The lifecycle checks host residency just after it reports SERVING: wait for the warning.
        st = wait_for(lambda: (s := sup.status()) and any("host CPU will likely bound decode" in w
                                                          for w in s["warnings"]) and s, 10, "the vCPU warning")
        body = json.dumps({"prompt": "hi", "n_predict": 4}).encode()
        code, out = http(f"http://127.0.0.1:{tport}/completion", data=body,
                         headers={"Content-Type": "application/json", "Authorization": "Bearer tcp-key"})
        assert code == 200 and json.loads(out)["tokens_predicted"] == 4
        assert any("host CPU will likely bound decode" in w for w in st["warnings"])
        assert st["placement_estimate"]["host_resident_gib"] > 0
        assert sup.stop() == 0
    assert http(f"http://127.0.0.1:{tport}/health")[0] == 0          # the relay went with it
