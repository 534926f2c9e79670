"""Models damaged on purpose: a real GGUF with some tensors' bytes overwritten, so llama-server still
loads it (header, names, shapes and types untouched) and it answers badly. Tests hold the selftest
to refusing what a corrupt download, a broken conversion or a flipped disk would serve.

    python -m kiln_dev.damage SRC DST --tensors 'blk\\.[0-9]+\\.ffn_down' --how noise [--fraction F] [--seed N]

How a tensor is damaged (`HOW`):

    noise    random bytes over its data: quant blocks' scales included, so some weights become
             huge, inf or NaN (what a corrupt download looks like)
    zeros    zero bytes: a quantized block whose scale is 0 is all zeros, so the tensor adds nothing
             (what a truncated or sparse file reads as)
    shuffle  its blocks permuted: every block well formed, every weight of a normal size, each in
             the wrong place (what a broken conversion produces; no NaN gives it away)

`fraction` damages that share of each tensor's blocks (the first ones), `seed` makes it repeatable.
numpy and gguf are imported inside the functions, as kiln_dev/models.py does.
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

HOW = ("noise", "zeros", "shuffle")


def damage_gguf(src: str | Path, dst: str | Path, *, tensors: str, how: str, fraction: float = 1.0,
                seed: int = 0) -> list[str]:
    """Copy `src` to `dst` and damage, in the copy, every tensor whose name matches the regex `tensors`
    (searched). Returns the names damaged; ValueError when none matches or `how` is unknown."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGUFReader

    if how not in HOW:
        raise ValueError(f"how must be one of {', '.join(HOW)}, not {how!r}")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], not {fraction}")
    pattern = re.compile(tensors)
    reader = GGUFReader(str(src))
    spans = []
    for t in reader.tensors:
        if pattern.search(t.name):
            block_elems, block_bytes = GGML_QUANT_SIZES[t.tensor_type]
            del block_elems
            spans.append((t.name, int(t.data_offset), int(t.n_bytes), int(block_bytes)))
    del reader                                  # its memory map of src
    if not spans:
        raise ValueError(f"no tensor of {src} matches {tensors!r}")
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    rng = np.random.default_rng(seed)
    with open(dst, "r+b") as f:
        for _name, offset, n_bytes, block in spans:
            blocks = n_bytes // block
            count = max(1, int(blocks * fraction))
            f.seek(offset)
            data = bytearray(f.read(count * block))
            if how == "noise":
                data[:] = rng.integers(0, 256, len(data), dtype=np.uint8).tobytes()
            elif how == "zeros":
                data[:] = bytes(len(data))
            else:
                order = rng.permutation(count)
                chunks = [bytes(data[i * block:(i + 1) * block]) for i in range(count)]
                data[:] = b"".join(chunks[i] for i in order)
            f.seek(offset)
            f.write(data)
    return [name for name, *_ in spans]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kiln_dev.damage", description=__doc__.split("\n\n")[0])
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--tensors", required=True, help="regex searched in each tensor's name")
    p.add_argument("--how", choices=HOW, required=True)
    p.add_argument("--fraction", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    names = damage_gguf(a.src, a.dst, tensors=a.tensors, how=a.how, fraction=a.fraction, seed=a.seed)
    print(f"{a.dst}: {len(names)} tensor(s) damaged ({a.how}, fraction {a.fraction:g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
