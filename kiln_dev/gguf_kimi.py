"""Tiny GGUF models of the architectures issue 17 is about, written by the pinned llama.cpp's own
gguf-py (its MODEL_ARCH names, its key names, its GGUFWriter) so a real llama-server from the same
sdist can load them. Random weights, real layouts; nothing is mocked.

Which real file each stands for:

    kimi_k3        mmnga-o/Kimi-K3-REAP50-Width50-UD-gguf, UD-IQ1_S (the field notes' 181 GiB model):
                   architecture kimi-k3, hybrid KDA (linear) + MLA (full) attention layers, a dense
                   first layer, latent MoE with routed experts at HALF the usual width ratio
                   (expert_feed_forward_length / expert_latent_length = 12/28 = 1536/3584, where
                   Kimi-K3 itself has 3072/3584), shared experts, attention residuals, situ.
    kimi_linear    a llama.cpp conversion of moonshotai/Kimi-Linear-48B-A3B-Instruct (architecture
                   kimi-linear: KDA + MLA, a dense first layer, MoE, shared experts).
    dspark         a DSpark draft for a target of this vocabulary as llama.cpp's own converter writes
                   one (architecture dflash: target_layers, block_size, markov_w1/markov_w2).
    dspark_seed_arch           the field notes' blocker 2: general.architecture "dflash-draft" (and its
                               keys under dflash-draft.*), where llama.cpp registers "dflash".
    dspark_seed_no_target_layers  blocker 3a, after the rename: no dflash.target_layers.
    dspark_seed_tensor_names   blocker 3b: the third-party converter's tensor names
                               dflash.dspark.markov.w1/.w2 (.weight) where llama.cpp expects markov_w1.
    dspark_seed_original       the published draft as the field notes first met it: all three at once.
    llama_split    a sharded GGUF as the Hub serves big models (<name>-00001-of-00002.gguf, ...): the
                   tiny llama of kiln_dev/models.py in two shards with split.* keys.

The pinned gguf-py is not the installed `gguf` (an older release without kimi-k3 or dflash), so
each file is written by a child process that imports `gguf` from the pinned tree's gguf-py:

    make("kimi_k3", OUT.gguf)                                        # from tests: returns the path
    python -m kiln_dev.gguf_kimi KIND OUT.gguf --gguf-py DIR    # the child make() runs
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

REPO_ROOT = Path(__file__).resolve().parents[1]
KINDS = ("kimi_k3", "kimi_linear", "dspark", "dspark_seed_arch", "dspark_seed_no_target_layers",
         "dspark_seed_tensor_names", "dspark_seed_original", "llama_split")
SEED_KINDS = ("dspark_seed_arch", "dspark_seed_no_target_layers", "dspark_seed_tensor_names")

# Shapes (ggml order: dims[0] fastest). One small model per architecture; every size is a real
# hyper-parameter of the architecture at toy scale.
N_VOCAB = 900
N_EMBD = 64
N_HEAD = 2
KDA_HEAD_DIM = 16          # d_inner = 32
CONV_KERNEL = 4
KV_LORA_RANK = 16
QK_NOPE, QK_ROPE, V_HEAD = 16, 8, 16
N_FF_DENSE = 128
N_EXPERT, N_EXPERT_USED = 4, 2
EXPERT_LATENT = 28         # Kimi-K3: 3584
EXPERT_FF_K3 = 24          # Kimi-K3: 3072 (24/28 == 3072/3584)
EXPERT_FF_WIDTH50 = 12     # Width50: 1536, half the ratio
EXPERT_FF_LINEAR = 16
SEED_MARKOV_NAMES = ("dflash.dspark.markov.w1.weight", "dflash.dspark.markov.w2.weight")


# -- from tests: run the child ------------------------------------------------------------------
def pinned_gguf_py() -> Path:
    """gguf-py of the sdist the real CPU llama-server is compiled from (cpu-llamacpp's source)."""
    from images.generate.facts import source_tree
    from images.pins.lock import load_lock, pins_for
    from images.target import load_target

    target = load_target("cpu-llamacpp")
    return source_tree(target, pins_for(target, load_lock())) / "gguf-py"


def make(kind: str, path: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Write `kind` at `path` (llama_split: beside it, as <stem>-0000i-of-00002.gguf); returns the file
    the engine is given (a split model's first shard)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "kiln_dev.gguf_kimi", kind, str(path), "--seed", str(seed),
                        "--gguf-py", str(pinned_gguf_py())],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"writing {kind} failed:\n{r.stderr[-3000:]}")
    return Path(r.stdout.strip().splitlines()[0])


# -- in the child: the pinned gguf-py is `gguf` ---------------------------------------------------
class _Model:
    """A plan of tensors (name, ggml dims, init) written in one streaming pass."""

    def __init__(self, path: Path, arch: str, seed: int, *, split_max_tensors: int = 0):
        import gguf
        import numpy as np

        self.gguf, self.np = gguf, np
        self.w = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
        self.split = split_max_tensors
        self.seed = seed
        self.tensors: list[tuple[str, tuple[int, ...], str]] = []

    def t(self, name: str, *dims: int, init: str = "rand") -> None:
        self.tensors.append((name, dims, init))

    def vocab(self) -> None:
        from kiln_dev.models import add_vocab

        add_vocab(self.w, N_VOCAB)

    def _data(self, i: int, dims: tuple[int, ...], init: str) -> Any:
        np = self.np
        shape = tuple(reversed(dims))                      # numpy order
        if init == "ones":
            return np.ones(shape, dtype=np.float32)
        if init == "neg":                                  # ssm_a holds -exp(A_log): negative
            return -np.ones(shape, dtype=np.float32)
        rng = np.random.default_rng([self.seed, i])
        scale = 1.0 if init == "embd" else 0.1
        return ((rng.random(shape, dtype=np.float32) - 0.5) * scale).astype(np.float32)

    def write(self) -> None:
        w, np = self.w, self.np
        w.add_file_type(self.gguf.LlamaFileType.ALL_F32)
        if self.split:
            # gguf-py's split writer takes whole tensors (fine at this size) and writes split.* keys.
            for i, (name, dims, init) in enumerate(self.tensors):
                w.add_tensor(name, self._data(i, dims, init))
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
            return
        for name, dims, _ in self.tensors:
            n = int(np.prod(dims))
            w.add_tensor_info(name, tuple(reversed(dims)), np.dtype(np.float32), n * 4)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for i, (_, dims, init) in enumerate(self.tensors):
            w.write_tensor_data(self._data(i, dims, init))
        w.close()


def _kda_layer(m: _Model, b: str, *, k3: bool) -> None:
    d_inner = KDA_HEAD_DIM * N_HEAD
    for q in ("q", "k", "v"):
        m.t(f"{b}ssm_conv1d_{q}.weight", CONV_KERNEL, 1, d_inner, 1)
        m.t(f"{b}attn_{q}.weight", N_EMBD, d_inner)
    m.t(b + "ssm_f_a.weight", N_EMBD, KDA_HEAD_DIM)
    m.t(b + "ssm_f_b.weight", KDA_HEAD_DIM, d_inner)
    m.t(b + "ssm_beta.weight", N_EMBD, N_HEAD)
    if k3:
        m.t(b + "ssm_a", N_HEAD, init="neg")                 # K3: plain 1-D [n_head]
        m.t(b + "ssm_g.weight", N_EMBD, d_inner)             # K3: one full-rank gate
    else:
        m.t(b + "ssm_a", 1, N_HEAD, 1, 1, init="neg")
        m.t(b + "ssm_g_a.weight", N_EMBD, KDA_HEAD_DIM)
        m.t(b + "ssm_g_b.weight", KDA_HEAD_DIM, d_inner)
    m.t(b + "ssm_dt.bias", d_inner)
    m.t(b + "ssm_norm.weight", KDA_HEAD_DIM, init="ones")
    m.t(b + "attn_output.weight", d_inner, N_EMBD)


def _mla_layer(m: _Model, b: str, *, k3: bool) -> None:
    m.t(b + "attn_kv_a_norm.weight", KV_LORA_RANK, init="ones")
    m.t(b + "attn_q.weight", N_EMBD, N_HEAD * (QK_NOPE + QK_ROPE))
    m.t(b + "attn_kv_a_mqa.weight", N_EMBD, KV_LORA_RANK + QK_ROPE)
    m.t(b + "attn_k_b.weight", QK_NOPE, KV_LORA_RANK, N_HEAD)        # kv_b split, as the converter does
    m.t(b + "attn_v_b.weight", KV_LORA_RANK, V_HEAD, N_HEAD)
    if k3:
        m.t(b + "attn_gate.weight", N_EMBD, N_HEAD * V_HEAD)          # K3's sigmoid output gate
    m.t(b + "attn_output.weight", N_HEAD * V_HEAD, N_EMBD)


def _ffn(m: _Model, b: str, dense: bool, *, n_ff_exp: int, latent: int | None) -> None:
    if dense:
        m.t(b + "ffn_gate.weight", N_EMBD, N_FF_DENSE)
        m.t(b + "ffn_down.weight", N_FF_DENSE, N_EMBD)
        m.t(b + "ffn_up.weight", N_EMBD, N_FF_DENSE)
        return
    width = latent or N_EMBD
    m.t(b + "ffn_gate_inp.weight", N_EMBD, N_EXPERT)
    m.t(b + "exp_probs_b.bias", N_EXPERT)
    m.t(b + "ffn_gate_exps.weight", width, n_ff_exp, N_EXPERT)
    m.t(b + "ffn_down_exps.weight", n_ff_exp, width, N_EXPERT)
    m.t(b + "ffn_up_exps.weight", width, n_ff_exp, N_EXPERT)
    if latent:
        m.t(b + "ffn_routed_down.weight", N_EMBD, latent)
        m.t(b + "ffn_routed_up.weight", latent, N_EMBD)
        m.t(b + "ffn_routed_norm.weight", latent, init="ones")
    m.t(b + "ffn_gate_shexp.weight", N_EMBD, n_ff_exp)
    m.t(b + "ffn_down_shexp.weight", n_ff_exp, N_EMBD)
    m.t(b + "ffn_up_shexp.weight", N_EMBD, n_ff_exp)


# KDA, KDA, KDA, MLA: Kimi's 3:1 hybrid (the MLA layers are the 1-indexed multiples of 4)
LAYERS = ("kda", "kda", "kda", "mla")


def _kimi(path: Path, seed: int, *, k3: bool) -> None:
    import gguf

    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.KIMI_K3 if k3 else gguf.MODEL_ARCH.KIMI_LINEAR]
    m = _Model(path, arch, seed)
    w = m.w
    w.add_name("kiln-tiny-kimi-k3-width50" if k3 else "kiln-tiny-kimi-linear")
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(len(LAYERS))
    w.add_feed_forward_length(N_FF_DENSE)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv([1 if kind == "mla" else 0 for kind in LAYERS])   # 0 marks a KDA layer
    w.add_layer_norm_rms_eps(1e-5)
    w.add_ssm_conv_kernel(CONV_KERNEL)
    w.add_kda_head_dim(KDA_HEAD_DIM)
    w.add_kv_lora_rank(KV_LORA_RANK)
    w.add_rope_dimension_count(QK_ROPE)
    w.add_key_length(KV_LORA_RANK + QK_ROPE)
    w.add_value_length(KV_LORA_RANK)
    w.add_key_length_mla(QK_NOPE + QK_ROPE)
    w.add_value_length_mla(V_HEAD)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_EXPERT_USED)
    w.add_expert_shared_count(1)
    w.add_leading_dense_block_count(1)
    w.add_expert_weights_scale(2.5)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    n_ff_exp = EXPERT_FF_WIDTH50 if k3 else EXPERT_FF_LINEAR
    w.add_expert_feed_forward_length(n_ff_exp)
    latent = None
    if k3:
        latent = EXPERT_LATENT
        w.add_expert_weights_norm(True)
        w.add_expert_latent_length(latent)
        w.add_kda_gate_lower_bound(-5.0)
        w.add_activation_situ_beta(2.0)
        w.add_activation_situ_linear_beta(4.0)
        w.add_attn_res_block_size(2)
    m.vocab()

    m.t("token_embd.weight", N_EMBD, N_VOCAB, init="embd")
    for i, kind in enumerate(LAYERS):
        b = f"blk.{i}."
        m.t(b + "attn_norm.weight", N_EMBD, init="ones")
        m.t(b + "ffn_norm.weight", N_EMBD, init="ones")
        if k3:
            m.t(b + "attn_res_score.weight", N_EMBD)
            m.t(b + "ffn_res_score.weight", N_EMBD)
        (_kda_layer if kind == "kda" else _mla_layer)(m, b, k3=k3)
        _ffn(m, b, dense=i == 0, n_ff_exp=n_ff_exp, latent=latent)
    m.t("output_norm.weight", N_EMBD, init="ones")
    if k3:
        m.t("output_res_score.weight", N_EMBD)
    m.t("output.weight", N_EMBD, N_VOCAB)
    m.write()


