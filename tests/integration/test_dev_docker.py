"""The private engine from scripts/dev-docker.sh works for what Kiln needs:
it answers, runs containers on the host network, and BuildKit secrets reach a
build step without landing in any layer or in the image history.

Needs a running engine (`eval "$(bash scripts/dev-docker.sh start)"`); the
base image is made on first use (`bash scripts/dev-docker.sh base-image`).
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # plain `pytest` (not `python -m pytest`) from anywhere
    sys.path.insert(0, str(ROOT))

from kiln_dev import docker as dockerenv  # noqa: E402

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def host() -> str:
    return dockerenv.require_docker()


@pytest.fixture(scope="module")
def base_image(host: str) -> str:
    return dockerenv.local_base_image()


def _cli(*args: str, timeout: int = 300, check: bool = True) -> subprocess.CompletedProcess:
    argv, env = dockerenv.docker_cli()
    proc = subprocess.run(
        [*argv, *args], env=env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=timeout,
    )
    if check and proc.returncode != 0:
        pytest.fail(f"docker {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    return proc


def test_engine_answers_ping(host: str) -> None:
    c = dockerenv.client(host)
    try:
        assert c.ping() is True
        version = c.version()
        # Debian's engine is 20.10 (API 1.41); 'auto' negotiated something it accepts.
        assert float(version["ApiVersion"]) >= 1.40, version
    finally:
        c.close()


def test_container_on_host_network_prints(host: str, base_image: str) -> None:
    proc = _cli(
        "run", "--rm", "--network", "host", base_image,
        "python3", "-c", "print('kiln-container-ok')",
        timeout=120,
    )
    assert proc.stdout.strip() == "kiln-container-ok", proc.stderr


def _scan_tar(data: bytes, needles: dict[str, bytes], found: dict[str, list[str]], where: str) -> None:
    """Record, per needle, every member (recursing into nested tars, compressed
    or not) whose bytes or name contain it."""
    try:
        tf = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    except tarfile.TarError:
        return
    with tf:
        for member in tf:
            path = f"{where}!{member.name}" if where else member.name
            for key, needle in needles.items():
                if needle in member.name.encode():
                    found[key].append(path + " (name)")
            if not member.isfile():
                continue
            fobj = tf.extractfile(member)
            if fobj is None:
                continue
            blob = fobj.read()
            for key, needle in needles.items():
                if needle in blob:
                    found[key].append(path)
            _scan_tar(blob, needles, found, path)


def test_buildkit_secret_is_readable_but_not_stored(host: str, base_image: str, tmp_path: Path) -> None:
    run_id = uuid.uuid4().hex
    canary = f"kiln-canary-{run_id}"
    # A marker in the RUN line: busts the build cache (BuildKit does not key
    # on secret content) and is a positive control for the scans below.
    marker = f"kiln-marker-{run_id}"
    tag = f"kiln-test/secret:{run_id[:12]}"

    ctx = tmp_path / "ctx"
    ctx.mkdir()
    secret = tmp_path / "secret.txt"  # outside the build context
    secret.write_text(canary)
    # No `# syntax=` line: that would pull a frontend image from a registry.
    (ctx / "Dockerfile").write_text(
        f"FROM {base_image}\n"
        "RUN --mount=type=secret,id=s,required=true \\\n"
        f"    echo {marker} > /marker \\\n"
        "    && sha256sum /run/secrets/s | cut -d' ' -f1 > /secret.sha256 \\\n"
        "    && test -s /run/secrets/s\n"
    )

    build = _cli(
        "build", "--network", "host", "--progress", "plain",
        "--secret", f"id=s,src={secret}", "-t", tag, str(ctx),
        timeout=600,
    )
    try:
        build_log = build.stdout + build.stderr
        assert canary not in build_log

        # Readable during the build: the step recorded the secret's hash.
        proof = _cli("run", "--rm", "--network", "host", tag,
                     "sh", "-c", "cat /secret.sha256; cat /marker; ls -A /run/secrets 2>/dev/null | wc -l",
                     timeout=120).stdout.split()
        assert proof[0] == hashlib.sha256(canary.encode()).hexdigest()
        assert proof[1] == marker
        assert proof[2] == "0"  # the mount point leaves no secret file behind

        # Not in the history (positive control: the RUN line with the marker is).
        history = _cli("history", "--no-trunc", tag).stdout
        assert marker in history
        assert canary not in history

        # Not in any layer or in the config: scan everything `docker save` gives.
        saved = tmp_path / "image.tar"
        _cli("save", "-o", str(saved), tag, timeout=300)
        needles = {"canary": canary.encode(), "marker": marker.encode()}
        found: dict[str, list[str]] = {"canary": [], "marker": []}
        _scan_tar(saved.read_bytes(), needles, found, "")
        assert found["marker"], "scan is blind: the marker file written in a layer was not found"
        assert found["canary"] == [], f"secret leaked into: {found['canary']}"

        inspect = _cli("image", "inspect", tag).stdout
        assert canary not in inspect
    finally:
        _cli("image", "rm", "-f", tag, check=False)
