"""`python build.py plan --model SRC` on malformed sources (issue 50, item 9): each is one line on stderr,
exit 2, naming the source, the field (or the file) and what is wrong; never "unexpected ... (a bug in
Kiln)", never a traceback, never a plan from a file whose tensors do not fit in it, never a negative
number printed.

The sources: tiny GGUFs written with the `gguf` package (kiln_dev.models.make_tiny_gguf, or the writer
below where a key must hold what make_tiny_gguf never writes), some then byte-edited or cut; hf:// sources
from kiln_dev/hub (the Hub stand-in the real huggingface_hub client talks to), as in test_plan_cli.py."""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from images.cli.app import main
from images.plan import seed
from kiln_dev.gguf_kimi import make as make_kimi
from kiln_dev.hub import HubServer, client_env
from kiln_dev.models import make_tiny_gguf
from kiln_dev.runpod.api import RunPodStandIn
from supervisor.model.gguf_layout import shards

KEY = "rpa_plan-bad-input-31"
REPO = "kiln-test/bad"
DROP = object()


@pytest.fixture
def runpod(monkeypatch):
    with RunPodStandIn(KEY) as s:
        monkeypatch.setenv("RUNPOD_API_KEY", KEY)
        monkeypatch.setenv("RUNPOD_API_URL", s.url)
        yield s


# -- GGUFs ------------------------------------------------------------------------------------------------
def _gguf(path: Path, kv: dict[str, Any] | None = None, *, layers: int = 2, width: int = 64,
          align: int | None = None) -> Path:
    """A small llama GGUF (zeros for weights) whose keys `kv` overrides: a value, (GGUFValueType, value)
    for a type the key does not normally have, or DROP."""
    import gguf
    import numpy as np

    T = gguf.GGUFValueType
    keys: dict[str, Any] = {"llama.context_length": 4096, "llama.embedding_length": width,
                            "llama.block_count": layers, "llama.feed_forward_length": 2 * width,
                            "llama.attention.head_count": 2, "llama.attention.head_count_kv": 2}
    keys.update(kv or {})
    w = gguf.GGUFWriter(str(path), "llama")
    if align is not None:
        w.add_custom_alignment(align)
    for k, v in keys.items():
        if v is DROP:
            continue
        if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], T):
            w.add_key_value(k, v[1], v[0])
        elif isinstance(v, list):
            w.add_array(k, v)
        else:
            w.add_uint32(k, v)
    w.add_tensor("token_embd.weight", np.zeros((32, width), np.float32))
    for i in range(layers):
        for name, shape in (("attn_norm", (width,)), ("attn_q", (width, width)), ("attn_k", (width, width)),
                            ("attn_v", (width, width)), ("attn_output", (width, width)), ("ffn_norm", (width,)),
                            ("ffn_up", (2 * width, width)), ("ffn_down", (width, 2 * width))):
            w.add_tensor(f"blk.{i}.{name}.weight", np.zeros(shape, np.float32))
    w.add_tensor("output_norm.weight", np.zeros((width,), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _patch_u32(path: Path, key: str, value: int) -> Path:
    """Byte-edit the u32 value of `key` in place: the writer itself cannot write every bad value."""
    data = bytearray(path.read_bytes())
    raw = key.encode()
    at = data.index(len(raw).to_bytes(8, "little") + raw) + 8 + len(raw)
    assert int.from_bytes(data[at:at + 4], "little") == 4, "a u32 key"
    data[at + 4:at + 8] = value.to_bytes(4, "little")
    path.write_bytes(bytes(data))
    return path


def _cut(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])
    return path


def _vocab_only(path: Path) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _split(tmp: Path) -> Path:
    return make_kimi("llama_split", tmp / "split" / "tiny.gguf")          # two shards; the first returned


def _second(first: Path) -> Path:
    return shards(first)[1]


# -- hf:// sources -----------------------------------------------------------------------------------------
def _index(total: Any = 1 << 30) -> bytes:
    return json.dumps({"metadata": {"total_size": total},
                       "weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"}}).encode()


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 16, "hidden_size": 2048,
         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
         "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


