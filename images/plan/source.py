"""SRC -> a Shape: what `plan --model SRC` reads, never the weights.

    a local path          a GGUF (a split set by its first shard, `-00001-of-0000N.gguf`)
    hf://OWNER/REPO/FILE.gguf[@REV]   a GGUF on the Hub: only each shard's header, read by byte range
                          through huggingface_hub (an HfFileSystem file opened without fsspec's read-ahead
                          cache, so a read of n bytes is one Range request of n), growing the range until
                          the header ends inside it
    hf://OWNER/REPO[@REV]             a safetensors repo: config.json and model.safetensors.index.json
                          (metadata.total_size); a single-file repo's safetensors header by range

The Hub endpoint is huggingface_hub's own (HF_ENDPOINT; tests: kiln_dev/hub).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from supervisor import hubclient
from supervisor.errors import KilnError
from supervisor.model.gguf_layout import (
    FileHeader,
    GGUFError,
    parse_header,
    read_header,
    shards,
)
from supervisor.plan import shape

FIRST_RANGE = 1 << 20           # 1 MiB: a small model's whole header; a 160k-token vocabulary needs ~4
MAX_HEADER = 256 << 20          # a header larger than this is not a header


class SourceError(KilnError):
    """--model names nothing the planner can read."""


@dataclass(frozen=True)
class Source:
    shape: shape.Shape
    name: str                   # what the speed rows are matched against (repo id and file)
    engine_hint: str            # llamacpp for a GGUF, vllm for safetensors
    model_table: dict[str, Any]  # the deploy config's [model] that serves this SRC


# The probe sets the selftest has for a model family (supervisor/selftest/probes.py SETS), recognised by
# the words of the model's name: a deploy config `plan` writes names it, so the pod's selftest asks what
# that model answers (a family it does not recognise gets the generic probes).
FAMILIES = (("smollm2", ("smollm2",)), ("kimi-linear", ("kimi", "linear")), ("kimi-k3", ("kimi", "k3")),
            ("qwen3-coder", ("qwen3", "coder")))


def family_of(name: str) -> str | None:
    low = name.lower().replace("_", "-")
    return next((fam for fam, words in FAMILIES if all(w in low for w in words)), None)


def read(src: str) -> Source:
    found = _read(src)
    family = family_of(found.name)
    return replace(found, model_table={**found.model_table, "family": family}) if family else found


def _read(src: str) -> Source:
    if src.startswith("hf://"):
        repo, path, rev = _parse_hf(src)
        hf = {"source": f"hf://{repo}", "revision": rev or "main"}
        if path and path.endswith(".gguf"):
            files = [str(p) for p in shards(PurePosixPath(path))]          # type: ignore[arg-type]
            table = {**hf, "entry": path} | ({"allow_patterns": files} if len(files) > 1 else {"allow_patterns": [path]})
            return Source(_weighed(src, _hub_errors(src, lambda: _hf_gguf(src, repo, path, rev))), f"{repo}/{path}",
                          "llamacpp", table)
        if path:
            raise SourceError(f"--model {src}: an hf:// file must be a .gguf; a safetensors repo is hf://OWNER/REPO")
        return Source(_hub_errors(src, lambda: _hf_safetensors(src, repo, rev)), repo, "vllm",
                      {**hf, "entry": "config.json"})
    p = Path(src)
    if not p.is_file():
        raise SourceError(f"--model {src}: no such file (a local GGUF, hf://OWNER/REPO/FILE.gguf or hf://OWNER/REPO)")
    files = shards(p)
    headers = []
    for i, s in enumerate(files, 1):
        where = f"--model {src}: " + (f"{s.name} (shard {i} of {len(files)}): " if len(files) > 1 else "")
        try:
            headers.append(read_header(s))
        except FileNotFoundError:
            raise SourceError(f"{where}missing: a split model needs every shard beside the first "
                              f"(download all {len(files)} into {s.parent})") from None
        except GGUFError as e:
            raise SourceError(f"{where}{e}") from e
    return Source(_weighed(src, _shaped(src, lambda: shape.from_gguf(headers))), p.name, "llamacpp",
                  {"source": str(p.resolve())})


def _shaped(src: str, fn: Callable[[], shape.Shape]) -> shape.Shape:
    """fn()'s Shape; what the header or config holds that no model has, one line naming `src` and the field."""
    try:
        return fn()
    except shape.ShapeError as e:
        raise SourceError(f"--model {src}: {e}") from e


def _weighed(src: str, s: shape.Shape) -> shape.Shape:
    """`s`, when it has weights: a GGUF without tensors (llama.cpp's vocab-only files) serves nothing,
    and a speed bound over zero bytes read per token is no speed."""
    if s.weights_bytes <= 0:
        raise SourceError(f"--model {src}: the file holds no weights (a vocab-only GGUF?): give the model's GGUF")
    return s


