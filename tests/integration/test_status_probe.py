"""/ready from the Record's probe: the same answers as from a snapshot, without copying and
redacting the whole record for every probe (P2b: a load balancer's probe once a second)."""

from __future__ import annotations

import http.client

from supervisor.failure import Failure, FailureClass
from supervisor.run.runtime import Runtime
from supervisor.lifecycle.state import State
from supervisor.run.record import Record
from supervisor.redact import Secrets
from supervisor.status.server import StatusServer, ready_text


def get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def test_ready_is_answered_from_the_probe_alone_and_agrees_with_the_snapshot():
    rec = Record("t")
    calls = {"snapshot": 0}

    def snapshot():
        calls["snapshot"] += 1
        return rec.snapshot()

    server = StatusServer("127.0.0.1", 0, snapshot, probe=rec.probe)
    server.start()
    try:
        rt = Runtime(env={}, state_dir=None, rec=rec, secrets=Secrets(), hardware_probe=None, gpu_used=None)
        for step in ("preflight", "failed", "serving"):
            if step == "failed":
                rec.transition(State.FETCH)
                rt.record_failure(Failure(FailureClass.OOM, "CUDA out of memory", rung="big"))
                rec.transition(State.LAUNCHING, "big")
            elif step == "serving":
                rec.transition(State.LOADING)
                rec.transition(State.HEALTHY)
                rec.transition(State.SERVING, "big")
            answer = get(server.port, "/ready")
            assert answer == ready_text(rec.snapshot()), step
        assert answer == (200, "ready\n")
        assert calls["snapshot"] == 0
        assert get(server.port, "/status")[0] == 200 and calls["snapshot"] == 1
    finally:
        server.stop()