DSPARK_TARGET_LAYERS = (1, 2)      # target hidden states the draft reads (converter: ids + 1)
DSPARK_HEAD_DIM = 32
MARKOV_RANK = 16


def _dspark(path: Path, seed: int, *, arch: str = "dflash", target_layers: bool = True,
            seed_names: bool = False) -> None:
    """A one-layer DFlash draft with a DSpark Markov head; the flags reproduce the field notes' file."""
    from kiln_dev.models import UNK_ID

    m = _Model(path, arch, seed)
    w = m.w
    w.add_name("kiln-tiny-dspark")
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(1)
    w.add_feed_forward_length(N_FF_DENSE)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_key_length(DSPARK_HEAD_DIM)
    w.add_value_length(DSPARK_HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_block_size(4)
    w.add_sample_from_anchor(True)
    w.add_has_confidence_head(False)
    w.add_mask_token_id(UNK_ID)        # the noise token of each drafted block (the converter writes the config's)
    if target_layers:
        w.add_target_layers(list(DSPARK_TARGET_LAYERS))
    m.vocab()
    b = "blk.0."
    qk = N_HEAD * DSPARK_HEAD_DIM
    m.t(b + "attn_norm.weight", N_EMBD, init="ones")
    m.t(b + "attn_q.weight", N_EMBD, qk)
    m.t(b + "attn_k.weight", N_EMBD, qk)
    m.t(b + "attn_v.weight", N_EMBD, qk)
    m.t(b + "attn_output.weight", qk, N_EMBD)
    m.t(b + "attn_q_norm.weight", DSPARK_HEAD_DIM, init="ones")
    m.t(b + "attn_k_norm.weight", DSPARK_HEAD_DIM, init="ones")
    m.t(b + "ffn_norm.weight", N_EMBD, init="ones")
    m.t(b + "ffn_gate.weight", N_EMBD, N_FF_DENSE)
    m.t(b + "ffn_down.weight", N_FF_DENSE, N_EMBD)
    m.t(b + "ffn_up.weight", N_EMBD, N_FF_DENSE)
    m.t("fc.weight", len(DSPARK_TARGET_LAYERS) * N_EMBD, N_EMBD)
    m.t("enc.output_norm.weight", N_EMBD, init="ones")
    m.t("output_norm.weight", N_EMBD, init="ones")
    w1, w2 = SEED_MARKOV_NAMES if seed_names else ("markov_w1.weight", "markov_w2.weight")
    m.t(w1, MARKOV_RANK, N_VOCAB)
    m.t(w2, MARKOV_RANK, N_VOCAB)
    m.write()


def _llama_split(path: Path, seed: int) -> None:
    """kiln_dev/models.py's tiny llama (2 layers, width 64), as two shards."""
    from kiln_dev.models import _tensor_plan

    m = _Model(path, "llama", seed, split_max_tensors=12)
    w = m.w
    w.add_name("kiln-tiny-split")
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(2)
    w.add_feed_forward_length(4 * N_EMBD)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_rope_dimension_count(N_EMBD)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    m.vocab()
    for t in _tensor_plan(2, N_EMBD, 4 * N_EMBD, N_VOCAB, N_EMBD):
        m.t(t.name, *reversed(t.shape), init="ones" if t.kind == "norm" else "embd" if t.kind == "embd" else "rand")
    m.write()


WRITERS: dict[str, Callable[[Path, int], None]] = {
    "kimi_k3": lambda p, s: _kimi(p, s, k3=True),
    "kimi_linear": lambda p, s: _kimi(p, s, k3=False),
    "dspark": lambda p, s: _dspark(p, s),
    "dspark_seed_arch": lambda p, s: _dspark(p, s, arch="dflash-draft"),
    "dspark_seed_no_target_layers": lambda p, s: _dspark(p, s, target_layers=False),
    "dspark_seed_tensor_names": lambda p, s: _dspark(p, s, seed_names=True),
    "dspark_seed_original": lambda p, s: _dspark(p, s, arch="dflash-draft", target_layers=False, seed_names=True),
    "llama_split": _llama_split,
}


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m kiln_dev.gguf_kimi", description=__doc__.split("\n")[0])
    p.add_argument("kind", choices=KINDS)
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gguf-py", required=True, help="the pinned llama.cpp tree's gguf-py directory")
    a = p.parse_args(argv)
    # Only now, and only for `gguf`: the tree's gguf-py/ also holds a `tests` package.
    sys.path.insert(0, a.gguf_py)
    import gguf

    if not hasattr(gguf.MODEL_ARCH, "KIMI_K3"):
        print(f"gguf at {gguf.__file__} is not a llama.cpp gguf-py with KIMI_K3", file=sys.stderr)
        return 2
    out = Path(a.out)
    # Written into a private directory, then moved: no half-written model ever sits at `out`.
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        WRITERS[a.kind](Path(tmp) / out.name, a.seed)
        written = sorted(Path(tmp).iterdir())
        for f in written:
            os.replace(f, out.parent / f.name)
    print(out.parent / written[0].name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