def _parse_hf(src: str) -> tuple[str, str, str | None]:
    body = src[len("hf://"):]
    rev = None
    if "@" in body:
        body, rev = body.rsplit("@", 1)
    parts = body.strip("/").split("/")
    if len(parts) < 2 or not all(parts[:2]):
        raise SourceError(f"--model {src}: want hf://OWNER/REPO[/FILE.gguf][@REVISION]")
    return "/".join(parts[:2]), "/".join(parts[2:]), rev


def _fs() -> Any:
    from huggingface_hub import HfFileSystem, constants

    return HfFileSystem(endpoint=constants.ENDPOINT)


def _hub_errors(src: str, fn: Callable[[], Any]) -> Any:
    """fn(), its Hub errors one line naming `src`. huggingface_hub's transport errors (no network, DNS,
    a refused connection) are no OSError: hubclient.error_kind knows them."""
    try:
        return fn()
    except SourceError:
        raise
    except FileNotFoundError as e:
        raise SourceError(f"--model {src}: not on the Hub ({e})") from e
    except Exception as e:
        kind = hubclient.error_kind(e)
        if kind == hubclient.AUTH:
            raise SourceError(f"--model {src}: the Hub refused the token ({hubclient.describe(e)}): set HF_TOKEN "
                              "to a token that can read the repo") from e
        if kind == hubclient.NOT_FOUND:
            raise SourceError(f"--model {src}: not on the Hub, or hidden from this token "
                              f"({hubclient.describe(e)})") from e
        if kind in hubclient.TRANSIENT or isinstance(e, OSError):
            raise SourceError(f"--model {src}: the Hub did not answer ({hubclient.describe(e)})") from e
        raise


def header_by_range(read_range: Callable[[int, int], bytes], name: str, size: int) -> FileHeader:
    """A GGUF header from a file of `size` bytes, reading [0, n) and doubling n until the header ends
    (GGUFError when it does not: not GGUF, or the file ends inside its header)."""
    n = min(size, FIRST_RANGE)
    while True:
        buf = read_range(0, n)
        try:
            return parse_header(buf, Path(name), size)
        except GGUFError as e:
            if "truncated" not in str(e) or n >= size or n >= MAX_HEADER:
                if "truncated" in str(e) and n >= size:
                    raise GGUFError(f"{e}: the file ({size:,} bytes) ends inside its header") from e
                raise
            n = min(size, n * 4)


def _ranged(fs: Any, path: str) -> Callable[[int, int], bytes]:
    def read_range(start: int, end: int) -> bytes:
        with fs.open(path, "rb", cache_type="none") as f:     # no read-ahead: the range asked, no more
            f.seek(start)
            return f.read(end - start)
    return read_range


def _hf_gguf(src: str, repo: str, path: str, rev: str | None) -> shape.Shape:
    fs = _fs()
    at = f"@{rev}" if rev else ""
    headers = []
    files = shards(PurePosixPath(path))              # type: ignore[arg-type] - shards only uses .name / with_name
    for i, shard in enumerate(files, 1):
        full = f"{repo}{at}/{shard}"
        label = f"{src}: {shard.name} (shard {i} of {len(files)})" if len(files) > 1 else src
        size = int(_hub_errors(label, lambda f=full: fs.info(f))["size"])
        try:
            headers.append(header_by_range(_ranged(fs, full), f"hf://{full}", size))
        except GGUFError as e:
            raise SourceError(f"--model {label}: {e}") from e
    return _shaped(src, lambda: shape.from_gguf(headers))


