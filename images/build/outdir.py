"""`build.py render --out DIR`: write a render into a directory the user names without touching
anything that is not Kiln's.

DIR must be new (its parent existing), empty, or hold Kiln's own earlier render, recognised by
the marker `.kiln-render.json` that lists every file Kiln wrote there with its sha256. Into such
a directory only those files are replaced, and only while they are still what Kiln wrote: a
listed file the user changed since, or a file Kiln would write that the marker does not list
(the user's own `kiln/patches/x.patch`, say), is refused by name before anything is written.

Nothing is ever deleted. A file an earlier render wrote and this one does not (a patch of the
target rendered before) is left in place, listed in the marker under `left` and named on stderr:
the marker is a file the user can edit, so it can never be what decides that a file goes (a
marker edited to list the user's file once got that file deleted). Directories Kiln made are
removed only once they are empty. Kiln never follows a symlink inside DIR.

Resumable: the marker records the intent (`pending`: each file about to be written, with the
sha256 it will have) before the first file in DIR changes, and the finished render replaces it.
A render cut short (Ctrl-C, a full disk, a power cut) leaves a marker that names every file it
may have touched, so the next render recognises them as Kiln's (a pending file is Kiln's whatever
its content: it may be cut short) and finishes the job, instead of refusing them as "not Kiln's".

The render itself goes to a private staging directory first (render.write_context), so a
template or patch error leaves DIR as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
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
    pending: dict[str, str]      # a render cut short: the files it was writing -> the sha256 each was to get
    left: dict[str, str]         # files an earlier render wrote and a later one did not: left in place

    def recorded(self, rel: str) -> str | None:
        """The sha256 Kiln wrote at rel, if the marker says it wrote one there."""
        return self.files.get(rel) or self.left.get(rel)


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
    return _read_marker(out)


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
        pending, left = data.get("pending", {}), data.get("left", {})
        ok = (data.get("format") == MARKER_FORMAT and isinstance(dirs, list)
              and all(isinstance(m, dict) and all(_safe_rel(k) and isinstance(v, str) for k, v in m.items())
                      for m in (files, pending, left))
              and all(_safe_rel(d) for d in dirs))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok or path.is_symlink():
        raise _refuse(out, f"{MARKER} is not one Kiln wrote (unreadable or edited); Kiln will not decide from it "
                      "what to replace: name another directory")
    unsafe = [rel for rel in dict.fromkeys([*files, *pending, *left, *dirs]) if not _no_symlink_on_the_way(out, rel)]
    if unsafe:
        raise _refuse(out, f"{_names(unsafe)} is reached through a symlink; Kiln does not follow links inside "
                      "--out: remove the link or name another directory")
    return Earlier(files=dict(files), dirs=tuple(dirs), pending=dict(pending), left=dict(left))


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


def render_into(out: Path, write: Callable[[Path], Path], *, target: str, kiln_version: str,
                note: Callable[[str], None] | None = None) -> Path:
    """Check `out`, stage the render with `write(staging_dir)`, then put Kiln's files into `out`.

    Returns the Dockerfile's path in `out`. Raises KilnError (one line) when `out` is refused or
    cannot be written (a read-only file system, a disk filling up). `note` (default: stderr) hears
    of files left in place and of an interrupted render resumed.
    """
    say = note or (lambda line: print(line, file=sys.stderr))
    try:
        return _render_into(out, write, target=target, kiln_version=kiln_version, note=say)
    except OSError as e:
        where = f" ({e.filename})" if e.filename and str(e.filename) != str(out) else ""
        raise _refuse(out, f"cannot write there: {e.strerror or e}{where}; the render is incomplete: render "
                      "again once that is fixed (Kiln picks up where it stopped)") from None


def _render_into(out: Path, write: Callable[[Path], Path], *, target: str, kiln_version: str,
                 note: Callable[[str], None]) -> Path:
    earlier = check_target_dir(out) or Earlier({}, (), {}, {})
    with tempfile.TemporaryDirectory(prefix="kiln-render-") as tmp:
        staging = Path(tmp) / "render"
        staging.mkdir()
        dockerfile = write(staging)
        files, dirs = _listing(staging)
        new = {rel: _sha256(staging / rel) for rel in files}
        _refuse_what_is_not_kilns(out, earlier, files, dirs)
        if earlier.pending:
            note(f"note: resuming a render of {out} that was cut short ({len(earlier.pending)} file(s) pending)")
        out.mkdir(exist_ok=True)
        made_before = set(earlier.dirs)
        made = [d for d in dirs if d in made_before or not (out / d).exists()]
        # 1. The intent, before anything in DIR changes: every file this render may touch is Kiln's
        #    from here on, whatever happens next (a later render resumes from this marker).
        _write_marker(out, {**earlier.files}, sorted(made_before | set(made), key=lambda d: d.count("/")),
                      target=target, kiln_version=kiln_version, left=earlier.left,
                      pending={**earlier.pending, **new})
        # 2. The files arrive (each replaces only a file of Kiln's: checked above).
        for d in dirs:
            if not (out / d).exists():
                (out / d).mkdir()
        for rel in files:
            shutil.copy2(staging / rel, out / rel)
        # 3. What an earlier render wrote and this one does not stays where it is: listed as left.
        left = _left_in_place(out, earlier, set(new))
        if left:
            note(f"note: left in place in {out} (an earlier render wrote them, this one does not; Kiln never "
                 f"deletes a file): {_names(sorted(left))}")
        # Directories an earlier render made and this one no longer uses: removed once empty.
        for d in sorted(made_before - set(made), key=lambda s: s.count("/"), reverse=True):
            if (out / d).is_dir() and not (out / d).is_symlink() and not any((out / d).iterdir()):
                (out / d).rmdir()
            elif (out / d).is_dir():
                made.append(d)       # still holds files: remembered, never deleted
        _write_marker(out, new, made, target=target, kiln_version=kiln_version, left=left)
        return out / dockerfile.relative_to(staging)


def _refuse_what_is_not_kilns(out: Path, earlier: Earlier, files: list[str], dirs: list[str]) -> None:
    """Refuse, before anything is written, a render that would replace a file that is not Kiln's: one
    the marker does not list, one Kiln wrote and the user changed since, anything through a link."""
    theirs = [d for d in dirs if (out / d).is_symlink() or ((out / d).exists() and not (out / d).is_dir())]
    changed = []
    for rel in files:
        if not ((out / rel).exists() or (out / rel).is_symlink()):
            continue
        if not _plain_file(out, rel):
            theirs.append(rel)
        elif rel in earlier.pending:
            continue                 # an interrupted render was writing it: Kiln's, whatever it holds
        elif earlier.recorded(rel) is None:
            theirs.append(rel)
        elif _sha256(out / rel) != earlier.recorded(rel):
            changed.append(rel)
    if changed:
        raise _refuse(out, f"{_names(changed)} changed since Kiln rendered {'it' if len(changed) == 1 else 'them'}; "
                      "move the change away (Kiln will not overwrite it), then render again")
    if theirs:
        raise _refuse(out, f"{_names(theirs)} {'is' if len(theirs) == 1 else 'are'} not Kiln's (not in "
                      f"{MARKER}) and would be overwritten: move {'it' if len(theirs) == 1 else 'them'} away")


def _left_in_place(out: Path, earlier: Earlier, now: set[str]) -> dict[str, str]:
    """Files Kiln wrote before, this render does not, still there as Kiln wrote them (a changed one
    is the user's now: no longer listed). A pending one is Kiln's whatever it holds (cut short)."""
    left: dict[str, str] = {}
    for rel in dict.fromkeys([*earlier.files, *earlier.left, *earlier.pending]):
        if rel in now or not _plain_file(out, rel):
            continue
        sha = _sha256(out / rel)
        if rel in earlier.pending or sha == earlier.recorded(rel):
            left[rel] = sha
    return left


def _write_marker(out: Path, files: dict[str, str], dirs: list[str], *, target: str, kiln_version: str,
                  left: dict[str, str] | None = None, pending: dict[str, str] | None = None) -> None:
    body: dict[str, object] = {
        "format": MARKER_FORMAT,
        "what": "files Kiln's `build.py render` wrote here; it replaces only these, only while unchanged, and "
                "deletes none",
        "target": target, "kiln_version": kiln_version, "files": files, "dirs": dirs}
    if left:
        body["left"] = left          # an earlier render's files this one does not write: left in place
    if pending:
        body["pending"] = pending    # a render under way (or cut short): the files it writes, their sha256
    tmp = out / f"{MARKER}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(body, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())     # the intent is on disk before the first file changes
    tmp.replace(out / MARKER)
