"""How two tar archives differ, member by member: the tool behind every "rebuild and compare".

    differences(a, b)   one line per difference: a gzip header field, a member only in one archive, or
                        a member's header field (type, mode, owner, mtime, size, link, pax records) or
                        content sha256; [] when the archives agree (then equal bytes, or a line saying
                        the bytes still differ)

Works on a .tar.gz (the engine tarball) and a plain .tar (an image layer, as `docker save` writes it).
A leaf module: it imports no Kiln code but the digest helper.
"""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

from .digest import sha256_file

__all__ = ["differences", "members"]


def members(path: Path) -> tuple[dict[str, dict[str, object]], dict[str, object]]:
    """({name: header fields + content sha256}, archive-level fields: gzip header when gzipped, order)."""
    path = Path(path)
    with path.open("rb") as raw:
        head = raw.read(10)
    archive: dict[str, object] = {}
    if head[:2] == b"\x1f\x8b":
        archive = {"gzip mtime": int.from_bytes(head[4:8], "little"), "gzip flags": head[3], "gzip os": head[9]}
    out: dict[str, dict[str, object]] = {}
    order = []
    with tarfile.open(path, "r:*") as tar:
        for m in tar:
            order.append(m.name)
            row: dict[str, object] = {"type": m.type.decode(), "mode": oct(m.mode), "uid": m.uid, "gid": m.gid,
                                      "uname": m.uname, "gname": m.gname, "mtime": m.mtime, "size": m.size,
                                      "linkname": m.linkname, "pax": dict(sorted(m.pax_headers.items()))}
            if m.isreg():
                f = tar.extractfile(m)
                assert f is not None
                row["sha256"] = hashlib.file_digest(f, "sha256").hexdigest()
            out[m.name] = row
    archive["member order"] = order
    return out, archive


def differences(first: Path, second: Path) -> list[str]:
    """Every way two archives differ, one line each; [] when they are byte for byte the same."""
    a, arch_a = members(first)
    b, arch_b = members(second)
    diffs = [f"{k}: {arch_a.get(k)} vs {arch_b.get(k)}" for k in sorted(set(arch_a) | set(arch_b))
             if k != "member order" and arch_a.get(k) != arch_b.get(k)]
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            diffs.append(f"{name}: only in the {'first' if name in a else 'second'}")
            continue
        for field in a[name]:
            if a[name][field] != b[name].get(field):
                diffs.append(f"{name}: {field} {a[name][field]} vs {b[name].get(field)}")
    if not diffs and arch_a["member order"] != arch_b["member order"]:
        diffs.append("member order differs")
    if not diffs and sha256_file(first) != sha256_file(second):
        diffs.append("same members and headers, different bytes (tar padding or compression)")
    return diffs
