#!/usr/bin/env python3
"""Archives for the device run with nothing but Python's standard library: the lent GPU machine
has no `zstd` and no `unzip` (device calls of 2026-12-01), and what it has is CPython 3.12.

    archive.py xz OUT                  compress stdin into OUT (.xz, lzma preset 9; pack.sh)
    archive.py untar SRC DEST          unpack a tar (plain, .gz, .xz) into DEST (take.sh)
    archive.py unzip ZIP GLOB DEST     extract the members of ZIP whose names match GLOB into DEST,
                                       flat (no folders), like `unzip -o -j ZIP GLOB -d DEST`

A member that would land outside DEST is refused (tarfile's "data" filter; zip names are
flattened to their last part). Exit 1 with one line when nothing matched or the input is bad.
"""

from __future__ import annotations

import fnmatch
import lzma
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

CHUNK = 1 << 20


def xz(out: Path) -> None:
    tmp = out.with_name(out.name + ".part")
    with lzma.open(tmp, "wb", preset=9) as f:       # a 64 MiB dictionary, like zstd --long=27 was for
        shutil.copyfileobj(sys.stdin.buffer, f, CHUNK)
    tmp.replace(out)


def untar(src: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(src, "r:*") as t:
        if hasattr(tarfile, "data_filter"):
            t.extractall(dest, filter="data")
        else:                     # CPython before 3.11.4 (Debian 12's python3 is 3.11.2) has no filters
            t.extractall(dest, members=_inside(t, dest))


def _inside(t: tarfile.TarFile, dest: Path) -> list[tarfile.TarInfo]:
    """The members, when every one stays inside `dest` as the "data" filter requires: no absolute or
    ../ name, no link out of it, no device or fifo; else ValueError naming the first that would not."""
    root = dest.resolve()
    for m in t.getmembers():
        where = (root / m.name).resolve()
        if m.name.startswith("/") or not where.is_relative_to(root):
            raise ValueError(f"{m.name!r} would land outside {dest}")
        if m.issym() or m.islnk():
            target = (where.parent / m.linkname).resolve() if m.issym() else (root / m.linkname).resolve()
            if m.linkname.startswith("/") or not target.is_relative_to(root):
                raise ValueError(f"{m.name!r} links outside {dest} ({m.linkname!r})")
        elif not (m.isfile() or m.isdir()):
            raise ValueError(f"{m.name!r} is a device or fifo, not data")
    return t.getmembers()


def unzip(src: Path, pattern: str, dest: Path) -> list[str]:
    dest.mkdir(parents=True, exist_ok=True)
    done = []
    with zipfile.ZipFile(src) as z:
        for info in z.infolist():
            name = info.filename.rsplit("/", 1)[-1]
            if info.is_dir() or not fnmatch.fnmatch(info.filename, pattern) or name in ("", ".", ".."):
                continue
            with z.open(info) as r, open(dest / name, "wb") as w:
                shutil.copyfileobj(r, w, CHUNK)
            done.append(name)
    if not done:
        raise ValueError(f"no member of {src} matches {pattern!r}")
    return done


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["xz"] and len(argv) == 2:
            xz(Path(argv[1]))
        elif argv[:1] == ["untar"] and len(argv) == 3:
            untar(Path(argv[1]), Path(argv[2]))
        elif argv[:1] == ["unzip"] and len(argv) == 4:
            unzip(Path(argv[1]), argv[2], Path(argv[3]))
        else:
            print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
            return 2
    except (OSError, ValueError, EOFError, lzma.LZMAError, tarfile.TarError, zipfile.BadZipFile) as e:
        print(f"archive.py {argv[0]}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
