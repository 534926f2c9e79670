#!/usr/bin/env python3
"""Time to ready from a cold worker (issue 28): Kiln's supervised boot with Kiln's defaults against
the bare engine with its own defaults, the same model and card, cold volume and warm; every phase
of every boot shown from the boot timeline (supervisor/run/timeline.py).

    python3 bench/coldstart.py --engine vllm     [--root ROOT] --out $OUT [--steps ...] [--vllm BIN] [--model DIR]
    python3 bench/coldstart.py --engine llamacpp [--root ROOT] --out $OUT [--steps ...] [--prefix DIR]
                               [--gguf PATH | --gguf-gib 6] [--selftest-gguf PATH]
    python3 bench/coldstart.py --report [--root ROOT] --out $OUT      the P-lines from every step so far

A step is WHO-VOLUME[:LEVER]:
  WHO     bare   the engine alone, its own defaults: `vllm serve MODEL --host --port` + the model's
                 args, or `llama-server -m MODEL --host --port` + the same; its caches where it puts
                 them ($HOME), and $HOME fresh each boot (a scale-to-zero worker's container disk is
                 new; only the volume lasts) unless the lever is `kept-home`
          kiln   `python -m supervisor run`, started as the image starts it (kiln_dev/image_start.py), with Kiln's defaults (the selftest on, the compile and JIT
                 caches on the state volume: supervisor/engines/caches.py) plus the lever
  VOLUME  cold   the page cache dropped first (`echo 3 > /proc/sys/vm/drop_caches`, where permitted:
                 each record says whether it was); kiln: the state volume emptied; bare: a fresh $HOME
          warm   the page cache as the step before left it; kiln: the state volume as the kiln step
                 before left it (a lever that changes vLLM's compile key needs its own cold step first)
  LEVER   a switch of the deploy config's [startup] table (supervisor/engines/startup.py) or of the
          boot, off in Kiln's defaults until measured here: LEVERS below
  read-cold (llama.cpp)  the model file read each way of --read-variants (cat, seq: one reused 32 MiB
                         buffer, parN: N ranges by N threads, once: the old denominator), the page
                         cache dropped before each; P9's floor is the fastest by median (issue 38)
  read-warm (llama.cpp)  the same, the page cache as the step before left it (P9 warm's floor)

Ready is measured from the spawn: bare to /health 200, kiln to /ready 200 (after its selftest), both
polled every 20 ms. Results accumulate in ROOT/coldstart.json (a device call is at most 10 minutes:
the steps of one run are split over calls) and are copied to OUT; each boot's /status, logs and
timeline land in OUT. The figures (printed by every call, from all steps so far):

  P15 kiln_over_engine_defaults_ready=   vLLM, kiln-warm / bare-warm (goal <= 0.6); cold printed too
  P9 boot_over_read=                     llama.cpp, kiln-cold over the floor, named (goal <= 1.05); per lever,
                                         bare, warm, over each other read variant, and paired by round too
  selftest_share=                        the selftest phase over the boot, for each Kiln boot with one

A step named N times (`--steps read-cold,kiln-cold,read-cold,kiln-cold,...`, or `--rotate N`: the steps
N times, each round starting one step later) runs N times; each figure is then the ratio of the
medians, with the number of runs and their spread beside it, and every run of every variant printed.
--deadline (or $KILN_DEADLINE) starts no step that would not end by it: a device call is 10 minutes.

On a machine without a GPU the same flow runs against the CPU llama-server and the vLLM stand-in
(tests/integration/test_bench_coldstart.py); such figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from common import (REPO, add_device_root, env_without_kiln, spawn, status_code, stop, stop_on_term,  # noqa: E402
                    wait_until)
from gpu import check_read_variant, drop_caches, read_variant  # noqa: E402
from gpu_vllm import final_status, get, gpu_apps  # noqa: E402

from kiln_dev import Unavailable  # noqa: E402
from kiln_dev.image_start import ImageStart, image_start  # noqa: E402

KEY = "kiln-coldstart-key"
POLL_S = 0.02
GOALS = {"P15": 0.6, "P9": 1.05}

# lever -> what it changes: `startup` ([startup] fields), `args` / `env` (the rung's), `selftest`
# (on/off), `bare` (applies to bare boots), `engine` (which engine it belongs to; None: both)
LEVERS: dict[str, dict[str, Any]] = {
    # vLLM: -O0 neither compiles nor captures CUDA graphs (its help: "the best startup time")
    "O0": {"engine": "vllm", "startup": {"optimization_level": 0}},
    "O1": {"engine": "vllm", "startup": {"optimization_level": 1}},
    "O3": {"engine": "vllm", "startup": {"optimization_level": 3}},
    "st-eager": {"engine": "vllm", "startup": {"safetensors_load_strategy": "eager"}},
    "st-prefetch": {"engine": "vllm", "startup": {"safetensors_load_strategy": "prefetch"}},
    # fewer CUDA graphs to capture (vLLM's default captured 51 + 51 on the H200, 2026-12-01)
    "graphs-small": {"engine": "vllm", "startup": {"compilation_config": '{"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32]}'}},
    # no bytecode in the image: every module compiled on import, into an empty pycache (an upper
    # bound: the standard library and torch are compiled again too, which an image would not do)
    "nopyc": {"engine": "vllm", "env": {"PYTHONPYCACHEPREFIX": "{tmp}/pycache"}},
    # llama.cpp's load modes (llama-server --help: auto = mmap; dio = direct I/O)
    "lm-dio": {"engine": "llamacpp", "startup": {"load_mode": "dio"}},
    "lm-none": {"engine": "llamacpp", "startup": {"load_mode": "none"}},
    # mmap: llama.cpp's own default, which Kiln sets `none` over where every layer fits on the GPU
    # (engines/llamacpp.py boot_args, since 2026-12-02): lm-mmap+late is Kiln's default before that
    "lm-mmap": {"engine": "llamacpp", "startup": {"load_mode": "mmap"}},
    "no-warmup": {"engine": "llamacpp", "args": ["--no-warmup"]},
    # vLLM's CLI starts its EngineCore with `spawn` unless VLLM_WORKER_MULTIPROC_METHOD is set
    # (vllm/entrypoints/utils.py cli_env_setup), so the core imports vLLM and torch a second time;
    # `fork` inherits the API server's imports. Measured as a lever on 2026-12-01 (P15 0.600 -> 0.349),
    # since then Kiln's default (supervisor/engines/vllm.py FORK_START): `spawn` measures the old one
    "fork": {"engine": "vllm", "env": {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}},
    "spawn": {"engine": "vllm", "env": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}},
    # the EngineCore inside the API server's process: one import, but one GIL for both
    "inproc": {"engine": "vllm", "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}},
    # Kiln's model prefetch (supervisor/model/prefetch.py; on by default, 1 stream since 2026-12-02,
    # 4 before): off, or more reads in flight
    "no-prefetch": {"engine": None, "startup": {"prefetch": False}},
    "prefetch-1": {"engine": None, "startup": {"prefetch_streams": 1}},
    "prefetch-2": {"engine": None, "startup": {"prefetch_streams": 2}},
    "prefetch-4": {"engine": None, "startup": {"prefetch_streams": 4}},
    "prefetch-8": {"engine": None, "startup": {"prefetch_streams": 8}},
    "prefetch-16": {"engine": None, "startup": {"prefetch_streams": 16}},
    # one stream while Kiln and the engine start (their own files come off the same disk), then more
    # once the engine writes its first line (issue 38: 4 from the start slowed both starts)
    "widen-4": {"engine": None, "startup": {"prefetch_widen_to": 4}},
    "widen-8": {"engine": None, "startup": {"prefetch_widen_to": 8}},
    # when the prefetch begins: as soon as PID 1 has read the config, before the loop's imports
    # ("start", the default since 2026-12-02), or at preflight, after the GPU probe (the default before)
    "early": {"engine": None, "startup": {"prefetch_at": "start"}},
    "late": {"engine": None, "startup": {"prefetch_at": "preflight"}},
    # the selftest off: its cost seen whole (Kiln's default is on)
    "no-selftest": {"engine": None, "selftest": False},
    # llama.cpp: a real model (--selftest-gguf, SmolLM2) with the selftest on, for its share of a boot
    # (P9's model is random: its boots run without the selftest, which it would rightly fail)
    "smollm2": {"engine": "llamacpp", "selftest": True, "model": "selftest_gguf"},
    # bare only: the engine's $HOME kept from the bare boot before (the same container booted again)
    "kept-home": {"engine": None, "bare": True},
    # Kiln's code from --other-code DIR (a worktree of an earlier commit): a change against the code
    # before it, in the same run (`git worktree add /tmp/before COMMIT`)
    "other-code": {"engine": None, "code": True},
}


def log(msg: str) -> None:
    print(f"[coldstart {time.strftime('%H:%M:%S')}] {msg}", flush=True)




# -- what a step is ----------------------------------------------------------------------------------
def parse_step(text: str, engine: str) -> tuple[str, str, str | None]:
    head, _, lever = text.partition(":")
    who, _, volume = head.partition("-")
    if head in ("read-cold", "read-warm") and engine == "llamacpp" and not lever:
        return "read", volume, None
    if who not in ("bare", "kiln") or volume not in ("cold", "warm"):
        raise SystemExit(f"step {text!r}: WHO-VOLUME[:LEVER], WHO bare|kiln, VOLUME cold|warm (or read-cold, "
                         f"read-warm for llamacpp)")
    if lever:
        for part in lever.split("+"):
            spec = LEVERS.get(part)
            if spec is None:
                raise SystemExit(f"step {text!r}: unknown lever {part!r}; known: {', '.join(LEVERS)} "
                                 f"(several joined with +)")
            if spec["engine"] not in (None, engine):
                raise SystemExit(f"step {text!r}: lever {part} is for {spec['engine']}, not {engine}")
            if (who == "bare") != bool(spec.get("bare")):
                raise SystemExit(f"step {text!r}: lever {part} is for {'bare' if spec.get('bare') else 'kiln'} boots")
    return who, volume, lever or None


def lever_spec(lever: str | None) -> dict[str, Any]:
    """One lever's spec, or several joined with + merged (args appended, tables merged; later wins)."""
    out: dict[str, Any] = {}
    for part in (lever or "").split("+"):
        spec = LEVERS.get(part, {})
        for k, v in spec.items():
            if isinstance(v, dict):
                out[k] = {**out.get(k, {}), **v}
            elif isinstance(v, list):
                out[k] = out.get(k, []) + v
            else:
                out[k] = v
    return out


