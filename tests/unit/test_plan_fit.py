"""Per-card placement (supervisor/plan/fit.py, issue 39): the rules the field notes' figures do not reach."""

from __future__ import annotations

from supervisor.plan import fit, memory
from supervisor.plan.shape import KINDS, Shape

GIB = 1 << 30


def _shape(*, tied: bool, mla: bool = False) -> Shape:
    kinds = dict.fromkeys(KINDS, 0)
    kinds["other"] = 8 * GIB
    kinds["embeddings"] = 1 * GIB if tied else 2 * GIB          # token_embd (+ output.weight unless tied)
    return Shape(architecture="t", n_layers=8, cache_k=(512,) * 8, cache_v=(0 if mla else 512,) * 8,
                 weights_by_kind=kinds, layer_bytes=(GIB,) * 8, host_input_bytes=GIB, hidden=1024, vocab=32000,
                 n_ff=4096)


def test_tied_embeddings_put_a_copy_of_token_embd_on_the_last_card():
    for tied in (True, False):
        s = _shape(tied=tied)
        p = fit.llamacpp(s, memory.llamacpp(s, 4096), count=1, card_bytes=40 * GIB)
        est = memory.llamacpp(s, 4096)
        assert p.resident
        assert p.per_card_bytes[0] == 8 * GIB + GIB + est.kv_bytes + est.compute_bytes     # output or its copy


def test_a_model_that_misses_by_a_layer_runs_that_layer_on_the_host():
    s = _shape(tied=False)
    est = memory.llamacpp(s, 4096)
    p = fit.llamacpp(s, est, count=1, card_bytes=9 * GIB)
    assert not p.resident and p.host_layers and "do not fit" in p.why


def test_vllm_tensor_parallelism_splits_gqa_kv_but_not_an_mla_latent():
    gqa, mla = _shape(tied=False), _shape(tied=False, mla=True)
    for s, split in ((gqa, True), (mla, False)):
        est = memory.vllm(s, 1 << 20)
        one = fit.vllm(s, est, count=1, card_bytes=80 * GIB, utilization=0.9).per_card_bytes[0]
        two = fit.vllm(s, est, count=2, card_bytes=80 * GIB, utilization=0.9).per_card_bytes[0]
        kv_per_card = two - est.weights_bytes // 2 - est.compute_bytes
        assert kv_per_card == (est.kv_bytes // 2 if split else est.kv_bytes)
        assert two < one
