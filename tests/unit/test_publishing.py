"""The pieces the image pipeline is made of: immutable and staging tags, the CI matrix, the docker
build command with a registry cache, and compiling in the build to publish binaries keyed by the
pinned base (a fake docker CLI that records its argv and writes what BuildKit would export)."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from images.binaries import artifacts, obtain as binaries
from images.ci import commands as ci
from images.build import docker as docker_build, tags
from images.pins.lock import load_lock, pins_for
from images.target import load_target
from supervisor import __version__
from supervisor.errors import KilnError

ROOT = Path(__file__).resolve().parents[2]


def test_release_tags_name_target_version_and_engine_and_say_floating():
    lock = load_lock()
    cpu = load_target("cpu-llamacpp")
    pins = pins_for(cpu, lock)
    sha = pins["source.sha256"].value
    assert tags.release_tag(cpu, pins) == f"ghcr.io/kiln-llm/kiln:cpu-llamacpp-{__version__}-{sha[:12]}"
    a40 = load_target("a40-llamacpp")
    assert tags.release_tag(a40, pins_for(a40, lock)) == f"ghcr.io/kiln-llm/kiln:a40-llamacpp-{__version__}-floating"
    staging = tags.staging_tag(tags.release_tag(cpu, pins, "r.example/me/kiln"), "12-1")
    assert staging == f"r.example/me/kiln:staging-cpu-llamacpp-{__version__}-{sha[:12]}-12-1"
    with pytest.raises(KilnError):
        tags.staging_tag(staging, "bad id")
    with pytest.raises(KilnError, match="no tag"):
        tags.release_tag(cpu, pins, "r.example/me/kiln:tag")


def test_ci_matrix_releases_only_reproducible_targets():
    m = ci.matrix("5-1", "r.example/me/kiln")
    names = [row["target"] for row in m["include"]]
    assert "a40-llamacpp" not in names and m["skipped"][0]["target"] == "a40-llamacpp"
    assert "source.commit" in m["skipped"][0]["why"]
    assert "a40-llamacpp-upstream" in names          # issue 17: the releasable Kimi-K3 A40 image
    for row in m["include"]:
        printed = subprocess.run([sys.executable, "build.py", "tag", "--target", row["target"], "--image",
                                  "r.example/me/kiln"], capture_output=True, text=True, cwd=ROOT)
        assert printed.stdout.strip() == row["release"]
        assert row["staging"].startswith("r.example/me/kiln:staging-") and row["staging"].endswith("-5-1")
        assert row["moving"] == f"r.example/me/kiln:{row['target']}"
        assert row["cache"] == f"r.example/me/kiln-cache:{row['target']}"
    r = subprocess.run([sys.executable, "-m", "images.ci", "matrix", "--run-id", "5-1"], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 0 and json.loads(r.stdout)["include"]


def test_build_argv_carries_cache_specs_network_and_loads_for_the_push(monkeypatch):
    monkeypatch.setenv("KILN_DOCKER", "/usr/bin/docker")
    req = docker_build.BuildRequest(context=Path("/ctx"), tags=["r/k:staging-x"], build_args={"A": "1"},
                                    cache_from=["type=registry,ref=r/k-cache:x"],
                                    cache_to=["type=registry,ref=r/k-cache:x,mode=max"], network="default")
    argv = docker_build.build_argv(req)
    assert "--network" not in argv and argv[argv.index("--cache-from") + 1] == "type=registry,ref=r/k-cache:x"
    assert argv[argv.index("--cache-to") + 1].endswith("mode=max") and "--load" in argv
    plain = docker_build.build_argv(docker_build.BuildRequest(context=Path("/ctx"), tags=["t"]))
    assert plain[plain.index("--network") + 1] == "host" and "--load" not in plain and "--cache-to" not in plain


FAKE_DOCKER = """#!/usr/bin/env python3
import json, os, sys
from pathlib import Path
argv = sys.argv[1:]
Path(os.environ["FAKE_DOCKER_LOG"]).write_text(json.dumps(argv))
dest = [a.split("dest=", 1)[1] for a in argv if a.startswith("type=local,dest=")][0]
prefix = Path(dest)
(prefix / "bin").mkdir(parents=True)
(prefix / "share" / "kiln").mkdir(parents=True)
b = prefix / "bin" / "llama-server"
b.write_text("#!/bin/sh\\necho 'version: 1 (fake)' >&2\\n")
b.chmod(0o755)
(prefix / "share" / "kiln" / "llama-server.version.txt").write_text("version: 1 (fake)\\n")
print("#1 exported")
"""


def test_publish_in_build_compiles_on_the_pinned_base_and_keys_the_tarball_by_it(tmp_path, monkeypatch):
    fake = tmp_path / "docker"
    fake.write_text(FAKE_DOCKER)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("KILN_DOCKER", str(fake))
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(tmp_path / "argv.json"))
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(docker_build, "ping", lambda: None)
    target = load_target("cpu-llamacpp")
    pins = pins_for(target, load_lock())
    packed = binaries.compile_in_build(target, pins, network="default")
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[argv.index("--target") + 1] == binaries.EXPORT_STAGE and "--network" not in argv
    spec = binaries.expected_spec(target, pins, str(pins["base.build"].value))
    assert packed.tarball.name == spec.name()     # what `build.py build --binaries auto` looks for
    man = json.loads(packed.manifest.read_text())
    assert man["spec"]["base"] == str(pins["base.build"].value)
    assert artifacts.verify(packed.tarball, packed.manifest, spec)
    dockerfile = (ROOT / "images" / "rendered" / "cpu-llamacpp" / "Dockerfile").read_text()
    assert f"FROM scratch AS {binaries.EXPORT_STAGE}" in dockerfile
    assert "COPY --from=engine-compile /opt/kiln/engine/ /" in dockerfile


def test_publish_binaries_refuses_a_vllm_target():
    r = subprocess.run([sys.executable, "build.py", "publish-binaries", "--target", "a40-vllm",
                        "--store", "/tmp/x"], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "KILN_CACHE_DIR": "/nonexistent"})
    assert r.returncode == 2 and "no compiled binaries" in r.stderr


def test_promote_speaks_the_bearer_token_flow_registries_use(monkeypatch):
    """ghcr.io and Docker Hub answer 401 with a Bearer challenge; the client fetches a token for
    pull,push with the basic credentials from the environment, then retries. A stand-in registry."""
    import base64
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from images.ci import promote

    seen = {}
    manifest = b'{"schemaVersion": 2}'

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/token"):
                seen["token_auth"] = self.headers.get("Authorization")
                seen["token_query"] = self.path
                return self._send(200, b'{"token": "T0K"}')
            if self.headers.get("Authorization") != "Bearer T0K":
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="http://{self.headers["Host"]}/token",'
                                 'service="reg",scope="repository:me/kiln:pull"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            return self._send(200, manifest, {"Content-Type": "application/vnd.oci.image.manifest.v1+json",
                                              "Docker-Content-Digest": "sha256:abc"})

        def _send(self, code, data, headers=None):
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("KILN_REGISTRY_USER", "bot")
    monkeypatch.setenv("KILN_REGISTRY_PASSWORD", "s3cret")
    try:
        host = f"127.0.0.1:{srv.server_address[1]}"
        got = promote.client_from_env(scheme="http").get(f"{host}/me/kiln:staging-x")
    finally:
        srv.shutdown()
    assert got.digest == "sha256:abc" and got.body == manifest
    assert seen["token_auth"] == "Basic " + base64.b64encode(b"bot:s3cret").decode()
    assert "scope=repository%3Ame%2Fkiln%3Apull%2Cpush" in seen["token_query"]
