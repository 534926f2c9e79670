"""Target + lock -> Dockerfile and build context. Needs no Docker engine.

One typed context object goes to the template (never the environment, never
a pile of keyword arguments); StrictUndefined makes a misspelt variable fail
the render; every value that lands in a Dockerfile is quoted for where it lands,
and a newline (which could start a new instruction) is refused:

    dq   a word Docker itself reads: ENV, LABEL, ARG (its lexer unescapes backslash, double quote
         and dollar; a backtick means nothing to it)
    shq  a word the shell reads: RUN lines, which Docker passes to /bin/sh (or SHELL) untouched;
         single quotes, so nothing in it is expanded (dollar, backtick, backslash, double quote)
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import jinja2

import supervisor
from supervisor.errors import KilnError

from ..pins import closure as closure_file
from ..pins.cuda import declared_problems
from ..pins.cudafloor import require_cuda
from ..pins.requirements import router_pin_problem
from .engine_facts import FACTS_FILE, facts_path
from ..paths import (COMPILE_SCRIPT, CUDA_FLOOR_SCRIPT, IMAGES_DIR, ROUTER_REQUIREMENTS, SUPERVISOR_DIR,
                     SUPERVISOR_REQUIREMENTS, TEMPLATES_DIR, VLLM_SNAPSHOT_SCRIPT)
from ..pins.lock import Pin, missing, source_date_epoch
from ..target import Target

KILN_VERSION = supervisor.__version__
SOURCE_URL = "https://github.com/kiln-llm/kiln"


class CudaMismatch(KilnError):
    """A target's [cuda] version is not the CUDA its engine runs."""

    def __init__(self, target: Target, problems: list[str]):
        self.problems = problems
        super().__init__(f"target {target.name}: " + "; ".join(problems))


class ClosureMismatch(KilnError):
    """The lock's engine.closure does not match the closure file, or the file does not hold the engine's
    own pinned wheel."""


class FloatingRefused(KilnError):
    """A target has unresolved pins and floating was not allowed."""

    def __init__(self, target: Target, lines: list[str]):
        self.lines = lines
        super().__init__(
            f"target {target.name} has {len(lines)} unresolved pin(s); builds use only locked values:\n"
            + "\n".join(f"  - {line}" for line in lines)
            + "\nResolve them (see images/lock.toml), or pass --allow-floating to build anyway "
              "(the image is then labelled io.kiln.floating=true).")


def _one_line(value: object) -> str:
    s = str(value)
    if any(c in s for c in "\n\r\x00"):
        raise ValueError(f"refusing to put a multi-line value into a Dockerfile: {s!r}")
    return s


def dq(value: object) -> str:
    """Double-quote a value for Docker's own lexer (ENV, LABEL, ARG): never for a RUN line, where
    the shell reads double quotes and runs a backtick in them (use shq)."""
    s = _one_line(value)
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def shq(value: object) -> str:
    """Single-quote a value for the shell of a RUN line: literal, whatever it holds (a quote inside
    is closed, escaped and reopened). Docker does no substitution on RUN, so this is all there is."""
    s = _one_line(value)
    return "'" + s.replace("'", "'\\''") + "'"


@dataclass(frozen=True)
class PatchRef:
    name: str
    filename: str
    sha256: str          # "" when floating: applied unverified, and the image says so


@dataclass(frozen=True)
class RenderContext:
    header: str
    target: Target
    source: object                   # target.source (kind, url, branch, filename)
    source_pin: str                  # sdist sha256 / git commit; "" when floating
    build_base: str                  # ref@digest, or the --base-image override
    runtime_base: str
    patches: tuple[PatchRef, ...]
    patch_excludes: tuple[str, ...]
    cuda_archs: str                  # "86;90" or ""
    cuda: str                        # the CUDA the engine runs ("13.0"), "" for a CPU target
    nvidia_require_cuda: str         # NVIDIA_REQUIRE_CUDA for it ("cuda>=13.0"), "" for a CPU target
    cmake_flags: tuple[str, ...]
    runtime_packages: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]
    ports: tuple[str, ...]
    floating: bool
    engine_facts: str = ""           # images/engine-facts/ file baked beside the flag snapshot; "" none
    closure_file: str = ""           # images/closures/ file a wheel engine installs hash-locked; "" none
    closure_sha256: str = ""         # its sha256, the lock's engine.closure
    closure_count: int = 0           # how many packages it pins
    source_date_epoch: int = 0       # SOURCE_DATE_EPOCH (images/pins/lock.py): file mtimes in Kiln's layers


def pinned_ref(tag_ref: str, pin: Pin) -> str:
    return f"{tag_ref}@{pin.value}" if pin.resolved else tag_ref


