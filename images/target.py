"""Targets as data: one TOML file per image under images/targets/.

A target says *what* to build (engine, bases by tag, source repository and
branch or package, patches, CUDA archs, the default deploy config). The
resolved pins (digests, commits, sha256s) live in images/lock.toml; see
lock.py. Validation collects every problem, with field path, bad value and
the allowed values, and reports them at once.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.config import ENGINES, DeployConfig, load_config
from supervisor.errors import ConfigError
from supervisor.validate import Problem, Reader, raise_if

IMAGES_DIR = Path(__file__).resolve().parent
TARGETS_DIR = IMAGES_DIR / "targets"
DEFAULT_TARGET = "cpu-llamacpp"

SOURCE_KINDS = ("git", "sdist", "pypi-wheel")
NAME_RE = r"[a-z0-9][a-z0-9-]{0,62}"
IMAGE_REF_RE = r"[a-z0-9][a-z0-9._/-]*(:[\w][\w.-]{0,127})?(@sha256:[0-9a-f]*)?"
CUDA_ARCH_RE = r"\d{2,3}"


@dataclass(frozen=True)
class Bases:
    build: str          # tag only (e.g. nvidia/cuda:12.8.1-devel-ubuntu24.04); digest in the lock
    runtime: str


@dataclass(frozen=True)
class Source:
    kind: str                    # git | sdist | pypi-wheel
    url: str = ""                # git URL, or the sdist's download URL
    branch: str | None = None    # git: what to follow; the lock pins the commit
    package: str | None = None   # sdist / pypi-wheel: PyPI project name
    version: str | None = None
    filename: str | None = None  # the exact distribution file the lock's sha256 is for


@dataclass(frozen=True)
class Patch:
    name: str
    path: str | None = None      # relative to images/, or given by the user at build time
    url: str | None = None
    exclude: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class RunPodSpec:
    gpu_type: str | None = None
    gpu_count: int = 0
    container_disk_gb: int = 20
    volume_gb: int = 0
    volume_mount: str = "/workspace"
    ports: tuple[str, ...] = ("8080/http", "8081/http")


@dataclass(frozen=True)
class Target:
    name: str
    engine: str
    description: str
    image: str                    # repository the tags go to
    bases: Bases
    source: Source
    cuda_version: str | None
    cuda_archs: tuple[str, ...]
    cmake_flags: tuple[str, ...]
    runtime_packages: tuple[str, ...]
    patches: tuple[Patch, ...]
    binaries_repo: str | None     # Hub repo of prebuilt tarballs: hf://owner/name
    deploy_config_path: Path
    profiles: dict[str, Path]      # other deploy configs baked beside the default (opt-in, by name)
    runpod: RunPodSpec
    path: Path = field(default=Path("."), compare=False)

    @property
    def is_gpu(self) -> bool:
        return bool(self.cuda_version)

    def deploy_config(self) -> DeployConfig:
        return load_config(self.deploy_config_path, env={})


def target_names() -> list[str]:
    return sorted(p.stem for p in TARGETS_DIR.glob("*.toml"))


def load_target(name: str, targets_dir: Path = TARGETS_DIR) -> Target:
    path = targets_dir / f"{name}.toml"
    if not path.is_file():
        names = sorted(p.stem for p in targets_dir.glob("*.toml"))
        raise ConfigError("target", [Problem("--target", "is not a known target", name,
                                             ", ".join(names))])
    return parse_target(path.read_text(encoding="utf-8"), path)


def parse_target(text: str, path: Path) -> Target:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(str(path), [Problem("(toml)", f"is not valid TOML: {e}")]) from None
    problems: list[Problem] = []
    r = Reader(data, "", problems)
    name = r.str("name", path.stem, required=True, pattern=NAME_RE, pattern_hint="lowercase-with-dashes")
    if name != path.stem:
        r.problem("name", f"must match the file name ({path.stem})", name)
    engine = r.str("engine", "llamacpp", required=True, choices=ENGINES)
    description = r.str("description", "", required=True)
    image = r.str("image", "", required=True, pattern=r"[a-z0-9][a-z0-9._/-]*",
                  pattern_hint="a repository without a tag, e.g. ghcr.io/you/kiln")

    b = r.table("base", required=True)
    bases = Bases(
        build=b.str("build", "", required=True, pattern=IMAGE_REF_RE, pattern_hint="name:tag (digest goes in the lock)"),
        runtime=b.str("runtime", "", required=True, pattern=IMAGE_REF_RE, pattern_hint="name:tag"),
    )
    for key, ref in (("build", bases.build), ("runtime", bases.runtime)):
        if "@" in ref:
            b.problem(key, "must not carry a digest: digests live in images/lock.toml", ref)
    b.finish()

    c = r.table("cuda")
    cuda_version = c.str("version", None, pattern=r"\d+\.\d+", pattern_hint='"12.8"')
    archs = c.str_list("archs", item=lambda a: None if a.isdigit() and len(a) in (2, 3)
                       else "must be a compute capability without the dot, e.g. 86")
    c.finish()
    if cuda_version and not archs:
        c.problem("archs", "is required with [cuda] version: which GPUs to compile for", allowed="e.g. [\"86\"]")

    s = r.table("source", required=True)
    kind = s.str("kind", "git", required=True, choices=SOURCE_KINDS)
    source = Source(
        kind=kind,
        url=s.str("url", "", required=kind in ("git", "sdist"), pattern=r"https://\S+",
                  pattern_hint="an https:// URL"),
        branch=s.str("branch", None, required=kind == "git"),
        package=s.str("package", None, required=kind in ("sdist", "pypi-wheel")),
        version=s.str("version", None, required=kind in ("sdist", "pypi-wheel")),
        filename=s.str("filename", None, required=kind in ("sdist", "pypi-wheel")),
    )
    s.finish()
    if engine == "vllm" and kind != "pypi-wheel":
        s.problem("kind", "a vllm target installs vLLM as a pinned wheel", kind, "pypi-wheel")
    if engine == "llamacpp" and kind == "pypi-wheel":
        s.problem("kind", "a llamacpp target is compiled from source", kind, "git, sdist")

    bl = r.table("build")
    cmake_flags = bl.str_list("cmake_flags", item=lambda f: None if f.startswith("-D") and "=" in f
                              and " " not in f else "must look like -DNAME=VALUE")
    runtime_packages = bl.str_list("runtime_packages", item=lambda p: None if p.replace("-", "").replace(".", "").replace("+", "").isalnum()
                                   else "must be a Debian/Ubuntu package name")
    bl.finish()

    patches: list[Patch] = []
    for pr in r.tables("patches"):
        p = Patch(
            name=pr.str("name", "", required=True, pattern=NAME_RE, pattern_hint="lowercase-with-dashes"),
            path=pr.str("path", None),
            url=pr.str("url", None, pattern=r"https://\S+", pattern_hint="an https:// URL"),
            exclude=pr.str_list("exclude"),
            note=pr.str("note", ""),
        )
        pr.finish()
        if p.path and (p.path.startswith("/") or ".." in p.path.split("/")):
            pr.problem("path", "must be relative to images/", p.path)
        patches.append(p)
    if patches and engine != "llamacpp":
        r.problem("patches", "only llamacpp targets apply patches", len(patches))

    bn = r.table("binaries")
    binaries_repo = bn.str("repo", None, pattern=r"hf://[\w.-]+/[\w.-]+", pattern_hint="hf://owner/name")
    bn.finish()

    d = r.table("deploy", required=True)
    deploy_rel = d.str("config", "", required=True)
    profile_rels = d.str_map("profiles", key_pattern=NAME_RE, key_hint="lowercase-with-dashes")
    d.finish()
    deploy_path = (IMAGES_DIR / deploy_rel).resolve() if deploy_rel else IMAGES_DIR
    if deploy_rel and not deploy_path.is_file():
        d.problem("config", "does not exist (paths are relative to images/)", deploy_rel)
    profiles: dict[str, Path] = {}
    for pname, rel in profile_rels.items():
        ppath = (IMAGES_DIR / rel).resolve()
        if not ppath.is_file():
            d.problem(f"profiles.{pname}", "does not exist (paths are relative to images/)", rel)
        profiles[pname] = ppath

    rp = r.table("runpod")
    runpod = RunPodSpec(
        gpu_type=rp.str("gpu_type", None),
        gpu_count=rp.int("gpu_count", 0, min=0, max=16),
        container_disk_gb=rp.int("container_disk_gb", 20, min=1),
        volume_gb=rp.int("volume_gb", 0, min=0),
        volume_mount=rp.str("volume_mount", "/workspace", pattern=r"/\S*", pattern_hint="an absolute path"),
        ports=rp.str_list("ports", ("8080/http", "8081/http"),
                          item=lambda p: None if _port_ok(p) else "must look like 8080/http or 22/tcp"),
    )
    rp.finish()
    r.finish()
    raise_if(problems, f"target {path}")

    target = Target(name=name, engine=engine, description=description, image=image, bases=bases,
                    source=source, cuda_version=cuda_version, cuda_archs=archs,
                    cmake_flags=cmake_flags, runtime_packages=runtime_packages, patches=tuple(patches),
                    binaries_repo=binaries_repo, deploy_config_path=deploy_path, profiles=profiles,
                    runpod=runpod, path=path)
    # The baked deploy configs must themselves be valid: a broken default is a broken image.
    for label, cfg_path in [("its deploy config", deploy_path)] + [(f"its profile {n}", p) for n, p in profiles.items()]:
        try:
            load_config(cfg_path, env={})
        except ConfigError as e:
            raise ConfigError(f"target {path}: {label}", e.problems) from None
    return target


def _port_ok(p: str) -> bool:
    num, _, proto = p.partition("/")
    return num.isdigit() and 0 < int(num) < 65536 and proto in ("http", "tcp")