class Engine:
    """What differs between the two engines: the model's args, the bare argv, the deploy config."""

    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.name = a.engine
        from supervisor.engines import llamacpp, vllm

        self.module = vllm if a.engine == "vllm" else llamacpp

    def model_args(self) -> list[str]:
        return list(self.a.model_args)

    def bare_argv(self, port: int) -> list[str]:
        a = self.a
        if self.name == "vllm":
            return [a.vllm, "serve", a.model, "--host", "127.0.0.1", "--port", str(port), *self.model_args()]
        return [str(Path(a.prefix) / "bin" / "llama-server"), "--model", a.gguf, "--host", "127.0.0.1",
                "--port", str(port), *self.model_args()]

    def health(self, port: int) -> bool:
        return status_code(f"http://127.0.0.1:{port}/health") == 200

    def config(self, state: Path, port: int, sport: int, lever: str | None, tmp: Path) -> str:
        """The deploy config of a Kiln boot: Kiln's defaults, the model's args, the lever."""
        a, spec = self.a, lever_spec(lever)
        args = self.model_args() + list(spec.get("args", []))
        env = {**a.rung_env, **{k: v.replace("{tmp}", str(tmp)) for k, v in spec.get("env", {}).items()}}
        selftest = spec.get("selftest", a.selftest)
        vllm = self.name == "vllm"
        model = a.selftest_gguf if spec.get("model") == "selftest_gguf" else (a.model if vllm else a.gguf)
        binary = a.vllm if vllm else Path(a.prefix) / "bin" / "llama-server"
        placement = "engine" if vllm else ("autofit" if a.gpu else "cpu")
        q = json.dumps               # a JSON string is a TOML basic string
        lines = ["# written by bench/coldstart.py", f"engine = {q(self.name)}", f"state_dir = {q(str(state))}",
                 "[model]", f"source = {q(str(model))}", *(['entry = "config.json"'] if vllm else []),
                 f"family = {q(a.family)}",
                 "[server]", 'host = "127.0.0.1"', f"port = {port}", f"binary = {q(str(binary))}",
                 'api_key = "env:KILN_API_KEY"', *([f"flag_snapshot = {q(a.snapshot)}"] if a.snapshot else []),
                 "[ladder]", "remember = false", "[[ladder.rungs]]", 'name = "main"', f"placement = {q(placement)}",
                 f"args = {q(args)}"]
        if env:
            lines += ["[ladder.rungs.env]", *(f"{k} = {q(v)}" for k, v in env.items())]
        lines += ["[health]", f"stall_s = {a.stall_s}", "[selftest]", f"enabled = {str(bool(selftest)).lower()}"]
        if selftest and a.selftest_decode is not None:
            lines.append(f"decode_tokens = {a.selftest_decode}")
        if selftest and a.selftest_prefill is not None:
            lines.append(f"prefill_tokens = {a.selftest_prefill}")
        if spec.get("startup"):
            lines += ["[startup]", *(f"{k} = {q(v)}" for k, v in spec["startup"].items())]
        lines += ["[status]", 'host = "127.0.0.1"', f"port = {sport}"]
        return "\n".join(lines) + "\n"


