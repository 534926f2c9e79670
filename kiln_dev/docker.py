"""Find a Docker engine and a local base image for tests and benches that need them.

The engine is the private one that ``scripts/dev-docker.sh start`` runs (its
socket is ``$KILN_DOCKER_DIR/docker.sock``, default ``/var/lib/kiln-docker``),
or whatever ``DOCKER_HOST`` names if that answers. No registry can be reached,
so images are built ``FROM`` a base made locally by ``dev-docker.sh base-image``
(mmdebstrap + ``docker import``).

When no engine answers these raise :class:`kiln_dev.Unavailable` with the
command that starts one; tests/conftest.py makes that a skip, or a failure under
CI (``CI`` is true), because CI must not pass by skipping.

The engine runs with ``--bridge=none``: every build and run needs
``--network host``. docker-py's build API drives the legacy builder (no
``RUN --mount``, no secrets), so BuildKit builds go through the CLI that
:func:`docker_cli` returns: Debian's ``/usr/bin/docker`` (20.10, BuildKit built
in with ``DOCKER_BUILDKIT=1``). The newer client first on PATH here has no
buildx plugin.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import docker

from . import Unavailable

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "scripts" / "dev-docker.sh"
DEFAULT_DIR = os.environ.get("KILN_DOCKER_DIR") or "/var/lib/kiln-docker"
DEFAULT_HOST = f"unix://{DEFAULT_DIR}/docker.sock"
BASE_IMAGE = os.environ.get("KILN_BASE_IMAGE") or "kiln-local/debian:bookworm"
START_COMMAND = 'eval "$(bash scripts/dev-docker.sh start)"'
BASE_IMAGE_COMMAND = "bash scripts/dev-docker.sh base-image"
DEBIAN_CLI = "/usr/bin/docker"
# mmdebstrap takes 30-80 s here; allow for a slow, loaded machine.
BASE_IMAGE_TIMEOUT_S = 900


def client(host: str, timeout: int = 60) -> docker.DockerClient:
    """A docker-py client for ``host``. API version stays 'auto': the engine is
    20.10 (API 1.41 at most) and an explicit newer version is answered 400."""
    return docker.DockerClient(base_url=host, version="auto", timeout=timeout)


def _answers(host: str) -> bool:
    if host.startswith("unix://") and not os.path.exists(host[len("unix://"):]):
        return False
    try:
        c = client(host, timeout=5)
    except Exception:  # DockerException, connection errors while negotiating 'auto'
        return False
    try:
        return bool(c.ping())
    except Exception:
        return False
    finally:
        c.close()


def docker_host() -> str | None:
    """DOCKER_HOST of an engine that answers /_ping: ``$DOCKER_HOST`` if it
    answers, else the default private socket if it answers, else None."""
    env_host = os.environ.get("DOCKER_HOST")
    if env_host and _answers(env_host):
        return env_host
    if env_host != DEFAULT_HOST and _answers(DEFAULT_HOST):
        return DEFAULT_HOST
    return None


def require_docker() -> str:
    """The DOCKER_HOST to use; Unavailable when none answers."""
    host = docker_host()
    if host is None:
        tried = [h for h in (os.environ.get("DOCKER_HOST"), DEFAULT_HOST) if h]
        raise Unavailable(
            f"no Docker engine answers (tried {', '.join(tried)}); "
            f"start one from the repo root with: {START_COMMAND}"
        )
    return host


def docker_client() -> docker.DockerClient:
    """A docker-py client for the engine (Unavailable like require_docker)."""
    return client(require_docker())


def docker_cli() -> tuple[list[str], dict[str, str]]:
    """(argv prefix, env) for a BuildKit-capable docker CLI talking to the engine.

    Use as ``subprocess.run([*argv, "build", "--network", "host", ...], env=env)``.
    """
    host = require_docker()
    if os.access(DEBIAN_CLI, os.X_OK):
        cli = DEBIAN_CLI
    else:  # no Debian client: the PATH one needs a buildx plugin for BuildKit
        cli = shutil.which("docker") or DEBIAN_CLI
    env = dict(os.environ)
    env["DOCKER_HOST"] = host
    env["DOCKER_BUILDKIT"] = "1"
    return [cli], env


def local_base_image(name: str = BASE_IMAGE) -> str:
    """The local base image's name, made with ``dev-docker.sh base-image`` when
    the engine lacks it (Unavailable like require_docker when it cannot be)."""
    host = require_docker()
    c = client(host)
    try:
        try:
            c.images.get(name)
            return name
        except docker.errors.ImageNotFound:
            pass
    finally:
        c.close()
    env = dict(os.environ, DOCKER_HOST=host)
    try:
        proc = subprocess.run(
            ["bash", str(SCRIPT), "base-image", name],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=BASE_IMAGE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise Unavailable(f"making base image {name} took over {BASE_IMAGE_TIMEOUT_S}s; run: {BASE_IMAGE_COMMAND}") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or "").splitlines()[-20:])
        raise Unavailable(
            f"could not make base image {name} (exit {proc.returncode}); "
            f"run: {BASE_IMAGE_COMMAND}\n{tail}"
        )
    return name
