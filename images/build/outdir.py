"""`build.py render --out DIR`: write a render into a directory the user names without touching
anything that is not Kiln's.

DIR must be new (its parent existing), empty, or hold Kiln's own earlier render, recognised by
the marker `.kiln-render.json` that lists every file Kiln wrote there with its sha256. Into such
a directory only those files are replaced, and only while they are still what Kiln wrote: a
listed file the user changed since, or a file Kiln would write that the marker does not list
(the user's own `kiln/patches/x.patch`, say), is refused by name before anything is written.
Nothing else in DIR is read, replaced or deleted; directories Kiln made are removed only once
they are empty. Kiln never follows a symlink inside DIR.

The render itself goes to a private staging directory first (render.write_context), so a
template or patch error leaves DIR as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from supervisor.errors import KilnError

from ..digest import sha256_file as _sha256

MARKER = ".kiln-render.json"
MARKER_FORMAT = 1


@dataclass(frozen=True)
class Earlier:
    """What the marker of an earlier render says Kiln wrote."""
    files: dict[str, str]        # relative POSIX path -> sha256 as written
    dirs: tuple[str, ...]        # directories Kiln created (deepest last)


def _refuse(out: Path, why: str) -> KilnError:
    return KilnError(f"--out {out}: {why}")


def check_target_dir(out: Path) -> Earlier | None:
    """Refuse an --out Kiln may not write into; return the earlier render's record, if any."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        kind = "a symlink" if out.is_symlink() else "a file"
        raise _refuse(out, f"is {kind}, not a directory; name a new or empty directory")
    if not out.exists():
        parent = out.absolute().parent
        if not parent.is_dir():
            raise _refuse(out, f"its parent {parent} does not exist; create it first or name another directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise _refuse(out, f"cannot create it: {parent} is not writable by this user")
        return None
    if not os.access(out, os.W_OK | os.X_OK):
        raise _refuse(out, "is not writable by this user; name another directory")
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return None
    if MARKER not in entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise _refuse(out, f"is not empty ({shown}) and holds no earlier Kiln render ({MARKER}); Kiln writes "
                      "only into a new or empty directory or over its own render: name another directory")
    earlier = _read_marker(out)
    changed = [rel for rel, sha in earlier.files.items()
               if _plain_file(out, rel) and _sha256(out / rel) != sha]
    if changed:
        raise _refuse(out, f"{_names(changed)} changed since Kiln rendered {'it' if len(changed) == 1 else 'them'}; "
                      "move the change away (Kiln will not overwrite it), then render again")
    return earlier


def _names(rels: list[str]) -> str:
    return ", ".join(rels[:5]) + (f" and {len(rels) - 5} more" if len(rels) > 5 else "")


def _safe_rel(rel: object) -> str | None:
    """A marker entry Kiln may act on: a relative path inside DIR, no '..', no absolute part."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
        return None
    p = PurePosixPath(rel)
    if p.is_absolute() or any(part in ("..", ".", "") for part in p.parts) or str(p) != rel:
        return None
    return rel


def _no_symlink_on_the_way(out: Path, rel: str) -> bool:
    """True when no component of DIR/rel (below DIR) is a symlink."""
    cur = out
    for part in PurePosixPath(rel).parts:
        cur = cur / part
        if cur.is_symlink():
            return False
    return True


def _plain_file(out: Path, rel: str) -> bool:
    path = out / rel
    return _no_symlink_on_the_way(out, rel) and path.is_file()


def _read_marker(out: Path) -> Earlier:
    path = out / MARKER
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        files, dirs = data["files"], data.get("dirs", [])
        ok = (data.get("format") == MARKER_FORMAT and isinstance(files, dict) and isinstance(dirs, list)
              and all(_safe_rel(k) and isinstance(v, str) for k, v in files.items())
              and all(_safe_rel(d) for d in dirs))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok or path.is_symlink():
        raise _refuse(out, f"{MARKER} is not one Kiln wrote (unreadable or edited); Kiln will not decide from it "
                      "what to replace: name another directory")
    unsafe = [rel for rel in [*files, *dirs] if not _no_symlink_on_the_way(out, rel)]
    if unsafe:
        raise _refuse(out, f"{_names(unsafe)} is reached through a symlink; Kiln does not follow links inside "
                      "--out: remove the link or name another directory")
    return Earlier(files=dict(files), dirs=tuple(dirs))


def _listing(root: Path) -> tuple[list[str], list[str]]:
    """Files and directories under root, relative POSIX paths, parents before children."""
    files, dirs = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = Path(dirpath).relative_to(root)
        for d in dirnames:
            dirs.append((rel_dir / d).as_posix())
        for f in sorted(filenames):
            files.append((rel_dir / f).as_posix())
    return files, dirs


def render_into(out: Path, write: Callable[[Path], Path], *, target: str, kiln_version: str) -> Path:
    """Check `out`, stage the render with `write(staging_dir)`, then put Kiln's files into `out`.

    Returns the Dockerfile's path in `out`. Raises KilnError (one line) when `out` is refused or
    cannot be written (a read-only file system, a disk filling up).
    """
    try:
        return _render_into(out, write, target=target, kiln_version=kiln_version)
    except OSError as e:
        where = f" ({e.filename})" if e.filename and str(e.filename) != str(out) else ""
        raise _refuse(out, f"cannot write there: {e.strerror or e}{where}") from None


def _render_into(out: Path, write: Callable[[Path], Path], *, target: str, kiln_version: str) -> Path:
    earlier = check_target_dir(out)
    with tempfile.TemporaryDirectory(prefix="kiln-render-") as tmp:
        staging = Path(tmp) / "render"
        staging.mkdir()
        dockerfile = write(staging)
        files, dirs = _listing(staging)
        before = earlier.files if earlier else {}
        theirs = [d for d in dirs if (out / d).is_symlink() or ((out / d).exists() and not (out / d).is_dir())]
        theirs += [rel for rel in files if ((out / rel).exists() or (out / rel).is_symlink())
                   and (rel not in before or not _plain_file(out, rel))]
        if theirs:
            raise _refuse(out, f"{_names(theirs)} {'is' if len(theirs) == 1 else 'are'} not Kiln's (not in "
                          f"{MARKER}) and would be overwritten: move {'it' if len(theirs) == 1 else 'them'} away")
        out.mkdir(exist_ok=True)
        made_before = set(earlier.dirs) if earlier else set()
        # 1. Kiln's old files go (only those, only still as written: checked above).
        for rel in before:
            if _plain_file(out, rel):
                (out / rel).unlink()
        # 2. The new ones arrive; the marker is rewritten whatever happens, listing what is on disk,
        #    so a render cut short (disk full) is still recognised and cleaned up next time.
        written: dict[str, str] = {}
        made: list[str] = []
        try:
            for d in dirs:
                if not (out / d).exists():
                    (out / d).mkdir()
                    made.append(d)
                elif d in made_before:
                    made.append(d)
            for rel in files:
                shutil.copy2(staging / rel, out / rel)
                written[rel] = _sha256(out / rel)
        finally:
            # Directories an earlier render made and this one no longer uses: removed once empty.
            for d in sorted(made_before - set(made), key=lambda s: s.count("/"), reverse=True):
                if (out / d).is_dir() and not (out / d).is_symlink() and not any((out / d).iterdir()):
                    (out / d).rmdir()
                elif (out / d).is_dir():
                    made.append(d)       # still holds the user's files: remembered, never deleted
            _write_marker(out, written, made, target=target, kiln_version=kiln_version)
        return out / dockerfile.relative_to(staging)


def _write_marker(out: Path, files: dict[str, str], dirs: list[str], *, target: str, kiln_version: str) -> None:
    body = {"format": MARKER_FORMAT,
            "what": "files Kiln's `build.py render` wrote here; it replaces only these, and only while unchanged",
            "target": target, "kiln_version": kiln_version, "files": files, "dirs": dirs}
    tmp = out / f"{MARKER}.tmp"
    tmp.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(out / MARKER)
