"""Targets as data: one TOML file per image under images/targets/.

A target says *what* to build (engine, bases by tag, source repository and
branch or package, patches, CUDA archs, the default deploy config). The
resolved pins (digests, commits, sha256s) live in images/lock.toml; see
lock.py. Validation collects every problem, with field path, bad value and
the allowed values, and reports them at once.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.config import ENGINES, DeployConfig, load_config
from supervisor.errors import ConfigError
from supervisor.validate import Problem, Reader, nearest, raise_if, read_text

from .paths import IMAGES_DIR, TARGETS_DIR

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
    """The [runpod] table: what `build.py template` turns into a RunPod template."""
    gpu_type: str | None = None
    gpu_count: int = 0
    container_disk_gb: int = 20
    volume_gb: int = 0
    volume_mount: str = "/workspace"
    ports: tuple[str, ...] = ("8080/http", "8081/http", "8082/tcp")
    template_name: str = ""                       # default kiln-<target>
    # env var -> RunPod secret name, sent as {{ RUNPOD_SECRET_<name> }}, never a value. The
    # effective map: the deploy config's API key env and, for a Hub model, HF_TOKEN, then
    # whatever [runpod.secrets] adds or renames.
    secrets: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()         # [runpod.env]: plain supervisor overrides
    # 1: one pod (`pods up`); 2..250: one RunPod Instant Cluster of that many nodes of gpu_count
    # GPUs each (`cluster up`), the model served by vLLM across them (docs/clusters.md: A cluster target).
    nodes: int = 1

    @property
    def is_cluster(self) -> bool:
        return self.nodes > 1

    def port_numbers(self, proto: str) -> tuple[int, ...]:
        return tuple(int(p.split("/")[0]) for p in self.ports if p.endswith(f"/{proto}"))


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
    if not re.fullmatch(NAME_RE, name) or not path.is_file():     # a name, never a path
        names = sorted(p.stem for p in targets_dir.glob("*.toml"))
        raise ConfigError("target", [Problem("--target", "is not a known target", name,
                                             ", ".join(names))])
    return parse_target(read_text(path), path)


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
    if engine == "router" and kind != "pypi-wheel":
        s.problem("kind", "a router target installs its router (smg) as a pinned wheel", kind, "pypi-wheel")

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
    if engine == "router" and cuda_version:
        c.problem("version", "a router routes on a CPU: it needs no CUDA", cuda_version)
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

    runpod = _read_runpod(r.table("runpod"), name)
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
    # [runpod] against the deploy config the pod will run (ports, GPUs, volume, secrets).
    rp_problems: list[Problem] = []
    runpod = _check_runpod(target, target.deploy_config(), rp_problems)
    raise_if(rp_problems, f"target {path}")
    return dataclasses.replace(target, runpod=runpod)


def with_config(target: Target, path: Path, *, gpu_type: str | None = None, gpu_count: int | None = None,
                nodes: int | None = None) -> Target:
    """The target's image with another deploy config (`up --config FILE`): its [runpod] checks run again
    against that config (ports, the model's volume, its secrets), the pod's shape from the config's
    own when given. ConfigError, every problem at once, when the config cannot run in this image's pods."""
    cfg = load_config(path, env={})
    rp = dataclasses.replace(target.runpod, gpu_type=gpu_type or target.runpod.gpu_type,
                             gpu_count=target.runpod.gpu_count if gpu_count is None else gpu_count, secrets=(),
                             nodes=target.runpod.nodes if nodes is None else nodes)
    moved = dataclasses.replace(target, deploy_config_path=Path(path).resolve(), profiles={}, runpod=rp)
    problems: list[Problem] = []
    runpod = _check_runpod(moved, cfg, problems, shape_checked_elsewhere=True)
    raise_if(problems, f"deploy config {path} in the {target.name} image's pods")
    return dataclasses.replace(moved, runpod=runpod)


def _port_ok(p: str) -> bool:
    num, _, proto = p.partition("/")
    return num.isdigit() and 0 < int(num) < 65536 and proto in ("http", "tcp")


# -- [runpod] ------------------------------------------------------------------------------
# Env vars Kiln's template sets itself from the deploy config; [runpod.env] must not.
TEMPLATE_OWNED_ENV = ("KILN_SERVER_PORT", "KILN_STATUS_PORT", "KILN_DEPLOY_CONFIG")   # the last: `up --config`
# What the supervisor reads besides its ENV_OVERRIDES (supervisor/__main__.py).
SUPERVISOR_RUN_ENV = ("KILN_CONFIG", "KILN_EXIT_ON_FAILURE")
SECRET_NAME_RE = r"[A-Za-z0-9_]{1,64}"
OPERATOR_SECRET = "kiln_operator_key"     # the router's operator key: never the clients' kiln_api_key
MAX_HTTP_PORTS = 10      # RunPod's console: "Expose HTTP Ports (Max 10)"


def _read_runpod(rp: Reader, target_name: str) -> RunPodSpec:
    spec = RunPodSpec(
        gpu_type=rp.str("gpu_type", None),
        gpu_count=rp.int("gpu_count", 0, min=0, max=16),
        container_disk_gb=rp.int("container_disk_gb", 20, min=1),
        volume_gb=rp.int("volume_gb", 0, min=0),
        volume_mount=rp.str("volume_mount", "/workspace", pattern=r"/\S*", pattern_hint="an absolute path"),
        ports=rp.str_list("ports", RunPodSpec.ports,
                          item=lambda p: None if _port_ok(p) else "must look like 8080/http or 22/tcp"),
        template_name=rp.str("template_name", f"kiln-{target_name}", pattern=r"[a-z0-9][a-z0-9._-]{0,62}",
                             pattern_hint="lowercase letters, digits, . _ -, at most 63"),
        secrets=tuple(sorted(rp.str_map("secrets").items())),
        env=tuple(sorted(rp.str_map("env").items())),
        nodes=rp.int("nodes", 1, min=1, max=250),
    )
    rp.finish()
    return spec


def parallel_of(args: list[str], names: tuple[str, ...]) -> int:
    """The value of a vLLM size flag (`-tp 8`, `--tensor-parallel-size=8`) in `args`; 1 when absent."""
    for i, a in enumerate(args):
        flag, eq, value = a.partition("=")
        if flag in names:
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            return int(value) if value.isdigit() else 0
    return 1


def _check_cluster(target: Target, cfg: DeployConfig, r: Reader) -> None:
    """A cluster target: vLLM (the one engine with a multi-node executor), and every rung spanning
    exactly nodes x gpu_count GPUs, tensor parallel within a node (docs/clusters.md: A cluster target)."""
    rp = target.runpod
    if target.engine != "vllm":
        r.problem("nodes", f"a cluster ({rp.nodes} nodes) is served by vLLM's multi-node executor; engine "
                  f"{target.engine!r} spans one node only", rp.nodes, "nodes = 1, or a vLLM target")
        return
    for rung in cfg.ladder.rungs:
        args = list(cfg.server.extra_args) + list(rung.args)
        tp = parallel_of(args, ("-tp", "--tensor-parallel-size"))
        pp = parallel_of(args, ("-pp", "--pipeline-parallel-size"))
        if tp * pp != rp.nodes * rp.gpu_count:
            r.problem("nodes", f"rung {rung.name!r} spans tensor x pipeline parallel = {tp} x {pp} GPUs, the "
                      f"cluster has {rp.nodes} nodes x {rp.gpu_count} GPUs", rung.name,
                      f"-tp {rp.gpu_count} -pp {rp.nodes} (tensor parallel within a node, pipeline across nodes)")


def _check_runpod(target: Target, cfg: DeployConfig, problems: list[Problem], *,
                  shape_checked_elsewhere: bool = False) -> RunPodSpec:
    """Cross-field checks of [runpod] against the deploy config, every problem collected;
    returns the spec with its effective secrets. `shape_checked_elsewhere`: a deploy config given at
    `up` is checked against the pod's shape by images/runpod/precheck.py, with the shape's own fields."""
    from supervisor.config import ENV_OVERRIDES

    from .runpod_schema import gpu_types

    rp = target.runpod
    r = Reader({}, "runpod", problems)     # for its problem() helper: paths read runpod.<key>

    # Ports: one protocol per number (a third-party client measured that RunPod maps a port one
    # way only), the API and the status page over the HTTP proxy, and a TCP port for what the
    # proxy cuts (Cloudflare closes a request after ~100-125 s with error 524).
    numbers = [int(p.split("/")[0]) for p in rp.ports]
    for n in sorted({n for n in numbers if numbers.count(n) > 1}):
        r.problem("ports", f"port {n} is listed more than once: expose each port one way only "
                  "(RunPod maps a port either to its HTTP proxy or to a TCP port)",
                  [p for p in rp.ports if int(p.split("/")[0]) == n])
    http, tcp = rp.port_numbers("http"), rp.port_numbers("tcp")
    for what, port in (("the API (deploy config server.port)", cfg.server.port),
                       ("the status page (deploy config status.port)", cfg.status.port)):
        if port not in http:
            r.problem("ports", f"{what} listens on {port}: expose it as \"{port}/http\"", list(rp.ports))
    if not [p for p in tcp if p not in (cfg.server.port, cfg.status.port)]:
        r.problem("ports", "needs a TCP port for requests longer than RunPod's HTTP proxy allows "
                  "(~100-125 s, then error 524)", list(rp.ports), "e.g. \"8082/tcp\"")
    if len(http) > MAX_HTTP_PORTS:
        r.problem("ports", f"RunPod exposes at most {MAX_HTTP_PORTS} HTTP ports", len(http))

    # GPUs: what RunPod rents must be what the deploy config's hardware guard expects.
    if target.is_gpu:
        if not rp.gpu_type:
            r.problem("gpu_type", "is required for a GPU target ([cuda] is set)", allowed="e.g. \"NVIDIA A40\"")
        if rp.gpu_count < 1:
            r.problem("gpu_count", "must be at least 1 for a GPU target", rp.gpu_count)
    elif rp.gpu_type or rp.gpu_count:
        r.problem("gpu_type", "a CPU target ([cuda] unset) rents no GPU", rp.gpu_type or rp.gpu_count)
    if rp.gpu_type and rp.gpu_type not in gpu_types():
        hint = nearest(rp.gpu_type, gpu_types())
        r.problem("gpu_type", "is not a RunPod GPU type id" + (f"; did you mean {hint!r}?" if hint else ""),
                  rp.gpu_type, "the gpu_types ids in images/schemas/runpod-rest-v2.json (RunPod's GPU types page)")
    if target.is_gpu and cfg.hardware.gpu_count is not None and rp.gpu_count != cfg.hardware.gpu_count \
            and not shape_checked_elsewhere:
        r.problem("gpu_count", f"the deploy config's [hardware] expects exactly {cfg.hardware.gpu_count} GPU(s): "
                  "the supervisor would refuse the pod", rp.gpu_count)

    if rp.is_cluster and not shape_checked_elsewhere:
        _check_cluster(target, cfg, r)

    # Storage: RunPod's persistent mount has a 10 GB floor (PersistentMount.size minimum).
    if 0 < rp.volume_gb < 10:
        r.problem("volume_gb", "RunPod's persistent volume is at least 10 GB (or 0 for none)", rp.volume_gb)
    # A Hub model is cached under state_dir, which must be on the volume (the container
    # disk is wiped on restart and sized for the image, not the weights).
    mount = rp.volume_mount.rstrip("/") or "/"
    on_volume = rp.volume_gb > 0 and (cfg.state_dir == mount or cfg.state_dir.startswith(mount.rstrip("/") + "/"))
    if cfg.model.hf_repo and not on_volume:
        r.problem("volume_gb", f"the model is downloaded from the Hub into state_dir {cfg.state_dir}, which must be "
                  "on the volume (volume_gb > 0 and volume_mount a parent of state_dir)",
                  {"volume_gb": rp.volume_gb, "volume_mount": rp.volume_mount})

    # Env: what the supervisor reads, and never a secret value.
    known_env = (*ENV_OVERRIDES, *SUPERVISOR_RUN_ENV)
    env = dict(rp.env)
    for key, value in rp.env:
        if key in TEMPLATE_OWNED_ENV:
            r.problem(f"env.{key}", "is set by Kiln from the deploy config; change the deploy config instead")
        elif key not in known_env:
            hint = nearest(key, known_env)
            r.problem(f"env.{key}", "is not an environment variable the supervisor reads"
                      + (f"; did you mean {hint!r}?" if hint else ""), allowed=", ".join(known_env))
        if re.search(r"(KEY|TOKEN|SECRET|PASSWORD)$", key):
            r.problem(f"env.{key}", "looks like a secret: name a RunPod secret in [runpod.secrets] instead")
        if key == "KILN_CONFIG":
            configs = ["/etc/kiln/deploy.toml"] + [f"/etc/kiln/profiles/{n}.toml" for n in target.profiles]
            if value not in configs:
                r.problem(f"env.{key}", "is not a config baked into the image", value, ", ".join(configs))
    secrets: dict[str, str] = {}
    if cfg.server.api_key.startswith("env:"):
        secrets[cfg.server.api_key[4:]] = "kiln_api_key"
    if cfg.model.hf_repo:
        secrets["HF_TOKEN"] = "hf_token"
    if cfg.engine == "router" and cfg.router.operator_key.startswith("env:"):
        secrets[cfg.router.operator_key[4:]] = OPERATOR_SECRET      # who may change where traffic goes
    for key, secret in rp.secrets:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            r.problem(f"secrets.{key}", "is not an environment variable name")
        if not re.fullmatch(SECRET_NAME_RE, secret):
            r.problem(f"secrets.{key}", "is not a RunPod secret name", secret, "letters, digits and _")
        if key in env:
            r.problem(f"secrets.{key}", "is also in [runpod.env]: a variable is either a secret or a value")
        secrets[key] = secret
    return dataclasses.replace(rp, secrets=tuple(sorted(secrets.items())))
