"""`python build.py plan` (issue 39) end to end: the model read from a local GGUF, from the Hub by
header ranges (the real huggingface_hub client against kiln_dev/hub, which stands for the Hub here) and
from a safetensors repo's config.json and index; RunPod's catalog from kiln_dev/runpod (the stand-in for
RunPod's REST API v2, its GPU type the document's own example: 48 GB, $0.44 secure, maxCount 8)."""

from __future__ import annotations

import json

import pytest

from images.cli.app import main
from images.plan import seed
from kiln_dev.gguf_kimi import make as make_kimi
from kiln_dev.hub import HubServer, client_env
from kiln_dev.models import make_tiny_gguf
from kiln_dev.runpod.api import RunPodStandIn, gpu_type
from supervisor.config import parse_config
from supervisor.model.gguf_layout import read_header, shards
from supervisor.plan import shape

KEY = "rpa_plan-canary-77"


@pytest.fixture
def runpod(monkeypatch):
    with RunPodStandIn(KEY) as s:
        monkeypatch.setenv("RUNPOD_API_KEY", KEY)
        monkeypatch.setenv("RUNPOD_API_URL", s.url)
        yield s


def _plan(capsys, *argv):
    rc = main(["plan", *argv, "--json"])
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if out.out.strip() else None), out.err


def test_a_local_gguf_plans_one_a40_with_the_engines_own_figures(runpod, tmp_path, capsys):
    m = make_tiny_gguf(tmp_path / "moe.gguf", n_layers=4, width=128, n_ff=64, n_expert=16, n_expert_used=2)
    rc, doc, _ = _plan(capsys, "--model", str(m), "--ctx", "4096")     # its context_length
    assert rc == 0
    s = shape.from_gguf([read_header(m)])
    assert doc["model"]["weights_bytes"] == s.weights_bytes > 0
    assert doc["model"]["kv_bytes_per_token"] == s.cache_elements_per_token * 2       # f16
    assert doc["model"]["weights_by_kind"]["routed_experts"] > 0
    first = doc["plans"][0]
    assert (first["gpu"], first["count"], first["resident"]) == ("NVIDIA A40", 1, True)
    assert first["command"] == "python build.py pods up --target a40-llamacpp-upstream --config moe.toml"
    assert first["commands"][0].endswith("--gpu 'NVIDIA A40' --count 1 --write-config moe.toml")
    assert "[hardware]\ngpu_count = 1" in first["deploy_config"] and 'gpu = "NVIDIA A40"' in first["deploy_config"]
    assert 'placement = "autofit"' in first["deploy_config"] and "-ngl" not in first["deploy_config"]
    parse_config(first["deploy_config"], env={})
    assert first["usd_per_1m"] is not None and first["speed_basis"].startswith("estimate: calibrated on") and "bound" in first["speed_basis"]


@pytest.mark.parametrize("storage", ["lfs", "xet"])
def test_an_hf_gguf_is_read_by_header_ranges_never_the_whole_file(runpod, tmp_path, capsys, storage):
    big = make_tiny_gguf(tmp_path / "big.gguf", n_layers=4, width=512, n_vocab=2000)          # ~38 MB
    first = make_kimi("llama_split", tmp_path / "split" / "tiny.gguf")                          # two shards
    files = {"big.gguf": big.read_bytes()} | {f"split/{p.name}": p.read_bytes() for p in shards(first)}
    with HubServer(tmp_path / "hub") as hub, client_env(hub, tmp_path / "home"):
        hub.seed("kiln-test/tiny-GGUF", files, storage=storage)
        rc, doc, _ = _plan(capsys, "--model", "hf://kiln-test/tiny-GGUF/big.gguf")
        assert rc == 0
        assert doc["model"]["weights_bytes"] == shape.from_gguf([read_header(big)]).weights_bytes
        gets = [r for r in hub.log if r.route in ("resolve_get", "cdn_get")]
        assert gets and all(r.range for r in gets), "every read is a range"
        read = sum(int(b) - int(a) + 1 for r in gets if r.route == "cdn_get"
                   for a, b in [r.range.removeprefix("bytes=").split("-")])
        assert read < big.stat().st_size / 10
        assert sum(hub.bytes_served.values()) < big.stat().st_size / 10

        rc, doc, _ = _plan(capsys, "--model", f"hf://kiln-test/tiny-GGUF/split/{first.name}")
        assert rc == 0
        cfg = parse_config(doc["plans"][0]["deploy_config"], env={})
        assert cfg.model.entry == f"split/{first.name}" and len(cfg.model.allow_patterns) == 2
        assert doc["model"]["weights_bytes"] == shape.from_gguf([read_header(p) for p in shards(first)]).weights_bytes


