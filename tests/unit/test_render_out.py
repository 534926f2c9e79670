"""`build.py render --out DIR` never deletes or overwrites what is not Kiln's (issue 18 item 8: `--out ..`
from a checkout named `kiln` deleted the checkout; `DIR/Dockerfile` was overwritten). DIR must be new,
empty, or Kiln's own earlier render (its marker lists what Kiln wrote); then only Kiln's files are
replaced, and only while unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from images.build.outdir import MARKER

ROOT = Path(__file__).resolve().parents[2]


def render(out: Path | str, *extra: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "build.py"), "render", "--out", str(out), *extra],
                          capture_output=True, text=True, cwd=cwd)


def tree(root: Path) -> dict[str, bytes | str]:
    """Every path under root with its bytes (files), 'dir' or the link target: what the user would see."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = f"-> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes()
    return out


def refused(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def user_files(d: Path) -> None:
    (d / "kiln").mkdir(parents=True)
    (d / "kiln" / "README.md").write_text("the user's checkout, named kiln\n")
    (d / "kiln" / "supervisor").mkdir()
    (d / "kiln" / "supervisor" / "mine.py").write_text("print('mine')\n")
    (d / "notes.txt").write_text("decoy: the user's notes\n")


def test_out_into_a_directory_of_user_files_named_kiln_is_refused_and_nothing_is_touched(tmp_path):
    user_files(tmp_path / "work")
    before = tree(tmp_path)
    msg = refused(render(tmp_path / "work"))
    assert "is not empty" in msg and MARKER in msg
    assert tree(tmp_path) == before


def test_out_dotdot_from_a_checkout_named_kiln_deletes_nothing(tmp_path):
    """The reproduction: cwd is a checkout named `kiln`, `--out ..` is its parent."""
    user_files(tmp_path)
    before = tree(tmp_path)
    refused(render("..", cwd=tmp_path / "kiln"))
    assert tree(tmp_path) == before


def test_a_users_dockerfile_is_never_overwritten(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM mine\n")
    refused(render(tmp_path))
    assert (tmp_path / "Dockerfile").read_text() == "FROM mine\n" and len(list(tmp_path.iterdir())) == 1


def test_a_new_or_empty_directory_gets_the_render_and_a_marker_listing_every_file(tmp_path):
    for out in (tmp_path / "new", tmp_path / "empty"):
        if out.name == "empty":
            out.mkdir()
        r = render(out)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str(out / "Dockerfile")
        marker = json.loads((out / MARKER).read_text())
        on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {MARKER}
        assert set(marker["files"]) == on_disk and "Dockerfile" in on_disk and "kiln/deploy.toml" in on_disk
        assert marker["target"] == "cpu-llamacpp"


def test_rerender_replaces_only_kilns_files_and_keeps_the_users(tmp_path):
    out = tmp_path / "ctx"
    assert render(out).returncode == 0
    (out / "notes.txt").write_text("decoy\n")
    (out / "kiln" / "mine.txt").write_text("mine, inside Kiln's kiln/\n")
    (out / "kiln" / "profiles" / "extra").mkdir()
    (out / "kiln" / "profiles" / "extra" / "x.toml").write_text("x = 1\n")
    r = render(out, "--base-image", "kiln-local/debian:bookworm")
    assert r.returncode == 0, r.stderr
    assert "FROM kiln-local/debian:bookworm" in (out / "Dockerfile").read_text()      # Kiln's file replaced
    assert (out / "notes.txt").read_text() == "decoy\n"
    assert (out / "kiln" / "mine.txt").read_text() == "mine, inside Kiln's kiln/\n"
    assert (out / "kiln" / "profiles" / "extra" / "x.toml").read_text() == "x = 1\n"
    marker = json.loads((out / MARKER).read_text())
    assert "notes.txt" not in marker["files"] and "kiln/mine.txt" not in marker["files"]


def test_a_kiln_file_the_user_changed_is_refused_by_name_and_kept(tmp_path):
    out = tmp_path / "ctx"
    assert render(out).returncode == 0
    with open(out / "Dockerfile", "a") as f:
        f.write("# my edit\n")
    before = tree(out)
    msg = refused(render(out))
    assert "Dockerfile changed since Kiln rendered it" in msg
    assert tree(out) == before


def test_a_user_file_where_kiln_would_write_is_refused_by_name(tmp_path):
    """cpu-llamacpp has no patch; a40-llamacpp writes kiln/patches/llama-k3-moe-cache.patch, which the
    user put there themselves after the first render."""
    out = tmp_path / "ctx"
    assert render(out).returncode == 0
    mine = out / "kiln" / "patches" / "llama-k3-moe-cache.patch"
    mine.write_text("the user's own copy\n")
    patch = tmp_path / "p.patch"
    patch.write_text("--- a/x\n+++ b/x\n")
    before = tree(out)
    msg = refused(render(out, "--target", "a40-llamacpp", "--allow-floating",
                         "--patch-file", f"llama-k3-moe-cache={patch}"))
    assert "kiln/patches/llama-k3-moe-cache.patch is not Kiln's" in msg
    assert tree(out) == before


def test_switching_targets_leaves_kilns_files_the_new_render_does_not_have_and_says_so(tmp_path):
    # Nothing is deleted on a re-render (issue 24, item 10): the other target's patch stays, listed as left.
    out = tmp_path / "ctx"
    patch = tmp_path / "p.patch"
    patch.write_text("--- a/x\n+++ b/x\n")
    assert render(out, "--target", "a40-llamacpp", "--allow-floating",
                  "--patch-file", f"llama-k3-moe-cache={patch}").returncode == 0
    stale = out / "kiln" / "patches" / "llama-k3-moe-cache.patch"
    assert stale.is_file()
    r = render(out)
    assert r.returncode == 0, r.stderr
    assert stale.read_text() == "--- a/x\n+++ b/x\n"
    assert "left in place" in r.stderr and "kiln/patches/llama-k3-moe-cache.patch" in r.stderr
    marker = json.loads((out / MARKER).read_text())
    assert marker["target"] == "cpu-llamacpp" and "kiln/patches/llama-k3-moe-cache.patch" in marker["left"]
    assert "kiln/patches/llama-k3-moe-cache.patch" not in marker["files"] and "pending" not in marker
    # Back to the first target: the file left in place is still Kiln's, and is replaced.
    r = render(out, "--target", "a40-llamacpp", "--allow-floating", "--patch-file", f"llama-k3-moe-cache={patch}")
    assert r.returncode == 0, r.stderr
    assert "kiln/patches/llama-k3-moe-cache.patch" in json.loads((out / MARKER).read_text())["files"]


def test_a_marker_edited_to_list_a_users_file_never_gets_it_deleted(tmp_path):
    # The reproduction: the user lists their own file in .kiln-render.json, with its very sha256.
    out = tmp_path / "ctx"
    assert render(out).returncode == 0
    mine = out / "kiln" / "my-notes.md"
    mine.write_text("the user's own file\n")
    marker = json.loads((out / MARKER).read_text())
    marker["files"]["kiln/my-notes.md"] = hashlib.sha256(mine.read_bytes()).hexdigest()
    (out / MARKER).write_text(json.dumps(marker))
    r = render(out, "--base-image", "kiln-local/debian:bookworm")
    assert r.returncode == 0, r.stderr
    assert mine.read_text() == "the user's own file\n"
    assert "left in place" in r.stderr and "kiln/my-notes.md" in r.stderr


# A re-render cut short, three ways, mid-file: the copy of the second file into --out writes half of it,
# then Ctrl-C (KeyboardInterrupt), a full disk (ENOSPC), or a power cut (SIGKILL: no finally runs).
CUT_SHORT = """
import errno, os, shutil, signal, sys
from pathlib import Path
out, how = Path(sys.argv[1]).resolve(), sys.argv[2]
real, seen = shutil.copy2, []
def copy2(src, dst, **kw):
    if Path(dst).resolve().is_relative_to(out):
        seen.append(dst)
        if len(seen) == 2:
            data = Path(src).read_bytes()
            Path(dst).write_bytes(data[: len(data) // 2])
            if how == "ctrl-c":
                raise KeyboardInterrupt
            if how == "disk-full":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
            os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst, **kw)
shutil.copy2 = copy2
from images.cli.app import main
sys.exit(main(["render", "--out", str(out), *sys.argv[3:]]))
"""


@pytest.mark.parametrize("how,rc", [("ctrl-c", 130), ("disk-full", 2), ("power-cut", -9)])
def test_a_rerender_cut_short_is_resumed_by_the_next_render(tmp_path, how, rc):
    out = tmp_path / "ctx"
    assert render(out).returncode == 0
    (out / "notes.txt").write_text("the user's\n")
    cut = subprocess.run([sys.executable, "-c", CUT_SHORT, str(out), how, "--base-image", "kiln-local/debian:bookworm"],
                         capture_output=True, text=True, cwd=ROOT)
    assert cut.returncode == rc, cut.stderr
    assert "Traceback" not in cut.stderr
    if how == "disk-full":
        assert "No space left on device" in cut.stderr and "render again" in cut.stderr
    r = render(out, "--base-image", "kiln-local/debian:bookworm")
    assert r.returncode == 0, r.stderr                       # was: "... is not Kiln's" / "changed since"
    assert "FROM kiln-local/debian:bookworm" in (out / "Dockerfile").read_text()
    marker = json.loads((out / MARKER).read_text())
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {MARKER, "notes.txt"}
    assert set(marker["files"]) == on_disk and "pending" not in marker and not marker.get("left")
    for rel, sha in marker["files"].items():
        assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == sha, rel
    assert (out / "notes.txt").read_text() == "the user's\n"


def test_a_marker_that_lists_paths_outside_the_directory_is_refused(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("outside\n")
    out = tmp_path / "ctx"
    assert render(out).returncode == 0
    marker = json.loads((out / MARKER).read_text())
    marker["files"]["../victim.txt"] = "0" * 64
    (out / MARKER).write_text(json.dumps(marker))
    before = tree(tmp_path)
    assert "is not one Kiln wrote" in refused(render(out))
    assert tree(tmp_path) == before


def test_kilns_directory_replaced_by_a_symlink_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    out = tmp_path / "ctx"
    assert render(out).returncode == 0
    (out / "kiln").rename(elsewhere)                 # the user's files now, reached through a link
    (out / "kiln").symlink_to(elsewhere)
    before = tree(tmp_path)
    assert "through a symlink" in refused(render(out))
    assert tree(tmp_path) == before


def test_out_naming_a_file_or_a_symlink_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert "is a file, not a directory" in refused(render(f))
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    assert "is a symlink" in refused(render(link))
    assert f.read_text() == "x" and not (tmp_path / "elsewhere").exists()


def test_a_render_that_fails_leaves_the_directory_as_it_was(tmp_path):
    out = tmp_path / "ctx"
    assert render(out).returncode == 0
    before = tree(out)
    r = render(out, "--target", "a40-llamacpp")                 # unresolved pins: refused before writing
    assert r.returncode == 2 and "unresolved" in r.stderr
    assert tree(out) == before
