"""The supervisor with real processes: a real llama-server (CPU build from the pinned sdist), a
tiny real GGUF, and — only where a CPU cannot produce the condition (a CUDA OOM, a leaking
engine) — kiln_dev/fake_llama_server.py, a stand-in that replays recorded engine output.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from kiln_dev.supervised import FAKE, Supervised, config, free_port, http, wait_for

pytestmark = pytest.mark.llama



def rung(name: str, args: list[str], placement: str = "cpu", env: dict[str, str] | None = None) -> str:
    out = f'[[ladder.rungs]]\nname = "{name}"\nplacement = "{placement}"\nargs = {json.dumps(args)}\n'
    if env:
        out += "[ladder.rungs.env]\n" + "".join(f'{k} = "{v}"\n' for k, v in env.items())
    return out


def setup(tmp_path: Path, prefix: Path, tiny: Path, rungs: str, *, binary: str | None = None, extra: str = "",
          snapshot: bool = True, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> Supervised:
    port, sport = free_port(), free_port()
    text = config(binary=binary or str(prefix / "bin" / "llama-server"), model=str(tiny), port=port,
                  status_port=sport, state_dir=tmp_path / "state", rungs=rungs, extra=extra,
                  snapshot=str(prefix / "share/kiln/llama-server.help.txt") if snapshot else "")
    sup = Supervised(tmp_path, text, env=env, args=args)
    sup.engine_port = port
    return sup


def test_boots_to_ready_and_serves_with_the_api_key_on(tmp_path, prefix, tiny):
    with setup(tmp_path, prefix, tiny, rung("cpu", ["-t", "1", "-c", "512"]),
               env={"KILN_API_KEY": "test-key-123"}) as sup:
        st = sup.wait_state("SERVING")
        assert st["ready"] and st["rung"]["name"] == "cpu"
        assert http(sup.url("/ready"))[0] == 200
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).encode()
        url = f"http://127.0.0.1:{sup.engine_port}/v1/chat/completions"
        assert http(url, data=body, headers={"Content-Type": "application/json"})[0] == 401
        code, out = http(url, data=body, headers={"Content-Type": "application/json",
                                                  "Authorization": "Bearer test-key-123"})
        assert code == 200 and json.loads(out)["choices"][0]["message"]["content"]
        assert "--api-key" not in st["engine"]["argv"]          # key goes through a 0600 file
        assert st["timings"]["boot_to_ready_s"] < 30
        assert sup.stop() == 0


def test_ladder_falls_through_a_real_cuda_oom_and_a_lint_rejection_to_a_rung_that_serves(tmp_path, prefix, tiny):
    # Rung 1 pins a removed flag: caught by the lint, nothing started. Rung 2 is the stand-in
    # replaying the OOM llama-server printed on an H200 (a CPU cannot run out of GPU memory).
    # Rung 3 execs the real llama-server.
    rungs = (rung("removed-flag", ["--draft-max", "4"])
             + rung("h200-oom", ["-t", "1"], env={"KILN_FAKE_SCENARIO": "cuda-oom-h200"})
             + rung("seed-oom", ["-t", "1"], env={"KILN_FAKE_SCENARIO": "seed-oom"})
             + rung("cpu", ["-t", "1", "-c", "512"], env={"KILN_FAKE_SCENARIO": "real"}))
    with setup(tmp_path, prefix, tiny, rungs, binary=str(FAKE),
               env={"KILN_FAKE_REAL_BINARY": str(prefix / "bin/llama-server")}) as sup:
        st = sup.wait_state("SERVING")
        assert st["rung"]["name"] == "cpu"
        assert st["failures"] == {"config_rejected": 1, "oom": 2}
        assert st["launches"] == 3                               # the linted rung never started
        events = [h["detail"] for h in st["history"] if h["event"] == "failure"]
        assert events[0].startswith("config_rejected: lint:") and "--spec-draft-n-max" in events[0]
        assert events[1].startswith("oom: CUDA out of memory") and events[2].startswith("oom:")
        assert st["timings"]["last_rung_switch_s"] < 2.0
        assert sup.stop() == 0
        # the next boot on this hardware starts at the rung that won
        memory = json.loads((tmp_path / "state" / "ladder-memory.json").read_text())
        assert [v["rung"] for v in memory.values()] == ["cpu"]


def test_the_next_boot_starts_at_the_remembered_rung(tmp_path, prefix, tiny):
    rungs = (rung("oom", ["-t", "1"], env={"KILN_FAKE_SCENARIO": "cuda-oom-h200"})
             + rung("cpu", ["-t", "1", "-c", "512"], env={"KILN_FAKE_SCENARIO": "real"}))
    env = {"KILN_FAKE_REAL_BINARY": str(prefix / "bin/llama-server")}
    with setup(tmp_path, prefix, tiny, rungs, binary=str(FAKE), env=env) as sup:
        assert sup.wait_state("SERVING")["launches"] == 2
        sup.stop()
        same_config = sup.cfg_path.read_text()
    second = tmp_path / "second-boot"
    second.mkdir()
    with Supervised(second, same_config, env=env) as sup:      # same config, same volume
        st = sup.wait_state("SERVING")
        assert st["launches"] == 1 and st["failures"] == {}
        assert any("remembered winner" in h["detail"] for h in st["history"])
        sup.stop()


def test_terminal_failure_is_failed_with_the_stderr_tail(tmp_path, prefix, tiny):
    with setup(tmp_path, prefix, tiny, rung("cpu", ["-t", "1"], env={"KILN_FAKE_SCENARIO": "missing-model"}),
               binary=str(FAKE), args=("--exit-on-failure",)) as sup:
        assert sup.proc.wait(30) == 1                            # the server's own status
        assert "failure load_error" in sup.log()


def test_sigterm_leaves_nothing_behind_and_propagates_the_status(tmp_path, prefix, tiny):
    with setup(tmp_path, prefix, tiny, rung("cpu", ["-t", "1", "-c", "512"])) as sup:
        st = sup.wait_state("SERVING")
        engine = st["engine"]["pid"]
        assert sup.stop(signal.SIGTERM) == 0
        assert not psutil.pid_exists(engine) or psutil.Process(engine).status() == psutil.STATUS_ZOMBIE
        assert http(f"http://127.0.0.1:{sup.engine_port}/health")[0] == 0   # port released


def test_an_engine_that_ignores_sigterm_is_killed_and_the_exit_says_so(tmp_path, prefix, tiny):
    with setup(tmp_path, prefix, tiny, rung("cpu", ["-t", "1"], env={"KILN_FAKE_SCENARIO": "ignore-sigterm"}),
               binary=str(FAKE)) as sup:
        st = sup.wait_state("SERVING")
        engine = st["engine"]["pid"]
        t0 = time.monotonic()
        assert sup.stop(signal.SIGTERM) == 128 + signal.SIGKILL
        assert time.monotonic() - t0 < 15                       # grace (5 s) then KILL
        assert not psutil.pid_exists(engine) or psutil.Process(engine).status() == psutil.STATUS_ZOMBIE


def test_an_orphaned_grandchild_is_reaped(tmp_path, prefix, tiny):
    go = tmp_path / "orphan-go"
    os.mkfifo(go)
    env = {"KILN_FAKE_ORPHAN_GO": str(go)}                     # it lives until the test lets it go
    with setup(tmp_path, prefix, tiny, rung("cpu", ["-t", "1"], env={"KILN_FAKE_SCENARIO": "spawn-orphan"}),
               binary=str(FAKE), env=env) as sup:
        sup.wait_state("SERVING")
        line = wait_for(lambda: next((ln for ln in sup.log().splitlines() if "orphan pid" in ln), None), 10,
                        "the orphan's pid in the engine log")
        orphan = int(line.rsplit(" ", 1)[-1].strip(" )"))
        me = psutil.Process(sup.proc.pid)
        wait_for(lambda: orphan in [c.pid for c in me.children()], 10, "the orphan re-parented to the supervisor")
        with open(go, "wb"):                                     # let it exit: the supervisor must reap it
            pass
        wait_for(lambda: not psutil.pid_exists(orphan), 15, "the orphan reaped")
        assert sup.stop() == 0


def test_a_killed_server_is_restarted_and_a_crash_loop_ends_failed(tmp_path, prefix, tiny):
    extra = "[restart]\nmax_restarts = 2\nwindow_s = 60\nbackoff_initial_s = 0.2\nbackoff_max_s = 1\n"
    with setup(tmp_path, prefix, tiny, rung("cpu", ["-t", "1", "-c", "512"]), extra=extra) as sup:
        first = sup.wait_state("SERVING")["engine"]["pid"]
        os.kill(first, signal.SIGKILL)
        st = wait_for(lambda: (s := sup.status()) and s["state"] == "SERVING" and s["engine"]["pid"] != first and s,
                      30, "a restarted engine")
        assert st["restarts"] == 1 and st["last_failure"]["class"] == "crashed"
        assert "SIGKILL" in st["last_failure"]["reason"]
        sup.stop()
    env = {"KILN_FAKE_CRASH_AFTER_S": "0.3"}
    loop_dir = tmp_path / "loop"
    loop_dir.mkdir()
    with setup(loop_dir, prefix, tiny, rung("cpu", ["-t", "1"], env={"KILN_FAKE_SCENARIO": "crash-after-ready"}),
               binary=str(FAKE), extra=extra, env=env, args=("--exit-on-failure",)) as sup:
        code = sup.proc.wait(60)
        assert code == 128 + signal.SIGSEGV
        log = sup.log()
        assert "crash loop: 3 failures within 60 s" in log and "state FAILED" in log


def test_a_canary_secret_never_shows(tmp_path, prefix, tiny):
    canary, token = "kiln-canary-4b1d9e", "hf_canary_token_77"
    env = {"KILN_API_KEY": canary, "HF_TOKEN": token}
    rungs = (rung("leaky", ["-t", "1"], env={"KILN_FAKE_SCENARIO": "echo-key"})
             + rung("cpu", ["-t", "1", "-c", "512"], env={"KILN_FAKE_SCENARIO": "real"}))
    with setup(tmp_path, prefix, tiny, rungs, binary=str(FAKE),
               env={**env, "KILN_FAKE_REAL_BINARY": str(prefix / "bin/llama-server")}) as sup:
        # echo-key exits 1 with no known signature: "crashed" is not a fall-through class, so FAILED
        st = sup.wait_state("FAILED")
        bodies = [json.dumps(st)] + [http(sup.url(p))[1].decode() for p in ("/status", "/metrics", "/", "/ready")]
        sup.stop()
        bodies += [sup.log(), (tmp_path / "state/run/engine.log").read_text()]
        assert any("refusing to start with api key ***" in b for b in bodies)   # it leaked, and was masked
        for b in bodies:
            assert canary not in b and token not in b


def test_the_hardware_guard_refuses_a_gpu_config_on_a_cpu_host(tmp_path, prefix, tiny):
    extra = "[hardware]\ngpu_count = 2\nmin_compute_capability = \"8.6\"\n"
    with setup(tmp_path, prefix, tiny, rung("cpu", ["-t", "1"]), extra=extra, args=("--exit-on-failure",)) as sup:
        assert sup.proc.wait(30) == 3
        log = sup.log()
        assert "gpu_count: expected exactly 2 GPUs, found none" in log
        assert "state LAUNCHING" not in log                      # nothing was started


def test_100_start_stop_cycles_of_the_real_server_leave_nothing_behind(tmp_path, prefix, tiny):
    from supervisor.engines.health import wait_healthy
    from supervisor.process.managed import ManagedProcess

    me = psutil.Process()
    fds_before = len(os.listdir("/proc/self/fd"))
    port = free_port()
    argv = [str(prefix / "bin/llama-server"), "--model", str(tiny), "--host", "127.0.0.1", "--port", str(port),
            "-t", "1", "-c", "256", "--no-warmup"]
    pids = []
    for _ in range(100):
        p = ManagedProcess.start(argv)
        out = wait_healthy(p, "127.0.0.1", port, stall_s=20, max_s=60, poll_s=0.01,
                           should_stop=lambda: False, sleep=time.sleep)
        assert out.ready, p.tail()
        pids.extend(p.tree_pids())
        # 0, or -15 when TERM lands in the instant between /health turning 200 and llama-server
        # installing its own handler (seen here about once in a hundred starts)
        assert p.stop(5) in (0, -signal.SIGTERM)
        assert p.survivors() == []
    assert [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE] == []
    assert [c for c in me.children(recursive=True) if c.status() == psutil.STATUS_ZOMBIE] == []
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 2
    # no one listens on the port any more (TIME_WAIT from closed connections is normal TCP; every
    # cycle above re-bound the same port, which is what a restarted server needs)
    assert [c for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port
            and c.status == psutil.CONN_LISTEN] == []


def test_a_rung_that_sets_its_temperature_keeps_every_other_sampler_default(tmp_path, prefix, tiny):
    # Was: a rung with --temp dropped min_p, top_k and repeat_penalty too, and check-config said ok
    # (issue 24, item 6). The real llama-server says what it runs with: GET /props.
    sampler = "[sampler]\ntemperature = 0.3\nmin_p = 0.1\ntop_k = 20\nrepeat_penalty = 1.05\n"
    rungs = rung("cpu", ["-t", "1", "-c", "512", "--temp", "0.7"], env={"LLAMA_ARG_TOP_K": "30"})
    with setup(tmp_path, prefix, tiny, rungs, extra=sampler, env={"KILN_API_KEY": "k-sampler"}) as sup:
        sup.wait_state("SERVING")
        code, body = http(f"http://127.0.0.1:{sup.engine_port}/props", headers={"Authorization": "Bearer k-sampler"})
        assert code == 200, body[:300]
        params = json.loads(body)["default_generation_settings"]["params"]
        assert round(params["temperature"], 4) == 0.7                       # the rung's own
        assert params["top_k"] == 30                                          # the rung's variable, not beaten by a flag
        assert round(params["min_p"], 4) == 0.1 and round(params["repeat_penalty"], 4) == 1.05   # the defaults kept
        assert sup.stop() == 0


def test_an_engine_log_past_its_cap_is_rotated_and_the_ladder_memory_stays_bounded(tmp_path, prefix, tiny):
    # Was: <state_dir>/run/engine.log was appended to forever and ladder-memory.json kept one entry per
    # config (issue 24, item 5). A previous boot's log at the cap (sparse: no 64 MiB written) and 40
    # remembered configs are in the volume before this boot.
    from supervisor.run.launch import ENGINE_LOG_KEEP, ENGINE_LOG_MAX_BYTES
    from supervisor.ladder.memory import LadderMemory

    run = tmp_path / "state" / "run"
    run.mkdir(parents=True)
    with open(run / "engine.log", "wb") as f:
        f.truncate(ENGINE_LOG_MAX_BYTES)
    (tmp_path / "state" / "ladder-memory.json").write_text(
        json.dumps({f"{i:064x}": {"rung": "gone", "at": 1000.0 + i} for i in range(40)}))
    with setup(tmp_path, prefix, tiny, rung("cpu", ["-t", "1", "-c", "512"])) as sup:
        st = sup.wait_state("SERVING")
        assert st["engine"]["log"] == {"path": str(run / "engine.log"), "max_bytes": ENGINE_LOG_MAX_BYTES,
                                       "keep": ENGINE_LOG_KEEP}
        assert (run / "engine.log.1").stat().st_size == ENGINE_LOG_MAX_BYTES      # the old one, rotated away
        current = (run / "engine.log").read_text(errors="replace")
        assert 0 < len(current) < 1 << 20 and "\0" not in current               # this boot's engine output only
        assert sup.stop() == 0
    memory = json.loads((tmp_path / "state" / "ladder-memory.json").read_text())
    rungs = [v["rung"] for v in memory.values()]
    assert len(memory) == LadderMemory.KEEP and rungs.count("cpu") == 1         # this boot's winner, and the newest old


def test_an_autofit_rung_whose_weights_fit_the_gpus_loads_with_load_mode_none_and_serves(tmp_path, prefix, tiny):
    # Kiln's own load mode (engines/llamacpp.py boot_args, P9): the GPUs are NVIDIA's tool replaying
    # two A40s (tests/support/hw/nvidia-smi: a CPU machine has none), the engine the real llama-server,
    # which takes --load-mode none on a CPU build too. A cpu rung keeps the engine's own (mmap).
    hw = Path(__file__).resolve().parents[1] / "support" / "hw"
    env = {"PATH": f"{hw}:{os.environ['PATH']}", "KILN_FAKE_SMI": "a40x2", "KILN_FAKE_SMI_USED": "0,0"}
    rungs = rung("fits", ["-t", "1", "-c", "256"], placement="autofit")
    with setup(tmp_path, prefix, tiny, rungs, env=env) as sup:
        st = sup.wait_state("SERVING")
        argv = st["engine"]["argv"]
        assert argv[argv.index("--load-mode") + 1] == "none", argv
        assert "--load-mode none: every layer fits on the GPU" in sup.log()
        assert sup.stop() == 0
    pinned = tmp_path / "pinned"
    pinned.mkdir()
    with setup(pinned, prefix, tiny, rung("pinned", ["-t", "1", "-c", "256"], placement="cpu"),
               env=env) as sup:
        assert "--load-mode" not in sup.wait_state("SERVING")["engine"]["argv"]
        assert sup.stop() == 0
