"""Talking to a Docker engine: is one there, does a base exist, build with secrets, push, read a file
of a built image, and the versions of what builds.

Builds go through the docker CLI with BuildKit, not docker-py: docker-py's
build API drives the legacy builder, which has no `RUN --mount=type=secret`,
and the CA bundle and HF_TOKEN must reach the build as secrets that never
land in a layer. docker-py is used for what it does well: ping, inspect, run.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from supervisor.errors import KilnError
from supervisor.redact import redact

START_HINT = ('start one: `eval "$(bash scripts/dev-docker.sh start)"` (a private dockerd, as CI does), '
              "or Docker Desktop / your system dockerd; or use `python build.py render` to write the "
              "Dockerfile and build context without an engine")


class EngineUnavailable(KilnError):
    pass


class BuildFailed(KilnError):
    pass


def docker_cli() -> str:
    """A docker CLI whose `build` speaks BuildKit (secrets, cache mounts)."""
    explicit = os.environ.get("KILN_DOCKER")
    if explicit:
        return explicit
    # Debian's client supports BuildKit with DOCKER_BUILDKIT=1; some newer
    # clients on PATH delegate to a buildx plugin that may not be installed.
    for candidate in ("/usr/bin/docker", shutil.which("docker")):
        if candidate and Path(candidate).exists():
            return candidate
    raise EngineUnavailable("no docker CLI found; install docker (Debian: apt-get install docker.io), "
                            "or use `python build.py render`")


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["DOCKER_BUILDKIT"] = "1"
    env.update(extra or {})
    return env


def ping() -> None:
    import docker  # docker-py; imported late so `render` and `list` never need it
    from docker.errors import DockerException

    host = os.environ.get("DOCKER_HOST", "the default socket")
    try:
        client = docker.from_env(timeout=5)
        client.ping()
        client.close()
    except DockerException as e:
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise EngineUnavailable(f"no reachable Docker engine at {host} ({first}); {START_HINT}") from None


def image_exists(ref: str) -> bool:
    r = subprocess.run([docker_cli(), "image", "inspect", "--format", "{{.Id}}", ref],
                       capture_output=True, text=True, env=cli_env(), check=False)
    return r.returncode == 0


def os_identity_of_image(ref: str) -> str:
    """`os:<ID>-<VERSION_ID>` of an image, read from its /etc/os-release."""
    r = subprocess.run([docker_cli(), "run", "--rm", "--network", "host", "--entrypoint", "cat", ref,
                        "/etc/os-release"], capture_output=True, text=True, env=cli_env(), check=False)
    if r.returncode != 0:
        raise BuildFailed(f"cannot read /etc/os-release from {ref}: {r.stderr.strip()[:200]}")
    fields = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    ident = fields.get("ID", "unknown").strip('"')
    ver = fields.get("VERSION_ID", "unknown").strip('"')
    return f"os:{ident}-{ver}"


@dataclass
class BuildRequest:
    context: Path
    tags: Sequence[str]
    build_args: Mapping[str, str] = field(default_factory=dict)
    ca_bundle: Path | None = None
    hf_token: str | None = None
    target_stage: str | None = None
    output_dir: Path | None = None     # export a stage's filesystem instead of making an image
    no_cache: bool = False
    cache_from: Sequence[str] = ()     # BuildKit cache specs, e.g. type=registry,ref=R:T
    cache_to: Sequence[str] = ()       # needs a builder that exports cache (buildx docker-container)
    network: str = "host"              # host: the private dockerd has no bridge; default: buildx builders
    iidfile: Path | None = None        # where docker writes the built image's ID (sha256:...)


def build_argv(req: BuildRequest) -> list[str]:
    """`docker build` up to (not including) secrets and the context."""
    argv = [docker_cli(), "build", "--progress", "plain"]
    if req.network != "default":
        argv += ["--network", req.network]
    for t in req.tags:
        argv += ["-t", t]
    for k, v in req.build_args.items():
        argv += ["--build-arg", f"{k}={v}"]
    for spec in req.cache_from:
        argv += ["--cache-from", spec]
    for spec in req.cache_to:
        argv += ["--cache-to", spec]
    if req.cache_to and not req.output_dir:
        # A builder that can export cache keeps the image in its own store: load it into the
        # engine's, where `docker push` (`build.py build --push`) finds it.
        argv.append("--load")
    if req.no_cache:
        argv.append("--no-cache")
    if req.target_stage:
        argv += ["--target", req.target_stage]
    if req.output_dir:
        argv += ["--output", f"type=local,dest={req.output_dir}"]
    if req.iidfile:
        argv += ["--iidfile", str(req.iidfile)]
    return argv


def build(req: BuildRequest, *, on_line: Callable[[str], None] | None = None) -> None:
    """Run `docker build` with BuildKit, streaming its progress; secrets only as --secret."""
    say = on_line or (lambda line: print(line, file=sys.stderr, flush=True))
    argv = build_argv(req)
    with tempfile.TemporaryDirectory(prefix="kiln-secrets-") as tmp:
        if req.ca_bundle:
            if not req.ca_bundle.is_file():
                raise BuildFailed(f"--ca-bundle {req.ca_bundle} is not a file")
            argv += ["--secret", f"id=ca_bundle,src={req.ca_bundle}"]
        if req.hf_token:
            # A 0600 file in a private temp dir, deleted with it: never an env var of the CLI
            # process that a crash dump could show, never a build arg (those land in history).
            tok = Path(tmp) / "hf_token"
            fd = os.open(tok, os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(req.hf_token)
            argv += ["--secret", f"id=hf_token,src={tok}"]
        argv.append(str(req.context))
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=cli_env(),
                                text=True, errors="replace", bufsize=1)
        tail: list[str] = []
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                line = line.rstrip("\n")
                line = redact(line, [req.hf_token])
                tail = (tail + [line])[-30:]
                say(line)
            rc = proc.wait()
        except BaseException:
            # build.py is going away (SIGTERM, Ctrl-C, an error): the docker CLI goes with it, which
            # cancels the build, instead of compiling on unsupervised for minutes.
            _end(proc)
            raise
    if rc != 0:
        hint = ""
        joined = "\n".join(tail)
        if "pull access denied" in joined or "failed to resolve source metadata" in joined or \
                "failed to do request" in joined:
            hint = ("\nhint: a base image could not be pulled. Where no registry is reachable, make one "
                    "locally (`bash scripts/dev-docker.sh base-image`) and pass --base-image NAME.")
        raise BuildFailed(f"docker build failed (exit {rc}); last lines:\n" + joined + hint)


def _end(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def read_image_file(image: str, path: str) -> bytes:
    """One file of an image, as its layers leave it: copied out of a created, never started, container
    (`docker cp` follows a symbolic link at `path`), so nothing from the image runs here."""
    cli = docker_cli()
    r = subprocess.run([cli, "create", image], capture_output=True, text=True, env=cli_env(), check=False)
    if r.returncode != 0:
        raise BuildFailed(f"cannot read {path} from {image}: docker create failed: {r.stderr.strip()[:200]}")
    container = r.stdout.strip().splitlines()[-1]
    try:
        cp = subprocess.run([cli, "cp", "-L", f"{container}:{path}", "-"], capture_output=True, env=cli_env(), check=False)
    finally:
        subprocess.run([cli, "rm", container], capture_output=True, env=cli_env(), check=False)
    if cp.returncode != 0:
        raise BuildFailed(f"cannot read {path} from {image}: {cp.stderr.decode(errors='replace').strip()[:200]}")
    with tarfile.open(fileobj=io.BytesIO(cp.stdout)) as tar:
        member = next((m for m in tar.getmembers() if m.isfile()), None)
        f = tar.extractfile(member) if member else None
        if f is None:
            raise BuildFailed(f"cannot read {path} from {image}: it is not a regular file")
        return f.read()


def image_id(ref: str) -> str:
    """The image's ID (sha256:<hex> of its config) in the engine's store."""
    r = subprocess.run([docker_cli(), "image", "inspect", "--format", "{{.Id}}", ref],
                       capture_output=True, text=True, env=cli_env(), check=False)
    if r.returncode != 0:
        raise BuildFailed(f"no image {ref} in the engine's store: {r.stderr.strip()[:200]}")
    return r.stdout.strip()


def versions() -> dict[str, str]:
    """The versions of what builds: the docker CLI, the engine (whose built-in BuildKit runs a plain
    `DOCKER_BUILDKIT=1 docker build`) and, where the CLI has it, buildx. Only what the tools print."""
    cli = docker_cli()
    out: dict[str, str] = {}
    r = subprocess.run([cli, "version", "--format", "{{json .}}"], capture_output=True, text=True, env=cli_env(),
                       check=False)
    try:
        v = json.loads(r.stdout) if r.returncode == 0 else {}
    except json.JSONDecodeError:
        v = {}
    if (v.get("Client") or {}).get("Version"):
        out["docker-cli"] = v["Client"]["Version"]
    if (v.get("Server") or {}).get("Version"):
        out["docker-engine"] = v["Server"]["Version"]
    r = subprocess.run([cli, "buildx", "version"], capture_output=True, text=True, env=cli_env(), check=False)
    words = r.stdout.split()
    if r.returncode == 0 and len(words) >= 2 and "buildx" in words[0]:
        out["buildx"] = words[1]    # "github.com/docker/buildx v0.11.2 <commit>"
    elif "docker-engine" in out:
        # No buildx: `DOCKER_BUILDKIT=1 docker build` runs the BuildKit built into the engine, which
        # reports no version of its own; the engine's version names it.
        out["buildkit"] = f"built into docker-engine {out['docker-engine']}"
    return out


def push(tag: str) -> None:
    # Progress to stderr: stdout carries only what build.py produced (the tag), for scripts.
    r = subprocess.run([docker_cli(), "push", tag], env=cli_env(), check=False, stdout=sys.stderr)
    if r.returncode != 0:
        raise BuildFailed(f"docker push {tag} failed (exit {r.returncode}); are you logged in to the registry?")