def _safetensors_repo(hub, repo, cfg, total):
    index = {"metadata": {"total_size": total}, "weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"}}
    hub.seed(repo, {"config.json": json.dumps(cfg).encode(), "model.safetensors.index.json": json.dumps(index).encode()})


def test_the_seeds_qwen3_coder_awq_on_one_a40_is_under_20_cents_per_million_at_32_streams(runpod, tmp_path, capsys):
    with HubServer(tmp_path / "hub") as hub, client_env(hub, tmp_path / "home"):
        _safetensors_repo(hub, "kiln-test/Qwen3-Coder-30B-A3B-Instruct-AWQ", seed.QWEN3_CODER_CONFIG,
                          seed.QWEN3_CODER_AWQ_BYTES)
        rc, doc, _ = _plan(capsys, "--model", "hf://kiln-test/Qwen3-Coder-30B-A3B-Instruct-AWQ", "--ctx", "262144",
                           "--kv-type", "fp8", "--streams", "32")
    assert rc == 0
    assert doc["model"]["kv_bytes_per_token"] * 262144 == 12 * 2**30          # the field notes' "KV 12 GiB@256k"
    best = doc["plans"][0]
    assert (best["gpu"], best["count"], best["resident"]) == ("NVIDIA A40", 1, True)
    assert best["speed_measured"] and best["usd_per_1m"] < 0.20
    assert "--kv-cache-dtype" in best["deploy_config"] and "--tensor-parallel-size" not in best["deploy_config"]
    assert "--target a40-vllm " in best["command"]          # the target serving this model family
    cfg = parse_config(best["deploy_config"], env={})                   # a deploy config Kiln accepts,
    assert cfg.plan.decode_tok_s == 77.6 and cfg.plan.kv_tokens > 0     # carrying what the pod checks itself against


def test_kimi_linear_at_a_million_tokens_fits_one_a40(runpod, tmp_path, capsys):
    with HubServer(tmp_path / "hub") as hub, client_env(hub, tmp_path / "home"):
        _safetensors_repo(hub, "kiln-test/Kimi-Linear-48B-A3B-Instruct-AWQ-4bit", seed.KIMI_LINEAR_CONFIG,
                          seed.KIMI_LINEAR_AWQ_BYTES)
        rc, doc, _ = _plan(capsys, "--model", "hf://kiln-test/Kimi-Linear-48B-A3B-Instruct-AWQ-4bit",
                           "--ctx", "1048576")
    assert rc == 0
    assert doc["model"]["cache_layers"] == 7 and doc["model"]["kv_bytes_per_token"] == 7 * 576 * 2
    assert (doc["plans"][0]["count"], doc["plans"][0]["resident"]) == (1, True)


def test_a_model_no_catalog_gpu_holds_says_why_and_what_would(runpod, tmp_path, capsys):
    with HubServer(tmp_path / "hub") as hub, client_env(hub, tmp_path / "home"):
        _safetensors_repo(hub, "kiln-test/huge", seed.QWEN3_CODER_CONFIG, 900 * 2**30)
        rc, doc, err = _plan(capsys, "--model", "hf://kiln-test/huge")
    assert rc == 1 and not any(p["resident"] for p in doc["plans"])
    assert "smaller quantization" in doc["no_fit"] and "no resident plan" in err


@pytest.mark.parametrize("argv, words", [
    (["--model", "/nonexistent/x.gguf"], ["--model /nonexistent/x.gguf", "no such file"]),
    (["--model", "hf://only-owner"], ["hf://OWNER/REPO"]),
    (["--gpu", "NVIDIA B999"], ["--gpu NVIDIA B999", "NVIDIA A40"]),
    (["--ctx", "0"], ["--ctx 0", "at least 1"]),
    (["--engine", "vllm"], ["--engine vllm", "safetensors"]),
    (["--kv-type", "bogus"], ["--kv-type bogus", "q8_0"]),
])
def test_bad_input_is_one_line_naming_the_field(runpod, tmp_path, capsys, argv, words):
    m = make_tiny_gguf(tmp_path / "m.gguf")
    full = argv if argv[0] == "--model" else ["--model", str(m), *argv]
    rc = main(["plan", *full])
    err = capsys.readouterr().err
    assert rc == 2 and all(w in err for w in words), err


def test_a_hub_that_does_not_answer_is_one_line_naming_the_source(runpod, tmp_path, capsys):
    # No network, a DNS failure, a Hub down: huggingface_hub's transport error is no OSError, and it
    # reached the user as "unexpected ConnectError ... (a bug in Kiln)".
    with HubServer(tmp_path / "hub") as hub:
        hub.seed("kiln-test/tiny", {"m.gguf": make_tiny_gguf(tmp_path / "m.gguf").read_bytes()})
    with client_env(hub, tmp_path / "home"):                 # the Hub's port is closed now
        for src in ("hf://kiln-test/tiny/m.gguf", "hf://kiln-test/tiny"):
            rc = main(["plan", "--model", src])
            err = capsys.readouterr().err
            assert rc == 2 and f"--model {src}" in err and "the Hub did not answer (ConnectError" in err, err
            assert "a bug in Kiln" not in err