def make_context(target: Target, pins: dict[str, Pin], *, allow_floating: bool = False,
                 base_image: str | None = None) -> RenderContext:
    if target.engine == "router" and target.source.package:     # the labels name what the image installs
        problem = router_pin_problem(str(target.source.version), target.source.package,
                                     ROUTER_REQUIREMENTS.read_text(encoding="utf-8"))
        if problem:
            raise KilnError(f"target {target.name}: {problem}")
    unresolved = missing(target, pins)
    if base_image:
        # An explicit override replaces both bases; their pins no longer apply.
        unresolved = [u for u in unresolved if not u.startswith("base.")]
    if unresolved and not allow_floating:
        raise FloatingRefused(target, unresolved)
    cuda_pin = pins.get("engine.cuda")
    problems = declared_problems(target, cuda_pin.value if cuda_pin else None)
    if problems:
        raise CudaMismatch(target, problems)
    floating_keys = tuple(u.split(":", 1)[0] for u in unresolved)
    build_base = base_image or pinned_ref(target.bases.build, pins["base.build"])
    runtime_base = base_image or pinned_ref(target.bases.runtime, pins["base.runtime"])
    src_key = "source.commit" if target.source.kind == "git" else "source.sha256"
    source_pin = pins[src_key].value or ""
    patches = tuple(PatchRef(p.name, f"{p.name}.patch", pins[f"patch.{p.name}"].value or "")
                    for p in target.patches)
    excludes = tuple(sorted({e for p in target.patches for e in p.exclude}))
    closure_name, closure_sha, closure_count = _closure(target, pins, source_pin)
    labels = _labels(target, pins, build_base, runtime_base, source_pin, patches, floating_keys, base_image)
    header = _header(target, floating_keys, base_image)
    ports = tuple(p.split("/")[0] for p in target.runpod.ports if p.endswith("/http")) or ("8080", "8081")
    facts = facts_path(target)
    return RenderContext(header=header, target=target, source=target.source, source_pin=source_pin,
                         build_base=build_base, runtime_base=runtime_base, patches=patches,
                         patch_excludes=excludes, cuda_archs=";".join(target.cuda_archs),
                         cuda=target.cuda_version or "",
                         nvidia_require_cuda=require_cuda(target.cuda_version) if target.cuda_version else "",
                         cmake_flags=target.cmake_flags, runtime_packages=target.runtime_packages,
                         labels=labels, ports=ports, floating=bool(floating_keys),
                         engine_facts=str(facts) if facts and facts.is_file() else "",
                         closure_file=closure_name, closure_sha256=closure_sha, closure_count=closure_count,
                         source_date_epoch=source_date_epoch(target, pins))


def _closure(target: Target, pins: dict[str, Pin], source_pin: str) -> tuple[str, str, int]:
    """(file name, sha256, package count) of the engine's hash-locked closure; ("", "", 0) when the lock
    has none (the image then installs the wheel's requirements unpinned, and says so)."""
    pin = pins.get("engine.closure")
    src = target.source
    if target.source.kind != "pypi-wheel" or pin is None or not pin.resolved or not src.package or not src.version:
        return "", "", 0
    path = closure_file.path_for(src.package, src.version)
    fix = f"run `python build.py lock --target {target.name}` (or `upgrade`), which writes both"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        raise ClosureMismatch(f"target {target.name}: images/lock.toml pins engine.closure {pin.value[:12]}… but "
                              f"{path} cannot be read: {fix}") from None
    if closure_file.digest(text) != pin.value:
        raise ClosureMismatch(f"target {target.name}: {path} has sha256 {closure_file.digest(text)}, images/lock.toml "
                              f"pins engine.closure {pin.value}: {fix}")
    pinned = closure_file.pinned(text)
    version, hashes = pinned.get(src.package, ("", ()))
    if version != src.version or (source_pin and source_pin not in hashes):
        raise ClosureMismatch(f"target {target.name}: {path} does not pin {src.package}=={src.version} with the "
                              f"lock's source.sha256 {source_pin}: {fix}")
    return path.name, pin.value, len(pinned)


def _header(target: Target, floating: tuple[str, ...], base_image: str | None) -> str:
    lines = [f"# GENERATED by Kiln from images/templates/{target.engine}.Dockerfile.j2 for target {target.name}.",
             f"# Do not edit: change images/targets/{target.name}.toml, images/lock.toml or the template,",
             "# then run `python build.py generate`. Tests and `generate --check` fail when this drifts."]
    if floating:
        lines.append(f"# FLOATING: {', '.join(floating)} unresolved (rendered with --allow-floating).")
    if base_image:
        lines.append(f"# BASE OVERRIDDEN: --base-image {base_image}")
    return "\n".join(lines)