def _st(cfg: Any = None, index: bytes | None = None, **over: Any) -> Callable[[Path, HubServer], str]:
    """A safetensors repo: config.json (LLAMA with `over`, or `cfg` as given: bytes or any JSON value) + index."""
    def build(tmp: Path, hub: HubServer) -> str:
        if cfg is None:
            body = json.dumps({k: v for k, v in {**LLAMA, **over}.items() if v is not DROP}).encode()
        else:
            body = cfg if isinstance(cfg, bytes) else json.dumps(cfg).encode()
        hub.seed(REPO, {"config.json": body, "model.safetensors.index.json": index if index is not None else _index()})
        return f"hf://{REPO}"
    return build


def _safetensors(sizes: dict[str, int], *, header: bytes | None = None, cut: int = 0) -> bytes:
    """A safetensors file of U8 tensors of these sizes (zeros), its last `cut` bytes gone; or `header` as
    its header's bytes."""
    head, off = {}, 0
    for name, n in sizes.items():
        head[name] = {"dtype": "U8", "shape": [n], "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(head).encode() if header is None else header
    data = struct.pack("<Q", len(raw)) + raw + bytes(off)
    return data[:len(data) - cut]


def _st_single(body: bytes) -> Callable[[Path, HubServer], str]:
    """A single-file safetensors repo: config.json + model.safetensors (its header read by range)."""
    def build(tmp: Path, hub: HubServer) -> str:
        hub.seed(REPO, {"config.json": json.dumps(LLAMA).encode(), "model.safetensors": body})
        return f"hf://{REPO}"
    return build


def _hf(make: Callable[[Path], Path], *, only_first: bool = False) -> Callable[[Path, HubServer], str]:
    """A GGUF (every shard of a split set, or only its first) on the Hub: hf://REPO/<its name>."""
    def build(tmp: Path, hub: HubServer) -> str:
        first = make(tmp)
        files = shards(first)[:1] if only_first else shards(first)
        hub.seed(REPO, {p.name: p.read_bytes() for p in files})
        return f"hf://{REPO}/{first.name}"
    return build


def _local(make: Callable[[Path], Path]) -> Callable[[Path, None], str]:
    return lambda tmp, hub: str(make(tmp))


def _missing_second(tmp: Path) -> Path:
    first = _split(tmp)
    _second(first).unlink()
    return first


def _cut_second(tmp: Path) -> Path:
    first = _split(tmp)
    _cut(_second(first))
    return first


def _vt(name: str) -> Any:
    import gguf
    return getattr(gguf.GGUFValueType, name)


# id, builder, whether it needs the Hub, the words the one line must hold (besides "--model SRC")
CASES: list[tuple[str, Callable[..., str], bool, list[str]]] = [
    ("gguf-block-count-1e9", _local(lambda t: _patch_u32(_gguf(t / "m.gguf"), "llama.block_count", 10**9)), False,
     ["llama.block_count 1000000000", "more layers than the file has tensors for"]),
    ("gguf-block-count-0", _local(lambda t: _gguf(t / "m.gguf", {"llama.block_count": 0})), False,
     ["llama.block_count 0", "between 1 and 100,000"]),
    ("gguf-alignment-0", _local(lambda t: _patch_u32(_gguf(t / "m.gguf", align=32), "general.alignment", 0)), False,
     ["general.alignment 0", "not a power of two"]),
    ("gguf-alignment-3", _local(lambda t: _patch_u32(_gguf(t / "m.gguf", align=32), "general.alignment", 3)), False,
     ["general.alignment 3", "not a power of two"]),
    ("gguf-alignment-string", _local(lambda t: _gguf(t / "m.gguf", {"general.alignment": (_vt("STRING"), "32")})),
     False, ['general.alignment "32"', "not an integer"]),
    ("gguf-truncated-half", _local(lambda t: _cut(make_tiny_gguf(t / "m.gguf", n_layers=4, width=128))), False,
     ["truncated", "past the end of the file"]),
    ("hf-gguf-truncated-half", _hf(lambda t: _cut(make_tiny_gguf(t / "m.gguf", n_layers=4, width=128))), True,
     ["truncated", "past the end of the file"]),
    ("gguf-split-shard-missing", _local(_missing_second), False, ["tiny-00002-of-00002.gguf", "missing"]),
    ("gguf-split-shard-cut", _local(_cut_second), False, ["tiny-00002-of-00002.gguf", "truncated"]),
    ("hf-gguf-split-shard-missing", _hf(_split, only_first=True), True, ["tiny-00002-of-00002.gguf", "not on the Hub"]),
    ("hf-gguf-split-shard-cut", _hf(_cut_second), True, ["tiny-00002-of-00002.gguf", "truncated"]),
    ("gguf-vocab-only", _local(lambda t: _vocab_only(t / "vocab-only.gguf")), False, ["no weights"]),
    ("gguf-experts-used-over-total", _local(lambda t: _gguf(t / "m.gguf", {"llama.expert_count": 2,
                                                                            "llama.expert_used_count": 4})), False,
     ["llama.expert_used_count 4", "more than llama.expert_count 2"]),
    ("gguf-embedding-length-string", _local(lambda t: _gguf(t / "m.gguf", {
        "llama.embedding_length": (_vt("STRING"), "abc")})), False, ['llama.embedding_length "abc"', "not an integer"]),
    ("gguf-embedding-length-0", _local(lambda t: _gguf(t / "m.gguf", {"llama.embedding_length": 0})), False,
     ["llama.embedding_length 0", "at least 1"]),
    ("gguf-head-count-kv-negative", _local(lambda t: _gguf(t / "m.gguf", {
        "llama.attention.head_count_kv": (_vt("INT32"), -1)})), False,
     ["llama.attention.head_count_kv -1", "at least 0"]),
    ("gguf-head-count-kv-per-layer-length", _local(lambda t: _gguf(t / "m.gguf", {
        "llama.attention.head_count_kv": [2, 2, 2]})), False,
     ["llama.attention.head_count_kv", "3 entries for 2 layers"]),
    ("gguf-key-length-negative", _local(lambda t: _gguf(t / "m.gguf", {
        "llama.attention.key_length": (_vt("INT32"), -64)})), False,
     ["llama.attention.key_length -64", "at least 0"]),
    ("gguf-feed-forward-float", _local(lambda t: _gguf(t / "m.gguf", {
        "llama.feed_forward_length": (_vt("FLOAT32"), 128.5)})), False,
     ["llama.feed_forward_length 128.5", "not an integer"]),
    ("gguf-feed-forward-per-layer-length", _local(lambda t: _gguf(t / "m.gguf", {
        "llama.feed_forward_length": [128, 128, 128]})), False,
     ["llama.feed_forward_length", "3 entries for 2 layers"]),
    ("gguf-vocab-size-negative", _local(lambda t: _gguf(t / "m.gguf", {"llama.vocab_size": (_vt("INT32"), -5)})),
     False, ["llama.vocab_size -5", "at least 0"]),
    ("gguf-context-length-negative", _local(lambda t: _gguf(t / "m.gguf", {
        "llama.context_length": (_vt("INT32"), -4096)})), False, ["llama.context_length -4096", "at least 0"]),
    ("config-not-json", _st(b"{not json"), True, ["config.json", "not JSON"]),
    ("config-a-list", _st([1, 2, 3]), True, ["config.json", "not a JSON object (an array)"]),
    ("config-text-config-a-string", _st({**LLAMA, "text_config": "llama"}), True,
     ["config.json", 'text_config "llama"', "not a JSON object"]),
    ("index-not-json", _st(index=b"<html>"), True, ["model.safetensors.index.json", "not JSON"]),
    ("index-a-list", _st(index=b"[]"), True, ["model.safetensors.index.json", "not a JSON object (an array)"]),
    ("index-no-total-size", _st(index=json.dumps({"weight_map": {}}).encode()), True,
     ["model.safetensors.index.json", "metadata.total_size", "missing"]),
    ("index-total-size-string", _st(index=_index("12345")), True,
     ["model.safetensors.index.json", 'metadata.total_size "12345"', "not an integer"]),
    ("index-total-size-negative", _st(index=_index(-5)), True,
     ["model.safetensors.index.json", "metadata.total_size -5", "at least 1"]),
    ("single-safetensors-truncated", _st_single(_safetensors({"a": 4096, "b": 4096}, cut=100)), True,
     ["model.safetensors", "past the end of the file", "truncated"]),
    ("single-safetensors-no-tensors", _st_single(_safetensors({})), True, ["model.safetensors", "no weights"]),
    ("single-safetensors-header-not-json", _st_single(_safetensors({}, header=b"{bad")), True,
     ["model.safetensors header", "not JSON"]),
    ("single-safetensors-header-past-end", _st_single(struct.pack("<Q", 10**6) + b"{}"), True,
     ["model.safetensors", "a header of 1,000,000 bytes", "truncated"]),
    ("single-safetensors-bad-offsets", _st_single(_safetensors({}, header=json.dumps(
        {"w": {"dtype": "U8", "shape": [16], "data_offsets": [16, 0]}}).encode())), True,
     ["model.safetensors", "data_offsets [16, 0]", "not two byte offsets"]),
    ("config-layers-string", _st(num_hidden_layers="abc"), True,
     ["config.json", 'num_hidden_layers "abc"', "not an integer"]),
    ("config-layers-null", _st(num_hidden_layers=None), True,
     ["config.json", "num_hidden_layers null", "not an integer"]),
    ("config-layers-negative", _st(num_hidden_layers=-3), True,
     ["config.json", "num_hidden_layers -3", "between 1 and 100,000"]),
    ("config-layers-1e9", _st(num_hidden_layers=10**9), True,
     ["config.json", "num_hidden_layers 1000000000", "between 1 and 100,000"]),
    ("config-layers-missing", _st(num_hidden_layers=DROP), True, ["config.json", "num_hidden_layers", "missing"]),
    ("config-hidden-size-0", _st(hidden_size=0), True, ["config.json", "hidden_size 0", "at least 1"]),
    ("config-kv-heads-0", _st(num_key_value_heads=0), True, ["config.json", "num_key_value_heads 0", "at least 1"]),
    ("config-kv-heads-negative", _st(num_key_value_heads=-8), True,
     ["config.json", "num_key_value_heads -8", "at least 1"]),
    ("config-heads-string", _st(num_attention_heads="32"), True,
     ["config.json", 'num_attention_heads "32"', "not an integer"]),
    ("config-experts-used-over-total", _st(num_experts=8, num_experts_per_tok=16), True,
     ["config.json", "num_experts_per_tok 16", "more than num_experts 8"]),
    ("config-rope-factor-negative", _st(rope_scaling={"rope_type": "linear", "factor": -2.0}), True,
     ["config.json", "rope_scaling.factor -2.0", "more than 0"]),
    ("config-max-positions-infinite", _st(b'{"num_hidden_layers": 2, "hidden_size": 64, '
                                          b'"max_position_embeddings": 1e999}'), True,
     ["config.json", "max_position_embeddings", "not an integer"]),
    ("config-linear-attn-config-a-list", _st(linear_attn_config=[1, 2]), True,
     ["config.json", "linear_attn_config", "not a JSON object"]),
    ("config-layer-types-a-string", _st(layer_types="full_attention"), True,
     ["config.json", 'layer_types "full_attention"', "not a list"]),
]


@pytest.mark.parametrize("build, hub_needed, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_malformed_source_is_one_line_naming_the_source_the_field_and_the_problem(runpod, tmp_path, capsys,
                                                                                   build, hub_needed, words):
    if hub_needed:
        with HubServer(tmp_path / "hub") as hub, client_env(hub, tmp_path / "home"):
            src = build(tmp_path, hub)
            rc = main(["plan", "--model", src])
    else:
        src = build(tmp_path, None)
        rc = main(["plan", "--model", src])
    out = capsys.readouterr()
    err = out.err
    assert rc == 2, (rc, out.out[-2000:], err)
    assert out.out == "", "no plan printed"
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "unexpected" not in err and "Traceback" not in err and "a bug in Kiln" not in err, err
    assert f"--model {src}" in err, err
    missing = [w for w in words if w not in err]
    assert not missing, f"{missing} not in {err!r}"


def _negatives(text: str) -> list[str]:
    """Negative numbers in printed text ("-1.0 GiB", "-10,546,873 tokens"), not hyphens of words or flags."""
    return re.findall(r"(?<![\w.-])-\d[\d,.]*", text)


def test_a_model_that_fits_nowhere_for_its_cache_suggests_no_negative_context(runpod, tmp_path, capsys):
    # Valid, and too large: 96 layers of 128 KV heads of 512 each cache 25 MiB a token; no pod holds
    # 32,768 of them. The answer is exit 1 with what would fit, and no number below zero.
    cfg = {**LLAMA, "num_hidden_layers": 96, "hidden_size": 16384, "num_attention_heads": 128,
           "num_key_value_heads": 128, "head_dim": 512}
    with HubServer(tmp_path / "hub") as hub, client_env(hub, tmp_path / "home"):
        hub.seed(REPO, {"config.json": json.dumps(cfg).encode(), "model.safetensors.index.json": _index(300 * 2**30)})
        rc = main(["plan", "--model", f"hf://{REPO}"])
        out = capsys.readouterr()
        rc_json = main(["plan", "--model", f"hf://{REPO}", "--json"])
        doc = json.loads(capsys.readouterr().out)
    assert rc == rc_json == 1, out.err
    assert "no resident plan" in out.err and "unexpected" not in out.err
    assert not _negatives(out.out + out.err), (_negatives(out.out + out.err), out.out, out.err)
    assert doc["model"]["kv_bytes_per_token"] > 0 and doc["model"]["ctx"] > 0
    assert all(b >= 0 for p in doc["plans"] for b in p["per_card_bytes"]) and "-" not in doc["no_fit"].split(";")[1]


def test_the_seeds_and_good_ggufs_still_plan(runpod, tmp_path, capsys):
    # What the checks must not refuse: the writer above unchanged, a MoE, a split set, Kimi's per-layer
    # head_count_kv with zeros (KDA layers), alignment 64, the seed configs.
    for path in (_gguf(tmp_path / "ok.gguf"), _gguf(tmp_path / "al.gguf", align=64),
                 make_tiny_gguf(tmp_path / "moe.gguf", n_expert=8, n_expert_used=2), _split(tmp_path),
                 make_kimi("kimi_linear", tmp_path / "kl.gguf")):
        rc = main(["plan", "--model", str(path)])
        err = capsys.readouterr().err
        assert rc == 0, (path, err)
    with HubServer(tmp_path / "hub") as hub, client_env(hub, tmp_path / "home"):
        for name, cfg in (("qwen", seed.QWEN3_CODER_CONFIG), ("kimi", seed.KIMI_LINEAR_CONFIG), ("llama", LLAMA)):
            hub.seed(f"kiln-test/{name}", {"config.json": json.dumps(cfg).encode(),
                                           "model.safetensors.index.json": _index(8 * 2**30)})
            rc = main(["plan", "--model", f"hf://kiln-test/{name}"])
            err = capsys.readouterr().err
            assert rc == 0, (name, err)
        hub.seed("kiln-test/single", {"config.json": json.dumps(LLAMA).encode(),
                                      "model.safetensors": _safetensors({"a": 4096, "b": 8192})})
        rc = main(["plan", "--model", "hf://kiln-test/single", "--json"])
        out = capsys.readouterr()
        assert rc == 0 and json.loads(out.out)["model"]["weights_bytes"] == 4096 + 8192, out.err