def _json(src: str, name: str, raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:            # JSONDecodeError, UnicodeDecodeError, nesting
        why = (str(e).splitlines() or [type(e).__name__])[0][:120]
        raise SourceError(f"--model {src}: {name}: not JSON ({why})") from None


def _total_size(src: str, index: Any) -> int:
    """The index's metadata.total_size: the weights' bytes, at least one."""
    name = "model.safetensors.index.json"
    if not isinstance(index, dict):
        raise SourceError(f"--model {src}: {name}: not a JSON object ({shape.json_kind(index)})")
    meta = index.get("metadata")
    if not isinstance(meta, dict) or "total_size" not in meta:
        raise SourceError(f"--model {src}: {name}: metadata.total_size: missing (the weights' size in bytes, which "
                          "the plan needs)")
    try:
        return shape.checked_int("metadata.total_size", meta["total_size"], 1)
    except shape.ShapeError as e:
        raise SourceError(f"--model {src}: {name}: {e}") from None


def _hf_safetensors(src: str, repo: str, rev: str | None) -> shape.Shape:
    """config.json, and the weights by kind from every shard's header (by range): a MoE's routed experts
    apart, so a token's bytes count only the experts it uses. A repo whose headers cannot be read is
    weighed by its index's total_size, every byte counted as read per token (said in the shape's notes)."""
    fs = _fs()
    at = f"{repo}@{rev}" if rev else repo
    cfg = _json(src, "config.json", _hub_errors(f"hf://{at}/config.json", lambda: fs.cat_file(f"{at}/config.json")))
    if fs.exists(f"{at}/model.safetensors.index.json"):
        index = _json(src, "model.safetensors.index.json", fs.cat_file(f"{at}/model.safetensors.index.json"))
        total = _total_size(src, index)
        shards = sorted({str(v) for v in (index.get("weight_map") or {}).values()}) \
            if isinstance(index.get("weight_map"), dict) else []
        kinds, note = None, "the shards' headers were not read: every weight counted as read per token"
        if shards and all("/" not in f and f.endswith(".safetensors") for f in shards):
            try:
                kinds = _shards_by_kind(src, fs, at, shards)
            except SourceError as e:
                note = f"the shards' headers could not be read ({e}): every weight counted as read per token"
        made = _shaped(src, lambda: shape.from_config(cfg, weights_bytes=total, weights_by_kind=kinds,
                                                      source=f"hf://{at} config.json + index"
                                                             + (" + shard headers" if kinds else "")))
        return made if kinds else replace(made, notes=(*made.notes, note))
    single = f"{at}/model.safetensors"
    size = int(_hub_errors(f"hf://{single}", lambda: fs.info(single))["size"])
    kinds = _safetensors_kinds(src, _ranged(fs, single), size, "model.safetensors")
    return _shaped(src, lambda: shape.from_config(cfg, weights_bytes=sum(kinds.values()), weights_by_kind=kinds,
                                                  source=f"hf://{at} config.json + safetensors header"))


def _shards_by_kind(src: str, fs: Any, at: str, shards: list[str]) -> dict[str, int]:
    """Every shard's tensors by kind (shape.hf_tensor_kind), read four shards at a time."""
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str) -> dict[str, int]:
        path = f"{at}/{name}"
        size = int(_hub_errors(f"hf://{path}", lambda: fs.info(path))["size"])
        return _safetensors_kinds(src, _ranged(fs, path), size, name)

    out: dict[str, int] = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        for kinds in pool.map(one, shards):
            for k, v in kinds.items():
                out[k] = out.get(k, 0) + v
    return out


HEADER_PREFETCH = 256 << 10        # most headers fit: one request for the length and the header together


def _safetensors_kinds(src: str, read_range: Callable[[int, int], bytes], size: int, name: str) -> dict[str, int]:
    """The tensors' bytes of one safetensors file of `size` bytes by kind, from its header (8 bytes of length,
    then JSON); a header or tensor data past the file's end is a truncated file, no plan."""
    where = f"--model {src}: {name}"
    if size < 8:
        raise SourceError(f"{where}: {size} bytes is no safetensors file")
    first = read_range(0, min(size, HEADER_PREFETCH))
    (n,) = struct.unpack("<Q", first[:8])
    if n > MAX_HEADER or 8 + n > size:
        raise SourceError(f"{where}: a header of {n:,} bytes in a file of {size:,} is no safetensors header "
                          "(truncated, or not safetensors)")
    raw = first[8:8 + n] if 8 + n <= len(first) else read_range(8, 8 + n)
    head = _json(src, f"{name} header", raw)
    if not isinstance(head, dict):
        raise SourceError(f"{where}: the header is not a JSON object ({shape.json_kind(head)})")
    kinds: dict[str, int] = {}
    end = 0
    for k, v in head.items():
        if k == "__metadata__":
            continue
        offsets = v.get("data_offsets") if isinstance(v, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) and not isinstance(o, bool)
                                                                          for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise SourceError(f"{where}: tensor {k!r} data_offsets {shape.shown(offsets)}: not two byte offsets "
                              "[begin, end]")
        kind = shape.hf_tensor_kind(k)
        kinds[kind] = kinds.get(kind, 0) + offsets[1] - offsets[0]
        end = max(end, offsets[1])
    if sum(kinds.values()) <= 0 and name == "model.safetensors":
        raise SourceError(f"{where}: the file holds no weights (no tensor with data): give the model's weights")
    if 8 + n + end > size:
        raise SourceError(f"{where}: the tensors end at byte {8 + n + end:,}, past the end of the file ({size:,} "
                          "bytes): the file is truncated (an interrupted upload?)")
    return kinds