def _labels(target: Target, pins: dict[str, Pin], build_base: str, runtime_base: str, source_pin: str,
            patches: tuple[PatchRef, ...], floating: tuple[str, ...],
            base_image: str | None) -> tuple[tuple[str, str], ...]:
    src = target.source
    engine_source = (f"{src.url}#{src.branch}" if src.kind == "git" else f"pypi:{src.package}=={src.version}")
    labels = [
        ("org.opencontainers.image.title", f"kiln-{target.name}"),
        ("org.opencontainers.image.description", target.description),
        ("org.opencontainers.image.version", KILN_VERSION),
        ("org.opencontainers.image.source", SOURCE_URL),
        ("org.opencontainers.image.base.name", runtime_base),
        ("io.kiln.version", KILN_VERSION),
        ("io.kiln.target", target.name),
        ("io.kiln.engine", target.engine),
        ("io.kiln.engine.source", engine_source),
        ("io.kiln.engine.commit", source_pin if src.kind == "git" and source_pin else "unresolved" if src.kind == "git" else "n/a (sdist)"),
        ("io.kiln.engine.source-sha256", source_pin if src.kind != "git" else "n/a (git)"),
        ("io.kiln.patches", ",".join(f"{p.name}@sha256:{p.sha256}" if p.sha256 else f"{p.name}@floating"
                                     for p in patches) or "none"),
        ("io.kiln.cuda", target.cuda_version or "none"),
        ("io.kiln.cuda-archs", ",".join(target.cuda_archs) or "none"),
        ("io.kiln.base.build", build_base),
        ("io.kiln.floating", "true" if floating else "false"),
    ]
    if floating:
        labels.append(("io.kiln.floating-pins", ",".join(floating)))
    if base_image:
        labels.append(("io.kiln.base.override", base_image))
    return tuple(labels)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["dq"] = dq
    env.filters["shq"] = shq
    return env


def render_dockerfile(ctx: RenderContext) -> str:
    return environment().get_template(f"{ctx.target.engine}.Dockerfile.j2").render(ctx=ctx)


def write_context(ctx: RenderContext, out: Path, *, patch_files: dict[str, Path] | None = None) -> Path:
    """Write the Dockerfile and everything it COPYs into `out`, a new or empty directory that Kiln
    made (a temp dir). A directory the user names goes through images/build/outdir.py's render_into,
    which never replaces or deletes what is not Kiln's."""
    if out.exists() and any(out.iterdir()):
        raise KilnError(f"{out}: write_context writes only into a new or empty directory")
    out.mkdir(parents=True, exist_ok=True)
    (out / "Dockerfile").write_text(render_dockerfile(ctx), encoding="utf-8")
    kiln = out / "kiln"
    kiln.mkdir()
    shutil.copy2(COMPILE_SCRIPT, kiln / "compile-llama-server.sh")
    shutil.copy2(VLLM_SNAPSHOT_SCRIPT, kiln / "vllm-flag-snapshot.py")
    shutil.copy2(CUDA_FLOOR_SCRIPT, kiln / "cuda-floor.py")
    shutil.copy2(SUPERVISOR_REQUIREMENTS, kiln / "requirements.txt")
    if ctx.target.engine == "router":
        shutil.copy2(ROUTER_REQUIREMENTS, kiln / "router-requirements.txt")
    shutil.copy2(ctx.target.deploy_config_path, kiln / "deploy.toml")
    (kiln / "profiles").mkdir()
    for name, path in ctx.target.profiles.items():
        shutil.copy2(path, kiln / "profiles" / f"{name}.toml")
    shutil.copytree(SUPERVISOR_DIR, kiln / "supervisor",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "requirements.txt",
                                                  "router-requirements.txt"))
    if ctx.engine_facts:
        shutil.copy2(ctx.engine_facts, kiln / FACTS_FILE)
    if ctx.closure_file:
        shutil.copy2(closure_file.CLOSURES_DIR / ctx.closure_file, kiln / "engine-requirements.txt")
    (kiln / "patches").mkdir()
    (kiln / "binaries").mkdir()
    for p in ctx.patches:
        src = (patch_files or {}).get(p.name)
        if src is None:
            tp = next(x for x in ctx.target.patches if x.name == p.name)
            cand = IMAGES_DIR / tp.path if tp.path else None
            src = cand if cand and cand.is_file() else None
        if src is not None:
            shutil.copy2(src, kiln / "patches" / p.filename)
    (kiln / "build-info.json").write_text(json.dumps(
        {"target": ctx.target.name, "kiln_version": KILN_VERSION, "labels": dict(ctx.labels)},
        indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (out / ".dockerignore").write_text("**/__pycache__\n**/*.pyc\n", encoding="utf-8")
    normalise_tree(out, ctx.source_date_epoch)
    return out / "Dockerfile"


def normalise_tree(root: Path, epoch: int) -> None:
    """Every file and directory under root dated `epoch`, modes 0755 (directories, executables) or 0644.

    A COPY keeps the mtime and mode a context file has; without this they would be the checkout's
    and the render's times, and the umask's modes, so two builds' layers would differ."""
    for path in sorted(root.rglob("*"), reverse=True) + [root]:   # children first: a dir's mtime last
        st = path.lstat()
        if path.is_symlink():
            os.utime(path, (epoch, epoch), follow_symlinks=False)
            continue
        os.chmod(path, 0o755 if path.is_dir() or st.st_mode & 0o111 else 0o644)
        os.utime(path, (epoch, epoch))
