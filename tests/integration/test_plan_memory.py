"""P17 as a test (issue 39): the plan's memory arithmetic (supervisor/plan/) within 5 % of what the real
engines say they allocated — llama-server's own model and KV buffer sizes for a real model and random
GGUFs of several shapes (dense, GQA, MoE with many experts, the Kimi hybrids whose MLA layers alone
cache) at three contexts, and the real vLLM CPU build's KV cache token count."""

from __future__ import annotations

import json

import pytest

from kiln_dev.engine_memory import llama_load_log, vllm_load_log
from kiln_dev.gguf_kimi import make as make_kimi
from kiln_dev.models import make_tiny_gguf, smollm2_gguf
from kiln_dev.vllm_cpu import require_model
from supervisor.model.gguf_layout import read_header, shards
from supervisor.plan import engine_log, memory, shape

GOAL_PCT = 5.0
MIB = 1 << 20


def _model(kind, tmp):
    if kind == "smollm2":
        return smollm2_gguf()
    if kind == "dense-f32":
        return make_tiny_gguf(tmp / "m.gguf", n_layers=3, width=256, dtype="f32")
    if kind == "gqa":
        return make_tiny_gguf(tmp / "m.gguf", n_layers=6, width=512, n_heads=8, n_kv_heads=2, n_vocab=2000)
    if kind == "moe-64-experts":
        return make_tiny_gguf(tmp / "m.gguf", n_layers=4, width=128, n_ff=64, n_heads=4, n_kv_heads=2,
                              n_expert=64, n_expert_used=4)
    return make_kimi(kind, tmp / "m.gguf")


def _pct(pred, real):
    return abs(pred - real) / real * 100


@pytest.mark.parametrize("kind", ["smollm2", "dense-f32", "gqa", "moe-64-experts", "kimi_linear", "kimi_k3"])
def test_model_and_kv_buffers_match_the_real_llama_server(kind, tmp_path):
    path = _model(kind, tmp_path)
    s = shape.from_gguf([read_header(p) for p in shards(path)])
    for ctx in (4096, 16384, 65536):
        got = engine_log.llama_buffers(llama_load_log(path, ctx=ctx))
        assert got is not None, f"{kind} at {ctx}: llama-server logged no buffer sizes"
        est = memory.llamacpp(s, ctx)
        assert _pct(est.weights_bytes / MIB, got.model_mib) <= GOAL_PCT, (kind, ctx, est.weights_bytes / MIB, got)
        assert _pct(est.kv_bytes / MIB, got.kv_mib) <= GOAL_PCT, (kind, ctx, est.kv_bytes / MIB, got)


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_a_quantized_kv_cache_matches_the_real_llama_server(kv_type):
    path = smollm2_gguf()
    s = shape.from_gguf([read_header(path)])
    got = engine_log.llama_buffers(llama_load_log(path, ctx=16384, extra=("--cache-type-k", kv_type,
                                                                          "--cache-type-v", kv_type)))
    est = memory.llamacpp(s, 16384, kv_type=kv_type)
    assert got is not None and _pct(est.kv_bytes / MIB, got.kv_mib) <= GOAL_PCT, (kv_type, est.kv_bytes / MIB, got)
    assert est.kv_bytes < memory.llamacpp(s, 16384).kv_bytes             # and smaller than f16's


def test_the_hybrids_cache_only_their_mla_layers_and_no_v(tmp_path):
    s = shape.from_gguf([read_header(make_kimi("kimi_linear", tmp_path / "kl.gguf"))])
    assert s.cache_layers == 1 and s.n_layers == 4          # KDA, KDA, KDA, MLA
    assert not any(s.cache_v)                                # MLA reads V as a view of the latent


def test_kv_tokens_match_the_real_vllm_cpu_build():
    model = require_model("tiny")
    s = shape.from_config(json.loads((model / "config.json").read_text()), weights_bytes=0)
    real = engine_log.vllm_kv_tokens(vllm_load_log(model, kv_space_gib=1))
    assert real is not None
    assert _pct(memory.vllm_cpu_kv_tokens(s, 1), real) <= GOAL_PCT, (memory.vllm_cpu_kv_tokens(s, 1), real)
