"""The selftest through the real supervisor and a real llama-server: HEALTHY -> SELFTEST ->
SERVING only on a pass; a fail is `selftest_failed`, which the ladder acts on like any failure."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from kiln_dev.engine import require_prefix
from kiln_dev.models import make_tiny_gguf, smollm2_gguf
from kiln_dev.supervised import Supervised, config, free_port, http, wait_for

pytestmark = [pytest.mark.llama, pytest.mark.slow]
CANARY = "kiln-selftest-canary-9d41"
# SmolLM2's tokenizer: " #" is token 907 (llama-server /tokenize). A large bias on it makes greedy
# decoding write " # # # #": the field notes' output after halving Kimi-K3's experts, from a real server.
HASH_BIAS = ["--logit-bias", "907+30"]


def rung(name: str, *args: str) -> str:
    return f'[[ladder.rungs]]\nname = "{name}"\nplacement = "cpu"\nargs = {json.dumps(["-t", "1", "-c", "2048", *args])}\n'


def selftest(**kv: object) -> str:
    base = {"probes": "smollm2", "decode_tokens": 32, "prefill_tokens": 200, "request_wall_s": 30,
            "timeout_s": 300, **kv}
    return "[selftest]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in base.items())


def boot(tmp: Path, model: Path, rungs: str, *, extra: str = "", st: str | None = None,
         args: tuple[str, ...] = ()) -> Supervised:
    prefix = require_prefix()
    port = free_port()
    text = config(binary=str(prefix / "bin/llama-server"), model=str(model), port=port, status_port=free_port(),
                  state_dir=tmp / "state", rungs=rungs, extra=extra, selftest=st if st is not None else selftest(),
                  snapshot=str(prefix / "share/kiln/llama-server.help.txt"))
    sup = Supervised(tmp, text, env={"KILN_API_KEY": CANARY}, args=args)
    sup.engine_port = port
    return sup


def metric(text: str, name: str) -> float:
    return float(next(ln.split()[-1] for ln in text.splitlines() if ln.startswith(name + " ")))


def test_smollm2_passes_its_selftest_before_it_is_ready(tmp_path):
    sampler = "[sampler]\ntemperature = 0.3\nmin_p = 0.1\nrepeat_penalty = 1.05\n"   # the field notes' choice
    with boot(tmp_path, smollm2_gguf(), rung("cpu"), extra=sampler) as sup:
        st = sup.wait_state("SERVING", timeout=180)
        events = [h["event"] for h in st["history"]]
        assert events.index("HEALTHY") < events.index("SELFTEST") < events.index("SERVING")
        s = st["selftest"]
        assert s["passed"] is True and s["probe_set"] == "smollm2" and s["decode_tok_s"] > 0, s["summary"]
        assert all(p["passed"] for p in s["probes"]) and s["prefill"]["prefix_cache"] is True
        # [sampler] reached the server (GET /props), and the probes still ran greedy
        assert s["sampler"]["temperature"] == 0.3 and s["sampler"]["min_p"] == 0.1
        assert s["sampler"]["repeat_penalty"] == 1.05
        assert st["timings"]["boot_to_ready_s"] >= st["timings"]["last_selftest_s"] > 0
        assert http(sup.url("/ready"))[0] == 200
        m = http(sup.url("/metrics"))[1].decode()
        assert metric(m, "kiln_selftest_passed") == 1 and metric(m, "kiln_selftest_decode_tokens_per_second") > 0
        bodies = [json.dumps(st), m, http(sup.url("/"))[1].decode()]
        assert sup.stop() == 0
        bodies.append(sup.log())
        assert "selftest | selftest of http://127.0.0.1" in bodies[-1]          # the table, in the log
        assert all(CANARY not in b for b in bodies)                            # the key authenticated, unseen


def test_the_tiny_random_model_is_degenerate_and_never_ready(tmp_path):
    tiny = make_tiny_gguf(tmp_path / "tiny.gguf")
    with boot(tmp_path, tiny, rung("cpu")) as sup:
        st = sup.wait_state("FAILED", timeout=120)
        assert st["last_failure"]["class"] == "selftest_failed" and st["failures"] == {"selftest_failed": 1}
        s = st["selftest"]
        assert s["passed"] is False and s["degenerate_probes"], s
        assert any("fatal probe(s) failed: code-add" in f for f in s["failures"])
        assert "SERVING" not in [h["event"] for h in st["history"]]
        code, body = http(sup.url("/ready"))
        assert code == 503 and b"last_failure=selftest_failed" in body
        assert metric(http(sup.url("/metrics"))[1].decode(), "kiln_selftest_passed") == 0
        engine = st["engine"]["pid"]
        assert not psutil.pid_exists(engine) or psutil.Process(engine).status() == psutil.STATUS_ZOMBIE
        assert http(f"http://127.0.0.1:{sup.engine_port}/health")[0] == 0     # not serving: port closed
        assert sup.stop() == 3                                                 # nothing was ever served


def test_a_rung_whose_output_degenerates_falls_through_to_one_that_passes(tmp_path):
    rungs = ('fall_through = ["oom", "config_rejected", "selftest_failed"]\n'
             + rung("hash-run", *HASH_BIAS) + rung("plain"))
    with boot(tmp_path, smollm2_gguf(), rungs) as sup:
        st = sup.wait_state("SERVING", timeout=240)
        assert st["rung"]["name"] == "plain" and st["failures"] == {"selftest_failed": 1}
        failure = next(h["detail"] for h in st["history"] if h["event"] == "failure")
        assert failure.startswith("selftest_failed: selftest: fatal probe(s) failed")
        assert st["selftest"]["passed"] is True and st["selftest"]["rung"] == "plain"
        assert sup.stop() == 0
    memory = json.loads((tmp_path / "state" / "ladder-memory.json").read_text())
    assert [v["rung"] for v in memory.values()] == ["plain"]
    log = (tmp_path / "supervisor.log").read_text()
    assert "symbol run" in log and "# # # #" in log                           # the field notes' output, reported


def test_selftest_failed_is_final_when_it_is_not_a_fall_through_class(tmp_path):
    tiny = make_tiny_gguf(tmp_path / "tiny.gguf")
    with boot(tmp_path, tiny, rung("first") + rung("plain"), args=("--exit-on-failure",)) as sup:
        assert sup.proc.wait(120) == 3
        log = sup.log()
        assert "failure selftest_failed on rung first" in log and "state FAILED" in log
        assert "state LAUNCHING: plain" not in log


def test_sigterm_during_the_selftest_stops_promptly(tmp_path):
    st_table = selftest(decode_tokens=20000, prefill_tokens=0, timeout_s=1200)
    with boot(tmp_path, smollm2_gguf(), rung("cpu"), st=st_table) as sup:
        st = sup.wait_state("SELFTEST", timeout=120)
        engine = st["engine"]["pid"]
        wait_for(lambda: "decode: timing" in sup.log(), 120, "the decode measurement to start")
        t0 = time.monotonic()
        assert sup.stop(signal.SIGTERM, timeout=30) == 0
        assert time.monotonic() - t0 < 5.0
        assert not psutil.pid_exists(engine) or psutil.Process(engine).status() == psutil.STATUS_ZOMBIE
        assert "state STOPPING" in sup.log() and "state SERVING" not in sup.log()


def test_an_engine_that_dies_under_the_selftest_is_a_crash_not_a_hang(tmp_path):
    st_table = selftest(decode_tokens=20000, prefill_tokens=0, timeout_s=1200)
    with boot(tmp_path, smollm2_gguf(), rung("cpu"), st=st_table, args=("--exit-on-failure",)) as sup:
        st = sup.wait_state("SELFTEST", timeout=120)
        wait_for(lambda: "decode: timing" in sup.log(), 120, "the decode measurement to start")
        t0 = time.monotonic()
        os.kill(st["engine"]["pid"], signal.SIGKILL)
        assert sup.proc.wait(30) == 128 + signal.SIGKILL                 # the engine's own end, as PID 1 reports it
        assert time.monotonic() - t0 < 10
        log = sup.log()
        assert "failure crashed on rung cpu: killed by SIGKILL" in log and "state SERVING" not in log