# -- one boot of each kind ---------------------------------------------------------------------------
def ports_free(*ports: int) -> str | None:
    for p in ports:
        if get(f"http://127.0.0.1:{p}/")[0] or status_code(f"http://127.0.0.1:{p}/health"):
            return f"port {p} already answers: something from an earlier run is still up"
    return None


def prepare_volume(a: argparse.Namespace, volume: str, state: Path | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if volume == "cold":
        if state is not None:
            shutil.rmtree(state, ignore_errors=True)
            out["state_emptied"] = True
        out["page_cache_dropped"] = False if a.no_drop else drop_caches()
        if a.no_drop:
            out["page_cache_note"] = "not dropped: --no-drop (a dry run on a shared machine)"
        elif not out["page_cache_dropped"]:
            out["page_cache_note"] = "not permitted here (/proc/sys/vm/drop_caches not writable): the cold figure is not cold"
    return out


def bare(a: argparse.Namespace, eng: Engine, volume: str, lever: str | None, tag: str) -> dict[str, Any]:
    from supervisor.run.timeline import Timelines

    port = a.port
    busy = ports_free(port)
    if busy:
        return {"error": busy}
    home = a.root / "bare-home"
    if lever != "kept-home":
        shutil.rmtree(home, ignore_errors=True)        # a new worker's container disk
    home.mkdir(parents=True, exist_ok=True)
    rec: dict[str, Any] = {"who": "bare", "volume": volume, "lever": lever, **prepare_volume(a, volume, None)}
    (home / "tmp").mkdir(exist_ok=True)
    # Its own defaults: caches under $HOME (vLLM, Triton, the driver's JIT) and /tmp (Inductor's
    # /tmp/torchinductor_<user>, through tempfile): a new container has both empty, so TMPDIR goes with $HOME
    env = {**env_without_kiln(), "HOME": str(home), "TMPDIR": str(home / "tmp"), **a.rung_env}
    for k in ("XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "TORCHINDUCTOR_CACHE_DIR"):
        env.pop(k, None)
    argv = eng.bare_argv(port)
    logf = open(a.out / f"engine-{tag}.log", "w")
    t0 = time.monotonic()
    timeline = Timelines(process_start=t0, supervised=False)
    watch = timeline.engine(eng.module.PHASES, "bare")
    proc = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    watch.arm(t0)
    reader = threading.Thread(target=pump, args=(proc, logf, watch), daemon=True)
    reader.start()
    try:
        wait_until(lambda: proc.poll() is not None or eng.health(port), a.boot_deadline_s, POLL_S)
        ok = proc.poll() is None
    except TimeoutError:
        ok = False
    ready = time.monotonic()
    if ok:
        timeline.on_state("SERVING", t=ready)
    rec.update(argv=argv, ready_s=round(ready - t0, 3) if ok else None, exit=proc.poll(),
               boot=timeline.to_dict(), gpu_apps_serving=gpu_apps())
    rec["stop"] = stop_engine(proc)
    reader.join(10)
    logf.close()
    return rec


def pump(proc: subprocess.Popen, logf: Any, watch: Any) -> None:
    """The bare engine's output to its log, each line to the timeline as it arrives."""
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        logf.write(line + "\n")
        watch.line(line)


def stop_engine(proc: subprocess.Popen) -> dict[str, Any]:
    t0 = time.monotonic()
    code = stop(proc, 60)
    out: dict[str, Any] = {"exit": code, "exit_s": round(time.monotonic() - t0, 2)}
    freed = None
    try:
        freed = wait_until(lambda: not gpu_apps(), 30, 0.5) - t0
    except TimeoutError:
        pass
    out.update(gpu_free_after_s=None if freed is None else round(freed, 2), gpu_apps_left=gpu_apps())
    return out


def kiln(a: argparse.Namespace, eng: Engine, volume: str, lever: str | None, tag: str) -> dict[str, Any]:
    port, sport = a.port, a.port + 1
    busy = ports_free(port, sport)
    if busy:
        return {"error": busy}
    state = a.root / f"state-{eng.name}"
    rec: dict[str, Any] = {"who": "kiln", "volume": volume, "lever": lever, **prepare_volume(a, volume, state)}
    tmp = Path(tempfile.mkdtemp(prefix="kiln-coldstart-", dir=a.root))
    cfg = a.out / f"deploy-{tag}.toml"
    cfg.write_text(eng.config(state, port, sport, lever, tmp))
    # started as the image starts it (kiln_dev/image_start.py): its venv's python3, the compiled copy
    # of supervisor/ on PYTHONPATH, from outside the checkout
    start: ImageStart = a.start
    env = start.env({**env_without_kiln(), "KILN_API_KEY": KEY})
    rec["started_as"] = start.described
    if lever_spec(lever).get("code"):
        code = Path(a.other_code).resolve()
        env["PYTHONPATH"] = str(code)       # the other checkout's sources (not compiled): the same venv
        head = subprocess.run(["git", "-C", str(code), "rev-parse", "HEAD"], capture_output=True, text=True)
        rec["code"] = str(code) + (f" at {head.stdout.strip()}" if head.returncode == 0 else "")
    logf = open(a.out / f"supervisor-{tag}.log", "w")
    t0 = time.monotonic()
    proc = spawn([*start.argv, "run", "--config", str(cfg), "--exit-on-failure"],
                 death_signal=signal.SIGTERM, cwd=start.cwd, env=env, stdout=logf, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: proc.poll() is not None or status_code(f"http://127.0.0.1:{sport}/ready") == 200,
                   a.boot_deadline_s, POLL_S)
        ok = proc.poll() is None
    except TimeoutError:
        ok = False
    ready = time.monotonic()
    status, status_error = final_status(sport)
    if status_error:
        rec["status_error"] = status_error
    (a.out / f"status-{tag}.json").write_text(json.dumps(status, indent=1))
    boot = status.get("boot") or {}
    selftest = sum(p["seconds"] for p in boot.get("phases", []) if p.get("phase") == "selftest")
    rec.update(ready_s=round(ready - t0, 3) if ok else None, state=status.get("state"), boot=boot,
               argv=(status.get("engine") or {}).get("argv"), timings=status.get("timings"),
               selftest={"passed": (status.get("selftest") or {}).get("passed"), "seconds": round(selftest, 3),
                         # what a lever costs in speed (-O0 decodes eagerly): the selftest's own measure
                         "decode_tok_s": (status.get("selftest") or {}).get("decode_tok_s"),
                         "prefill_tok_s": (status.get("selftest") or {}).get("prefill_tok_s"),
                         "share": round(selftest / boot["seconds"], 4) if selftest and boot.get("seconds") else None},
               prefetch=status.get("prefetch"), last_failure=status.get("last_failure"), gpu_apps_serving=gpu_apps())
    t1 = time.monotonic()
    rc = stop(proc, 60)
    rec["stop"] = {"exit": rc, "exit_s": round(time.monotonic() - t1, 2), "gpu_apps_left": gpu_apps()}
    logf.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return rec


def read_step(a: argparse.Namespace, volume: str) -> dict[str, Any]:
    """The model file read each way of --read-variants (the floor is the fastest: issue 38), cold:
    the page cache dropped before each; warm: as the step before left it."""
    rec: dict[str, Any] = {"who": "read", "volume": volume, "lever": None, "reads": {}, "drops": {}}
    path = Path(a.gguf)
    rec["bytes"] = path.stat().st_size
    for name in a.read_variants:
        drop = prepare_volume(a, volume, None)
        rec["drops"][name] = drop.get("page_cache_dropped")
        rec.update({k: v for k, v in drop.items() if k == "page_cache_note"})
        rec["reads"][name] = round(read_variant(path, name), 6)
    if volume == "cold":
        rec["page_cache_dropped"] = all(rec["drops"].values())
    return rec


# -- the figures --------------------------------------------------------------------------------------
def latest(runs: list[dict[str, Any]], engine: str, who: str, volume: str, lever: str | None = None,
           key: str | None = None) -> dict | None:
    """The newest run of this kind, its time replaced by the median of every run of the kind (a step
    named N times is run N times: one run's weights phase moved by up to 1.1 s on the H200), with
    `n` and the `spread` (fastest, slowest) beside it."""
    key = key or ("read_s" if who == "read" else "ready_s")
    hits = [r for r in runs if r.get("engine") == engine and r.get("who") == who and r.get("volume") == volume
            and r.get("lever") == lever and isinstance(r.get(key), (int, float))]
    if not hits:
        return None
    times = sorted(float(r[key]) for r in hits)
    mid = len(times) // 2
    median = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
    return {**hits[-1], key: median, "n": len(times), "spread": (times[0], times[-1])}


def runs_note(*recs: dict | None) -> str:
    """'' for single runs; else how many runs each median is of, and their spread."""
    many = [r for r in recs if r and r.get("n", 1) > 1]
    return "" if not many else "  [median of " + ", ".join(
        f"{r['n']} runs {r['spread'][0]:.2f}-{r['spread'][1]:.2f} s" for r in many) + "]"


def read_times(rec: dict[str, Any]) -> dict[str, float]:
    """A read record's seconds by variant. Records from before issue 38 hold the old read (`once`,
    read_s) and a read into one reused 16 MiB buffer (`seq16`, read_into_s)."""
    if "reads" in rec:
        return {k: float(v) for k, v in rec["reads"].items() if isinstance(v, (int, float))}
    old = {"once": rec.get("read_s"), "seq16": rec.get("read_into_s")}
    return {k: float(v) for k, v in old.items() if isinstance(v, (int, float))}


def summary(times: list[float]) -> dict[str, Any]:
    xs = sorted(times)
    return {"n": len(xs), "median": statistics.median(xs), "spread": (xs[0], xs[-1]), "runs": times}


def floor(runs: list[dict[str, Any]], engine: str, volume: str) -> tuple[str, dict[str, dict[str, Any]]] | None:
    """(the fastest read variant by median, every variant's summary) over every read of this volume:
    the honest floor is the fastest way this host read the file (issue 38), never one chosen ahead."""
    per: dict[str, list[float]] = {}
    for r in runs:
        if r.get("engine") == engine and r.get("who") == "read" and r.get("volume") == volume:
            for k, v in read_times(r).items():
                per.setdefault(k, []).append(v)
    if not per:
        return None
    sums = {k: summary(v) for k, v in per.items()}
    return min(sums, key=lambda k: sums[k]["median"]), sums


def kind(r: dict[str, Any]) -> str:
    return f"{r.get('who')}-{r.get('volume')}" + (f":{r['lever']}" if r.get("lever") else "")


def every_run(runs: list[dict[str, Any]], engine: str) -> list[str]:
    """Every run of every variant, in the order run, with the median and spread: reads, then boots."""
    out: list[str] = []
    for volume in ("cold", "warm"):
        fl = floor(runs, engine, volume)
        if not fl:
            continue
        name, sums = fl
        out.append(f"  reads ({volume}{', the page cache dropped before each' if volume == 'cold' else ''}), every run (s):")
        for k, sm in sums.items():
            out.append(f"    {k:6} median {sm['median']:.3f} ({sm['spread'][0]:.3f}-{sm['spread'][1]:.3f}, {sm['n']} runs): "
                       + " ".join(f"{x:.3f}" for x in sm["runs"]))
        out.append(f"    floor ({volume}): {name}, median {sums[name]['median']:.3f} s")
    boots: dict[str, list[float]] = {}
    for r in runs:
        if r.get("engine") == engine and r.get("who") in ("bare", "kiln"):
            boots.setdefault(kind(r), []).append(r.get("ready_s"))
    if boots:
        out.append("  boots, every run (s to ready; - a boot that failed):")
    for k, xs in boots.items():
        ok = [x for x in xs if isinstance(x, (int, float))]
        sm = summary(ok) if ok else None
        head = f"median {sm['median']:.3f} ({sm['spread'][0]:.3f}-{sm['spread'][1]:.3f}, {sm['n']} runs)" if sm else "no run"
        out.append(f"    {k:26} {head}: " + " ".join("-" if x is None else f"{x:.3f}" for x in xs))
    return out


def paired(runs: list[dict[str, Any]], engine: str, a: str, b: str) -> str | None:
    """a's boot minus b's in the same round (the same disk minutes): mean, median, how many faster, t."""
    by: dict[Any, dict[str, float]] = {}
    for r in runs:
        if r.get("engine") == engine and r.get("round") is not None and isinstance(r.get("ready_s"), (int, float)):
            by.setdefault(r["round"], {})[kind(r)] = float(r["ready_s"])
    d = [x[a] - x[b] for x in by.values() if a in x and b in x]
    if len(d) < 2:
        return None
    sd = statistics.stdev(d)
    t = statistics.mean(d) / (sd / len(d) ** 0.5) if sd else float("inf")
    return (f"paired[{a} - {b}]: mean {statistics.mean(d):+.3f} s, median {statistics.median(d):+.3f} s, "
            f"{sum(x < 0 for x in d)} of {len(d)} rounds faster, t {t:.2f}")


def p9_lines(runs: list[dict[str, Any]]) -> list[str]:
    """P9 over the honest floor, cold and warm, with every run shown; the other read variants beside it."""
    fc = floor(runs, "llamacpp", "cold")
    if not fc:
        return []
    lines = every_run(runs, "llamacpp")
    name, sums = fc
    fl = {"read_s": sums[name]["median"], "n": sums[name]["n"], "spread": sums[name]["spread"]}
    kl, b = latest(runs, "llamacpp", "kiln", "cold"), latest(runs, "llamacpp", "bare", "cold")
    lines.append(f"P9 boot_over_read={ratio(kl, fl, ky='read_s')}   (llama.cpp, Kiln's defaults, cold, over the floor: "
                 f"`{name}`, the fastest of {', '.join(sums)}; goal <= {GOALS['P9']}){runs_note(kl, fl)}")
    levers = sorted({r["lever"] for r in runs if r.get("engine") == "llamacpp" and r.get("who") == "kiln"
                     and r.get("volume") == "cold" and r.get("lever")})
    for lever in levers:
        k = latest(runs, "llamacpp", "kiln", "cold", lever)
        if k:
            lines.append(f"P9 boot_over_read[{lever}]={ratio(k, fl, ky='read_s')}{runs_note(k, fl)}")
    if b:
        lines.append(f"P9 bare_boot_over_read={ratio(b, fl, ky='read_s')}   (the engine alone, its defaults){runs_note(b, fl)}")
    for other, sm in sums.items():       # the same boots over each other way of reading: where the floor sits
        if other != name:
            ref = {"read_s": sm["median"]}
            lines.append(f"P9 boot_over_read_vs[{other}]={ratio(kl, ref, ky='read_s')}   (bare "
                         f"{ratio(b, ref, ky='read_s')}; {other} median {sm['median']:.3f} s, {sm['n']} runs)")
    fw = floor(runs, "llamacpp", "warm")
    kw, bw = latest(runs, "llamacpp", "kiln", "warm"), latest(runs, "llamacpp", "bare", "warm")
    if fw and (kw or bw):
        wname, wsums = fw
        wfl = {"read_s": wsums[wname]["median"], "n": wsums[wname]["n"], "spread": wsums[wname]["spread"]}
        lines.append(f"P9 boot_over_read_warm={ratio(kw, wfl, ky='read_s')}   (the page cache warm, over the warm floor: "
                     f"`{wname}`){runs_note(kw, wfl)}")
        if bw:
            lines.append(f"P9 bare_boot_over_read_warm={ratio(bw, wfl, ky='read_s')}{runs_note(bw, wfl)}")
    pairs = [("kiln-cold", "bare-cold"), ("kiln-warm", "bare-warm")] + [(f"kiln-cold:{lv}", "kiln-cold") for lv in levers]
    lines += [f"P9 {p}" for p in (paired(runs, "llamacpp", x, y) for x, y in pairs) if p]
    return lines


def ratio(x: dict | None, y: dict | None, kx: str = "ready_s", ky: str = "ready_s") -> float | None:
    if not x or not y or not x.get(kx) or not y.get(ky):
        return None
    return round(x[kx] / y[ky], 4)


def report(runs: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in runs:
        if r.get("who") == "read":
            shown = ", ".join(f"{k} {v:.3f} s ({r['bytes'] / 2**30 / v:.2f} GiB/s)" for k, v in read_times(r).items() if v)
            lines.append(f"  {r['engine']:8} read-{r.get('volume')}: {shown} for {r['bytes'] / 2**30:.2f} GiB"
                         + (f", page cache dropped before each: {r.get('page_cache_dropped')}" if r.get("volume") == "cold" else ""))
            continue
        name = f"{r.get('who')}-{r.get('volume')}" + (f":{r['lever']}" if r.get("lever") else "")
        phases = (r.get("boot") or {}).get("phases") or []
        shown = ", ".join(f"{p['phase']} {p['seconds']:.2f}" for p in phases)
        extra = ""
        if r.get("selftest", {}).get("share") is not None:
            extra = f"; selftest {r['selftest']['seconds']:.2f} s = {r['selftest']['share']:.1%} of the boot"
            if r["selftest"].get("decode_tok_s") is not None:
                extra += f", decode {r['selftest']['decode_tok_s']} tok/s"
        pf = r.get("prefetch") or {}
        if pf.get("state"):
            extra += (f"; prefetch {pf['state']}" + (f" {pf.get('read_bytes', 0) / 2**30:.2f} GiB in {pf.get('seconds')} s"
                      f" ({pf.get('streams')} streams" + (f" from {pf['widened_s']} s in" if pf.get("widened_s") is not None else "")
                      + ")" + (f" from {pf['start_s']} s" if pf.get("start_s") is not None else "")
                      + (f", {pf['resident_bytes'] / 2**30:.2f} GiB of it found in the page cache"
                         if pf.get("resident_bytes") else "")
                      if pf["state"] != "skipped" else f" ({pf.get('note')})"))
        lines.append(f"  {r.get('engine'):8} {name:24} ready {r.get('ready_s')} s"
                     f"{'' if r.get('page_cache_dropped') or r.get('volume') != 'cold' else ' (page cache NOT dropped)'}"
                     f"{extra}{' ERROR ' + str(r.get('error')) if r.get('error') else ''}\n      phases (s): {shown}")
    kw, bw = latest(runs, "vllm", "kiln", "warm"), latest(runs, "vllm", "bare", "warm")
    kc, bc = latest(runs, "vllm", "kiln", "cold"), latest(runs, "vllm", "bare", "cold")
    if kw or kc:
        lines.append(f"P15 kiln_over_engine_defaults_ready={ratio(kw, bw)}   (vLLM, warm volume; goal <= {GOALS['P15']})"
                     f"{runs_note(kw, bw)}")
        lines.append(f"P15 kiln_over_engine_defaults_ready_cold={ratio(kc, bc)}   (vLLM, cold volume){runs_note(kc, bc)}")
        for lever in sorted({r["lever"] for r in runs if r.get("engine") == "vllm" and r.get("who") == "kiln"
                             and r.get("lever")}):
            for vol, base in (("warm", bw), ("cold", bc)):
                k = latest(runs, "vllm", "kiln", vol, lever)
                if k:
                    lines.append(f"P15 kiln_over_engine_defaults_ready_{vol}[{lever}]={ratio(k, base)}{runs_note(k, base)}")
        if kw and kw.get("selftest", {}).get("share") is not None:
            lines.append(f"P15 selftest_share={kw['selftest']['share']}   (vLLM kiln-warm: the selftest phase / the boot)")
    lines += p9_lines(runs)
    st = latest(runs, "llamacpp", "kiln", "warm", "smollm2")
    if st and st.get("selftest", {}).get("share") is not None:
        lines.append(f"P9 selftest_share={st['selftest']['share']}   (llama.cpp kiln-warm:smollm2, the selftest / the boot)")
    return lines


# -- main ---------------------------------------------------------------------------------------------
DEFAULT_STEPS = {
    "vllm": "bare-cold,bare-warm,kiln-cold,kiln-warm",
    "llamacpp": "read-cold,bare-cold,kiln-cold,kiln-cold:lm-dio,kiln-cold:lm-none,bare-warm,kiln-warm",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_root(ap)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--engine", choices=("vllm", "llamacpp"))
    ap.add_argument("--steps", help="comma-separated steps (default per engine: see DEFAULT_STEPS)")
    ap.add_argument("--report", action="store_true", help="print the figures from ROOT/coldstart.json and stop")
    ap.add_argument("--vllm", help="vLLM: the `vllm` executable (default ROOT/bin/vllm)")
    ap.add_argument("--model", help="vLLM: the model directory (default ROOT/models/smollm2-bf16)")
    ap.add_argument("--prefix", help="llama.cpp: the llama-server prefix (default ROOT/h200)")
    ap.add_argument("--other-code", help="the lever other-code: Kiln's code from this checkout (a worktree of an "
                                         "earlier commit), to measure a change against the code before it")
    ap.add_argument("--gguf", help="llama.cpp: the model for P9 (default: made, --gguf-gib, in ROOT/models)")
    ap.add_argument("--gguf-gib", type=float, default=6.0, help="size of the random GGUF made for P9 (default 6)")
    ap.add_argument("--selftest-gguf", help="llama.cpp: a real model for the selftest's share (lever smollm2)")
    ap.add_argument("--snapshot", help="the engine's flag snapshot (default: taken from the engine's --help)")
    ap.add_argument("--model-args", type=json.loads, help="the model's args, for both sides (JSON list)")
    ap.add_argument("--rung-env", type=json.loads, default=None, help="environment for both sides (JSON object)")
    ap.add_argument("--family", default="smollm2", help="model.family: the selftest's probe set (default smollm2)")
    ap.add_argument("--no-selftest", dest="selftest", action="store_false",
                    help="Kiln's boots without the selftest (a model that cannot answer: a stand-in); llama.cpp's "
                         "P9 boots never run it (a random model), its lever smollm2 always does")
    ap.add_argument("--selftest-decode", type=int, help="[selftest] decode_tokens (default: Kiln's)")
    ap.add_argument("--selftest-prefill", type=int, help="[selftest] prefill_tokens (default: Kiln's)")
    ap.add_argument("--cpu", dest="gpu", action="store_false", help="llama.cpp: the CPU build (a dry run)")
    ap.add_argument("--no-drop", action="store_true", help="never drop the page cache (a dry run on a shared machine)")
    ap.add_argument("--read-variants", default="cat,seq,par4,par8",
                    help="how a read step reads the model (the P9 floor is the fastest by median): cat, seq (one "
                         "32 MiB buffer), parN (N ranges, N threads), once (the old denominator); default %(default)s")
    ap.add_argument("--rotate", type=int, default=0, metavar="N",
                    help="run the steps N times, each round starting one step later, each run marked with its round "
                         "(paired figures are by round)")
    ap.add_argument("--deadline", type=float, default=float(os.environ.get("KILN_DEADLINE", "0") or 0),
                    help="unix time after which no step starts that would not end by it (its kind's longest run so "
                         "far): a device call is cut at 10 minutes (default $KILN_DEADLINE, none)")
    ap.add_argument("--port", type=int, default=18180)
    ap.add_argument("--stall-s", type=float, default=120.0)
    ap.add_argument("--boot-deadline-s", type=float, default=420.0)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    a.root.mkdir(parents=True, exist_ok=True)
    results_path = a.root / "coldstart.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {"runs": []}
    if a.report:
        print("\n".join(report(results["runs"])))
        return 0
    if a.engine is None:
        ap.error("--engine vllm|llamacpp (or --report)")
    texts = (a.steps or DEFAULT_STEPS[a.engine]).split(",")
    steps = [parse_step(s, a.engine) for s in texts]
    if any(lever_spec(lever).get("code") for _, _, lever in steps) and \
            not (a.other_code and (Path(a.other_code) / "supervisor" / "__main__.py").is_file()):
        ap.error(f"the lever other-code needs --other-code DIR, a checkout of Kiln (DIR/supervisor/__main__.py); "
                 f"got {a.other_code!r}: git worktree add /tmp/before COMMIT")
    a.read_variants = a.read_variants.split(",")
    try:
        for v in a.read_variants:
            check_read_variant(v)
    except ValueError as e:
        ap.error(f"--read-variants: {e}")
    setup(a)
    if any(who == "kiln" for who, _, _ in steps):
        try:
            a.start = image_start(a.root / "image")
        except (Unavailable, OSError, subprocess.CalledProcessError) as e:
            sys.exit(f"coldstart: Kiln cannot be started as the image starts it: {e}")
        log(f"Kiln is started {a.start.described}")
    eng = Engine(a)
    plan = [(None, st, t) for st, t in zip(steps, texts)]
    if a.rotate:
        first = 1 + max((r["round"] for r in results["runs"] if isinstance(r.get("round"), int)), default=0)
        plan = [(first + i, steps[(i + j) % len(steps)], texts[(i + j) % len(steps)])
                for i in range(a.rotate) for j in range(len(steps))]
    took: dict[str, float] = {}
    for done, (rnd, (who, volume, lever), text) in enumerate(plan):
        need = took.get(text, 15.0)         # a kind not run yet in this call: a cold boot's length
        if a.deadline and time.time() + need > a.deadline:
            log(f"stopping before {text}: {len(plan) - done} steps left, {a.deadline - time.time():.0f} s to the "
                f"deadline and its last run took {need:.0f} s")
            break
        # file names in letters, digits, '.', '_' and '-' only (what comes back from the device)
        tag = f"{a.engine}-{text.replace(':', '-').replace('+', '_')}-{len(results['runs'])}"
        log(f"step {text}" + (f" (round {rnd})" if rnd is not None else ""))
        t0 = time.monotonic()
        if who == "read":
            rec = read_step(a, volume)
        elif who == "bare":
            rec = bare(a, eng, volume, lever, tag)
        else:
            rec = kiln(a, eng, volume, lever, tag)
        took[text] = max(took.get(text, 0.0), time.monotonic() - t0)
        rec.update(engine=a.engine, step=text, tag=tag, round=rnd, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        results["runs"].append(rec)
        results_path.write_text(json.dumps(results, indent=1, default=str))
        shutil.copy(results_path, a.out / "coldstart.json")
        said = ("read " + ", ".join(f"{k} {v} s" for k, v in rec["reads"].items())) if who == "read" \
            else f"ready {rec.get('ready_s')} s"
        log(f"{text}: {said}" + (f" ERROR {rec['error']}" if rec.get("error") else ""))
    print("\n".join(report(results["runs"])))
    return 0


def setup(a: argparse.Namespace) -> None:
    """Defaults that depend on the engine: binaries, the model, its args, the snapshot, the selftest."""
    if a.engine == "vllm":
        a.vllm = a.vllm or str(a.root / "bin" / "vllm")
        a.model = a.model or str(a.root / "models" / "smollm2-bf16")
        a.model_args = a.model_args or ["--max-model-len", "4096", "--gpu-memory-utilization", "0.85"]
        # flashinfer is not carried to the device (docs/research/device-plan-2026-12-01.md): both sides
        a.rung_env = {"VLLM_USE_FLASHINFER_SAMPLER": "0"} if a.rung_env is None else a.rung_env
        help_argv = [a.vllm, "serve", "--help=all"]
    else:
        a.prefix = a.prefix or str(a.root / "h200")
        if not a.gguf:
            path = a.root / "models" / f"p9-{a.gguf_gib:g}gib.gguf"
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                layers = max(2, round(a.gguf_gib / 6.3 * 28))       # 28 layers of width 3072: 6.3 GiB (2026-11-29)
                log(f"making a random GGUF of ~{a.gguf_gib:g} GiB ({layers} layers, width 3072)")
                # `gguf` is among the wheels carried into ROOT/site on the device (scripts/device/take.sh)
                site = [str(a.root / "site")] if (a.root / "site").is_dir() else []
                env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *site])}
                subprocess.run([sys.executable, "-m", "kiln_dev.models", "tiny", str(path) + ".part",
                                "--n-layers", str(layers), "--width", "3072", "--n-ff", "8192", "--n-vocab", "32000"],
                               env=env, check=True, stdout=subprocess.DEVNULL)
                os.replace(str(path) + ".part", path)
            a.gguf = str(path)
        # llama.cpp's own default placement is autofit (all layers on the GPU when they fit): no -ngl
        a.model_args = a.model_args or (["-c", "8192"] if a.gpu else ["-t", "2", "-c", "2048"])
        a.rung_env = a.rung_env or {}
        a.selftest = False               # a random model: the selftest would rightly fail it (lever smollm2)
        help_argv = [str(Path(a.prefix) / "bin" / "llama-server"), "--help"]
        shipped = Path(a.prefix) / "share" / "kiln" / "llama-server.help.txt"
        if not a.snapshot and shipped.exists():
            a.snapshot = str(shipped)
    if not a.snapshot:                    # taken once per root: vLLM's --help=all imports vLLM (~20 s)
        snap = a.root / f"{a.engine}-help.txt"
        if not snap.exists() or snap.stat().st_size == 0:
            with open(snap, "w") as f:
                subprocess.run(help_argv, stdout=f, stderr=subprocess.DEVNULL, timeout=300)
        a.snapshot = str(snap)


if __name__ == "__main__":
    stop_on_term()
    sys.exit(main())
