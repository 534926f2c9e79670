"""Read a GGUF file's layout — bytes per layer, a few hyper-parameters — from its header alone.

A manual split across GPUs needs to know how big each layer is; the header lists every tensor's
name and data offset, so sizes come from the gaps between offsets (no table of quantisation
block sizes to keep in sync with llama.cpp). Only the header is read: a 181 GiB model costs a
few MB of I/O. Sharded models (`-00001-of-00004.gguf`) are read shard by shard.

Format (GGUF v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count,
kv pairs (string key, u32 type, value), tensor infos (string name, u32 n_dims, u64 dims[n],
u32 ggml type, u64 offset), then padding to `general.alignment` (default 32) and the data.
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
_SHARD = re.compile(r"^(?P<stem>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")


class GGUFError(KilnError):
    """A model file's GGUF header cannot be read (truncated, not GGUF, a missing split)."""


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
    return f.read(n).decode("utf-8", errors="replace")


def _value(f: BinaryIO, vtype: int) -> Any:
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == STRING:
        return _string(f)
    if vtype == ARRAY:
        etype, count = _read(f, "<I"), _read(f, "<Q")
        if etype in _SCALARS:
            f.seek(struct.calcsize(_SCALARS[etype]) * count, 1)   # skip: vocabularies are huge
        else:
            for _ in range(count):
                _value(f, etype)
        return None
    raise GGUFError(f"unknown metadata value type {vtype}")


def _read_one(path: Path, layout: Layout) -> None:
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file")
        version = _read(f, "<I")
        if version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {version} is not supported")
        n_tensors, n_kv = _read(f, "<Q"), _read(f, "<Q")
        for _ in range(n_kv):
            key, vtype = _string(f), _read(f, "<I")
            value = _value(f, vtype)
            if value is not None:
                layout.metadata.setdefault(key, value)
        infos: list[tuple[str, int]] = []
        for _ in range(n_tensors):
            name = _string(f)
            n_dims = _read(f, "<I")
            f.seek(8 * n_dims + 4, 1)                 # dims and ggml type: sizes come from offsets
            infos.append((name, _read(f, "<Q")))
        align = int(layout.metadata.get("general.alignment", 32))
        data_start = (f.tell() + align - 1) // align * align
        end = path.stat().st_size - data_start
    infos.sort(key=lambda t: t[1])
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
        _read_one(p, layout)
    return layout