def test_a_price_cap_that_leaves_no_plan_says_so_not_that_nothing_holds_the_model(runpod, tmp_path, capsys):
    # One A40 ($0.44/h in the stand-in's catalog) holds it; --max-usd-h 0.1 allows none. It said no
    # catalog GPU holds the model and offered a context of 15M tokens that "would leave room".
    m = make_tiny_gguf(tmp_path / "m.gguf")
    rc, doc, err = _plan(capsys, "--model", str(m), "--max-usd-h", "0.1")
    assert rc == 1 and doc["plans"] == []
    assert doc["no_fit"].startswith("--max-usd-h 0.1: ") and "1x NVIDIA A40 at $0.44/h" in doc["no_fit"], doc
    assert "tokens would leave room" not in doc["no_fit"] and "no resident plan: --max-usd-h 0.1" in err


def test_a_community_plan_prints_the_command_that_rents_community(runpod, tmp_path, capsys):
    # --cloud community priced the community rate, but its "exact" pods up command left --cloud out:
    # run as printed, it rented SECURE (pods up's default) at the higher rate.
    m = make_tiny_gguf(tmp_path / "m.gguf")
    rc, community, _ = _plan(capsys, "--model", str(m), "--cloud", "community")
    rc_secure, secure, _ = _plan(capsys, "--model", str(m))
    assert rc == rc_secure == 0 and community["plans"][0]["usd_h"] < secure["plans"][0]["usd_h"]
    assert community["plans"][0]["command"].endswith(" --cloud COMMUNITY"), community["plans"][0]["command"]
    assert "--cloud" not in secure["plans"][0]["command"]             # SECURE is pods up's default


def test_no_fit_on_the_community_cloud_counts_the_community_maximum(runpod, tmp_path, capsys):
    # The largest pod is maxCount of the cloud asked for (the stand-in's A40: 8 secure, 4 community).
    with HubServer(tmp_path / "hub") as hub, client_env(hub, tmp_path / "home"):
        _safetensors_repo(hub, "kiln-test/huge", seed.QWEN3_CODER_CONFIG, 900 * 2**30)
        rc, doc, _ = _plan(capsys, "--model", "hf://kiln-test/huge", "--cloud", "community")
    assert rc == 1 and "the largest pod in the catalog has 179 GiB of VRAM" in doc["no_fit"], doc["no_fit"]


def test_a_gguf_without_weights_is_refused_not_planned_at_a_trillion_tokens_per_second(runpod, tmp_path, capsys):
    # A vocab-only GGUF (llama.cpp ships them under models/) has no tensors: it was planned at
    # 6.96e+11 tok/s and $0.000/1M, a bandwidth bound divided by zero bytes.
    import gguf

    path = tmp_path / "vocab-only.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    rc = main(["plan", "--model", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and f"--model {path}: " in err and "no weights" in err, err


# -- issue 49: the model's trained context, an image for every GPU kind, the config written --------------
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32,
             "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
             "vocab_size": 128256, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}   # its config.json's shape


def test_plan_never_plans_past_the_models_trained_context(runpod, tmp_path, capsys):
    # Was: Llama-3-8B got rungs of --max-model-len 32768 and 16384, which the real vLLM refuses.
    with HubServer(tmp_path / "hub") as hub, client_env(hub, tmp_path / "home"):
        _safetensors_repo(hub, "kiln-test/Meta-Llama-3-8B", LLAMA3_8B, 16 * 10**9)
        rc, doc, _ = _plan(capsys, "--model", "hf://kiln-test/Meta-Llama-3-8B")
        assert rc == 0 and doc["model"]["ctx"] == 8192 and doc["model"]["trained_ctx"] == 8192
        cfg = parse_config(doc["plans"][0]["deploy_config"], env={})
        assert [r.args[r.args.index("--max-model-len") + 1] for r in cfg.ladder.rungs] == ["8192", "4096"]
        assert any("what the model was trained for (config.json max_position_embeddings 8,192)" in n
                   for n in doc["notes"])
        rc = main(["plan", "--model", "hf://kiln-test/Meta-Llama-3-8B", "--ctx", "8000000"])
        err = capsys.readouterr().err
        assert rc == 2 and "--ctx 8,000,000: the model was trained for at most 8,192 tokens" in err
        assert "Fix: --ctx 8192 or less" in err


