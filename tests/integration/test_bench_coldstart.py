"""bench/coldstart.py's flow on a CPU machine, before it costs device time: the real llama-server
(CPU build) and the vLLM stand-in (kiln_dev/fake_vllm.py) in the bare engine's place and Kiln's.
Its figures mean nothing here; what must hold is what the H200 run relies on: a cold step empties the
state volume and says whether the page cache was dropped, a bare boot gets a fresh $HOME unless told
to keep it, each lever reaches the engine's argv through the deploy config's [startup], every boot
carries its phases, the P-lines come out from the steps so far (results accumulate across calls),
and nothing it started is left running. P9 (issue 38) is over the honest floor: the fastest of the
ways the read step read the file (cat, a large-buffer sequential read, N ranges in parallel), named,
with every run of every variant printed; Kiln is started as the image starts it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from kiln_dev.supervised import fake_vllm_bench, free_pair
from supervisor.engines import llamacpp, vllm

REPO = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, "bench/coldstart.py"]


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*BENCH, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def left_behind(tmp_path: Path) -> list:
    return [p.info for p in psutil.process_iter(["pid", "cmdline"])
            if any(str(tmp_path) in a for a in (p.info["cmdline"] or []))]


def phases(rec: dict) -> list[str]:
    return [p["phase"] for p in rec["boot"]["phases"]]


@pytest.mark.llama
@pytest.mark.slow
def test_the_llama_cpp_flow_reads_boots_cold_and_warm_and_prints_p9(tmp_path, prefix, tiny):
    root, out = tmp_path / "root", tmp_path / "out"
    (root / "state-llamacpp").mkdir(parents=True)
    (root / "state-llamacpp" / "left-from-before").write_text("a volume used before")
    r = run("--engine", "llamacpp", "--root", str(root), "--out", str(out), "--prefix", str(prefix),
            "--gguf", str(tiny), "--cpu", "--no-drop", "--port", str(free_pair()), "--read-variants", "cat,seq,par3,once",
            "--steps", "read-cold,bare-cold,kiln-cold,kiln-cold:lm-dio,kiln-warm")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    runs = json.loads((out / "coldstart.json").read_text())["runs"]
    assert [x["step"] for x in runs] == ["read-cold", "bare-cold", "kiln-cold", "kiln-cold:lm-dio", "kiln-warm"]
    assert not (root / "state-llamacpp" / "left-from-before").exists()           # the cold step emptied it
    read, bare, cold, dio, warm = runs
    # each way of reading ran (the drop asked for before each), and read the file
    assert list(read["reads"]) == ["cat", "seq", "par3", "once"] and read["bytes"] == tiny.stat().st_size
    assert all(v > 0 for v in read["reads"].values()) and read["drops"] == dict.fromkeys(read["reads"], False)
    # A bare llama-server stopped right after /health turned 200 may die of the TERM itself: it turns
    # ready (tools/server/server.cpp:496 of the pinned 11434.0.0) before it installs its TERM handler
    # (:515). Kiln's runs stop the supervisor, which exits 0 whatever its engine did.
    for rec in runs[1:]:
        exits = (0, -15) if rec is bare else (0,)
        assert rec["ready_s"] > 0 and rec["stop"]["exit"] in exits, rec
    for rec in (read, bare, cold, dio):
        assert rec["page_cache_dropped"] is False and "--no-drop" in rec["page_cache_note"]
    # Kiln as the image starts it: the venv's python3 (kiln_dev/image_start.py), not this interpreter
    assert "as the image starts it" in cold["started_as"] and "image-venv" in cold["started_as"]
    engine = [name for name, _ in llamacpp.PHASES]
    # A bare boot's phases are read from its output as it arrives; the bench stops reading once /health
    # says 200, so on a loaded machine the last lines (slots, health) may not have been read yet.
    expected = ["engine_exec", *engine]
    assert phases(bare) == expected[:len(phases(bare))] and len(phases(bare)) >= expected.index("weights") + 1
    # Kiln's health wait lets its reader hand on the lines written before /health turned 200 (up to 0.2 s:
    # ManagedProcess.caught_up, tested in test_process.py), but llama-server logs "listening on" after it
    # turns ready, and its lines go through a log thread of its own (`slots`' may be written after ready
    # too): a probe that lands between closes the timeline without them. This test cannot tell that from
    # a reader that fell behind (CI at 866f551 lost both); the supervisor logs the latter.
    kiln = ["supervisor_start", "preflight", "fetch", "launch", *expected]
    assert phases(cold) == kiln[:len(phases(cold))] and len(phases(cold)) >= kiln.index("warmup") + 1
    assert "selftest" not in phases(warm)                      # a random model: the selftest stays off
    assert dio["argv"][dio["argv"].index("--load-mode") + 1] == "dio" and "--load-mode" not in cold["argv"]
    assert "P9 boot_over_read=" in r.stdout and "P9 boot_over_read[lm-dio]=" in r.stdout
    fastest = min(read["reads"], key=read["reads"].get)      # one run each: the floor is the fastest
    (p9,) = [ln for ln in r.stdout.splitlines() if ln.startswith("P9 boot_over_read=")]
    assert f"over the floor: `{fastest}`, the fastest of cat, seq, par3, once" in p9
    assert f"    floor (cold): {fastest}, median {read['reads'][fastest]:.3f} s" in r.stdout
    for name, secs in read["reads"].items():                 # every run of every variant
        assert re.search(rf"^    {name} +median {secs:.3f} .*1 runs\): {secs:.3f}$", r.stdout, re.M), name
        if name != fastest:
            assert f"P9 boot_over_read_vs[{name}]=" in r.stdout
    assert re.search(rf"^    kiln-cold +median {cold['ready_s']:.3f} .*: {cold['ready_s']:.3f}$", r.stdout, re.M)
    assert "phases (s): supervisor_start" in r.stdout
    assert left_behind(tmp_path) == []

    again = run("--report", "--root", str(root), "--out", str(out))      # a later call: the same figures
    assert again.returncode == 0 and [ln for ln in again.stdout.splitlines() if ln.startswith("P9")] == \
        [ln for ln in r.stdout.splitlines() if ln.startswith("P9")]

    # rotating rounds (each a step later), numbered on from the last; a deadline passed starts nothing
    common = ["--engine", "llamacpp", "--root", str(root), "--out", str(out), "--prefix", str(prefix), "--gguf", str(tiny),
              "--cpu", "--no-drop", "--read-variants", "seq", "--steps", "read-cold,read-warm"]
    r = run(*common, "--rotate", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    runs = json.loads((out / "coldstart.json").read_text())["runs"][5:]
    assert [(x["step"], x["round"]) for x in runs] == [("read-cold", 1), ("read-warm", 1), ("read-warm", 2), ("read-cold", 2)]
    late = run(*common, "--rotate", "2", "--deadline", "1")
    assert late.returncode == 0 and "stopping before read-cold: 4 steps left" in late.stdout
    assert len(json.loads((out / "coldstart.json").read_text())["runs"]) == 9


WRAPPER = "#!/bin/sh\nexport KILN_FAKE_SCENARIO=vllm-ok\nexec {python} {fake} \"$@\"\n"


@pytest.mark.slow
def test_the_vllm_flow_against_the_stand_in_keeps_or_renews_home_and_passes_the_levers(tmp_path):
    # stand-in: bench/coldstart.py measures a GPU boot; this checks its plumbing, which needs no engine's time
    vllm_bin, model = fake_vllm_bench(tmp_path, WRAPPER)
    root, out = tmp_path / "root", tmp_path / "out"
    (root / "bare-home").mkdir(parents=True)
    (root / "bare-home" / "marker").write_text("a cache of the container before")
    common = ["--engine", "vllm", "--root", str(root), "--out", str(out), "--vllm", str(vllm_bin), "--model", str(model),
              "--no-selftest", "--no-drop", "--port", str(free_pair())]
    r = run(*common, "--steps", "bare-cold,kiln-cold,kiln-warm")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert not (root / "bare-home" / "marker").exists()                    # a new worker's $HOME
    (root / "bare-home" / "marker").write_text("this container's cache")
    r = run(*common, "--steps", "bare-warm:kept-home,kiln-warm:spawn+O0,kiln-cold:graphs-small")    # the next call
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (root / "bare-home" / "marker").exists()
    runs = {x["step"]: x for x in json.loads((out / "coldstart.json").read_text())["runs"]}
    assert set(runs) == {"bare-cold", "kiln-cold", "kiln-warm", "bare-warm:kept-home", "kiln-warm:spawn+O0",
                         "kiln-cold:graphs-small"}
    engine = [name for name, _ in vllm.PHASES]
    assert phases(runs["bare-cold"]) == ["engine_exec", *engine]
    assert phases(runs["kiln-warm"])[-len(engine):] == engine
    o0 = runs["kiln-warm:spawn+O0"]["argv"]
    assert o0[o0.index("--optimization-level") + 1] == "0"
    # levers joined with + all apply: the env one reaches the rung of that boot's deploy config alone
    spawned = [p.name for p in out.glob("deploy-*.toml") if 'VLLM_WORKER_MULTIPROC_METHOD = "spawn"' in p.read_text()]
    assert len(spawned) == 1 and spawned[0].startswith("deploy-vllm-kiln-warm-spawn_O0"), spawned
    cc = runs["kiln-cold:graphs-small"]["argv"]
    assert json.loads(cc[cc.index("--compilation-config") + 1]) == {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32]}
    assert "--optimization-level" not in runs["kiln-warm"]["argv"]         # Kiln's defaults: the engine's own
    assert "P15 kiln_over_engine_defaults_ready=None" in r.stdout          # no bare-warm boot without kept-home
    assert "P15 kiln_over_engine_defaults_ready_cold=" in r.stdout
    assert "P15 kiln_over_engine_defaults_ready_warm[spawn+O0]=" in r.stdout
    assert left_behind(tmp_path) == []


def test_a_step_that_makes_no_sense_is_refused_before_anything_runs(tmp_path):
    for step, why in (("bare-warm:O0", "is for kiln boots"), ("kiln-warm:kept-home", "is for bare boots"),
                      ("kiln-warm:lm-dio", "is for llamacpp"), ("kiln-lukewarm", "VOLUME cold|warm"),
                      ("kiln-warm:O9", "unknown lever"), ("kiln-warm:fork+lm-dio", "is for llamacpp")):
        r = run("--engine", "vllm", "--root", str(tmp_path), "--out", str(tmp_path / "out"), "--steps", step,
                timeout=60)
        assert r.returncode != 0 and why in r.stderr, (step, r.stderr[-500:])


def test_a_step_run_several_times_is_reported_as_the_median_with_its_spread(tmp_path):
    root, out = tmp_path / "root", tmp_path / "out"
    root.mkdir()

    def boot(who, volume, t, lever=None, rnd=None):
        rec = {"engine": "llamacpp", "who": who, "volume": volume, "lever": lever, "round": rnd,
               "step": f"{who}-{volume}", "page_cache_dropped": True}
        return {**rec, "bytes": 6 << 30, "reads": t} if who == "read" else {**rec, "ready_s": t}
    runs = [boot("read", "cold", {"cat": 5.0, "seq": 4.6, "par4": 4.9}, rnd=1), boot("kiln", "cold", 6.5, rnd=1),
            boot("bare", "cold", 6.9, rnd=1),
            boot("read", "cold", {"cat": 5.4, "seq": 4.4, "par4": 4.7}, rnd=2), boot("kiln", "cold", 5.5, rnd=2),
            boot("bare", "cold", 5.4, rnd=2),
            boot("read", "cold", {"cat": 5.2, "seq": 4.8, "par4": 4.5}, rnd=3), boot("kiln", "cold", 9.0, rnd=3),
            boot("bare", "cold", 9.6, rnd=3),
            boot("kiln", "cold", None, "lm-dio"), boot("kiln", "cold", 5.0, "lm-dio"),
            boot("read", "warm", {"cat": 1.0, "seq": 0.8}), boot("kiln", "warm", 2.0), boot("bare", "warm", 1.6)]
    (root / "coldstart.json").write_text(json.dumps({"runs": runs}))
    r = run("--report", "--root", str(root), "--out", str(out), timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    (p9,) = [ln for ln in lines if ln.startswith("P9 boot_over_read=")]
    # the floor is the fastest variant by median (par4 4.7, seq 4.6, cat 5.2): seq, named; the boot's
    # median 6.5 over it (one slow boot of 9.0 s moves nothing), and how many runs each is of
    assert p9.startswith("P9 boot_over_read=1.413 ") and "over the floor: `seq`, the fastest of cat, seq, par4" in p9
    assert "[median of 3 runs 5.50-9.00 s, 3 runs 4.40-4.80 s]" in p9
    assert "    seq    median 4.600 (4.400-4.800, 3 runs): 4.600 4.400 4.800" in lines       # every run, in order
    assert "    floor (cold): seq, median 4.600 s" in lines
    assert "    kiln-cold:lm-dio           no run" not in lines
    assert "    kiln-cold:lm-dio           median 5.000 (5.000-5.000, 1 runs): - 5.000" in lines  # a failed boot: no time
    (dio,) = [ln for ln in lines if ln.startswith("P9 boot_over_read[lm-dio]=")]
    assert dio.startswith("P9 boot_over_read[lm-dio]=1.087")
    assert "P9 boot_over_read_vs[cat]=1.25   (bare 1.3269; cat median 5.200 s, 3 runs)" in lines
    assert any(ln.startswith("P9 boot_over_read_warm=2.5 ") and "`seq`" in ln for ln in lines)
    # paired by round: kiln - bare = -0.4, +0.1, -0.6
    assert "P9 paired[kiln-cold - bare-cold]: mean -0.300 s, median -0.400 s, 2 of 3 rounds faster, t -1.44" in lines


def test_a_read_recorded_before_the_floor_is_read_as_its_two_variants(tmp_path):
    # coldstart.json from the runs of 2026-12-02: read_s (read_once) and read_into_s (16 MiB reused)
    root = tmp_path / "root"
    root.mkdir()
    runs = [{"engine": "llamacpp", "who": "read", "volume": "cold", "lever": None, "bytes": 6 << 30, "read_s": 5.5,
             "read_into_s": 4.5, "page_cache_dropped": True},
            {"engine": "llamacpp", "who": "kiln", "volume": "cold", "lever": None, "ready_s": 5.66}]
    (root / "coldstart.json").write_text(json.dumps({"runs": runs}))
    r = run("--report", "--root", str(root), "--out", str(tmp_path / "out"), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "P9 boot_over_read=1.2578   (llama.cpp, Kiln's defaults, cold, over the floor: `seq16`" in r.stdout
    assert "P9 boot_over_read_vs[once]=1.0291" in r.stdout


def test_the_other_code_lever_boots_kiln_from_the_checkout_it_is_given_and_needs_one(tmp_path, prefix, tiny):
    # A change measured against the code before it in the same run: the supervisor is started from
    # --other-code's checkout (here a copy of this one with another version: /status must say it).
    root, out = tmp_path / "root", tmp_path / "out"
    other = tmp_path / "other"
    shutil.copytree(REPO / "supervisor", other / "supervisor", ignore=shutil.ignore_patterns("__pycache__"))
    init = other / "supervisor" / "__init__.py"
    init.write_text(re.sub(r'__version__ = "[^"]*"', '__version__ = "0.0.0+other"', init.read_text()))
    refused = run("--engine", "llamacpp", "--root", str(root), "--out", str(out), "--prefix", str(prefix),
                  "--gguf", str(tiny), "--cpu", "--no-drop", "--steps", "kiln-warm:other-code")
    assert refused.returncode != 0 and "--other-code DIR" in refused.stderr
    assert not (root / "coldstart.json").exists()
    r = run("--engine", "llamacpp", "--root", str(root), "--out", str(out), "--prefix", str(prefix),
            "--gguf", str(tiny), "--cpu", "--no-drop", "--port", str(free_pair()), "--other-code", str(other),
            "--steps", "kiln-warm:other-code")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (rec,) = json.loads((out / "coldstart.json").read_text())["runs"]
    assert rec["code"] == str(other) and rec["state"] == "SERVING" and rec["ready_s"] > 0
    (shown,) = out.glob("status-*other-code*.json")
    assert json.loads(shown.read_text())["version"] == "0.0.0+other"
    assert not left_behind(tmp_path)