def test_a_gpu_kind_no_image_serves_says_which_target_to_add(runpod, tmp_path, capsys):
    runpod.catalog.append(gpu_type("NVIDIA H100 80GB HBM3", memory=80, price=(2.69, 1.99)))
    m = make_tiny_gguf(tmp_path / "dense.gguf", n_layers=2, width=64)
    rc, doc, _ = _plan(capsys, "--model", str(m), "--gpu", "NVIDIA H100 80GB HBM3")
    assert rc == 0
    (h100,) = doc["plans"]
    assert h100["command"] == ""
    assert h100["commands"][1].startswith("# no Kiln image runs llamacpp on NVIDIA H100 80GB HBM3 (compute "
                                          "capability 9.0): copy images/targets/a40-llamacpp-upstream.toml")
    assert 'archs = ["90"]' in h100["commands"][1] and "Add a target" in h100["commands"][1]


def test_write_config_writes_the_plan_and_never_a_users_file(runpod, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    m = make_tiny_gguf(tmp_path / "dense.gguf", n_layers=2, width=64)
    mine = tmp_path / "mine.toml"
    mine.write_text("# my own config\n")
    rc = main(["plan", "--model", str(m), "--gpu", "NVIDIA A40", "--count", "1", "--write-config", str(mine)])
    assert rc == 2 and "the file exists and `plan` did not write it" in capsys.readouterr().err
    assert mine.read_text() == "# my own config\n"
    rc, doc, _ = _plan(capsys, "--model", str(m), "--gpu", "NVIDIA A40", "--count", "1", "--write-config", "dense.toml")
    assert rc == 0 and doc["written"] == "dense.toml"
    written = (tmp_path / "dense.toml").read_text()
    assert written.rstrip("\n") == doc["plans"][0]["deploy_config"].rstrip("\n")
    assert doc["plans"][0]["commands"] == ["python build.py pods up --target a40-llamacpp-upstream --config dense.toml"]
    cfg = parse_config(written, env={})
    assert (cfg.plan.gpu, cfg.plan.cards, cfg.hardware.gpu_count) == ("NVIDIA A40", 1, 1)
    again = main(["plan", "--model", str(m), "--gpu", "NVIDIA A40", "--count", "1", "--write-config", "dense.toml"])
    assert again == 0                                   # its own file: written again


def _safetensors_file(tensors: dict[str, int]) -> bytes:
    """A real safetensors file: its header (8 bytes of length, then JSON) and each tensor's bytes (U8)."""
    head, at = {}, 0
    for name, n in tensors.items():
        head[name] = {"dtype": "U8", "shape": [n], "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(head).encode()
    return len(raw).to_bytes(8, "little") + raw + bytes(at)


def test_a_safetensors_moe_counts_only_the_experts_a_token_uses(runpod, tmp_path, capsys):
    # Before: every expert counted as read per token (Qwen3-Coder-30B-A3B AWQ: "upper bound 38.4 tok/s" on
    # an A40 where the field notes measured 77.6). Now each shard's header is read by range and a token
    # reads the shared weights and 8 of 128 experts.
    cfg = dict(seed.QWEN3_CODER_CONFIG, num_experts=128, num_experts_per_tok=8, num_hidden_layers=2)
    shard_a = {"model.embed_tokens.weight": 4000, "model.layers.0.self_attn.q_proj.qweight": 1000,
               "model.layers.0.mlp.gate.weight": 64,
               **{f"model.layers.0.mlp.experts.{e}.down_proj.qweight": 100 for e in range(128)}}
    shard_b = {"model.layers.1.self_attn.q_proj.qweight": 1000, "lm_head.weight": 4000,
               **{f"model.layers.1.mlp.experts.{e}.down_proj.qweight": 100 for e in range(128)}}
    files = {"model-00001-of-00002.safetensors": shard_a, "model-00002-of-00002.safetensors": shard_b}
    index = {"metadata": {"total_size": sum(sum(t.values()) for t in files.values())},
             "weight_map": {t: f for f, ts in files.items() for t in ts}}
    with HubServer(tmp_path / "hub") as hub, client_env(hub, tmp_path / "home"):
        hub.seed("kiln-test/moe-awq", {"config.json": json.dumps(cfg).encode(),
                                       "model.safetensors.index.json": json.dumps(index).encode(),
                                       **{f: _safetensors_file(t) for f, t in files.items()}})
        rc, doc, err = _plan(capsys, "--model", "hf://kiln-test/moe-awq", "--ctx", "4096")
    assert rc == 0, err
    kinds = doc["model"]["weights_by_kind"]
    assert kinds["routed_experts"] == 2 * 128 * 100 and kinds["embeddings"] == 8000 and kinds["attention"] == 2000
    assert kinds["other"] == 64                                                    # the router
    assert doc["model"]["active_bytes"] == 8000 + 2000 + 64 + 2 * 8 * 100
    assert not any("counted as read" in n for n in doc["model"]["notes"])
