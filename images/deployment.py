"""A deployment: a target's image and the deploy config it serves.

A target is an engine build (images/targets/*.toml: engine, version, CUDA, archs, base); it bakes a
default deploy config, the field notes' deployment for that image. Any other model is a deploy config
given at deploy time (`pods up|endpoint up|cluster up --target T --config FILE`, the file `plan
--write-config` writes): it travels in the pod's environment as KILN_DEPLOY_CONFIG
(supervisor/deploy_env.py), so the image is not rebuilt and a restarted pod serves it again.

    load(target, config_path, gpu=..., count=...)   the Deployment; ConfigError / KilnError naming the
                                                     file and field when the config cannot run there
    Deployment.env()                                 what goes into each pod's (endpoint's, cluster's) env
    Deployment.shape_source                          where the GPU kind and count came from (for errors)

The shape of a pod, first match: the command line (--gpu, --gpu-count), the config's [plan] table
(what `plan` planned: gpu, cards), its [hardware] gpu_count, the target's [runpod].
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from supervisor import deploy_env
from supervisor.config import DeployConfig, load_config
from supervisor.errors import KilnError
from supervisor.validate import read_text

from .target import Target, load_target, with_config


@dataclass(frozen=True)
class Deployment:
    target: Target                 # the image, its deploy_config_path the config served
    config: DeployConfig
    text: str | None               # the given file's text; None: the image's baked default
    gpu_from: str                  # "--gpu", "[plan] gpu", "the target's [runpod] gpu_type"
    count_from: str                # "--gpu-count", "[plan] cards", "[hardware] gpu_count", "the target's [runpod] gpu_count"

    @property
    def given(self) -> bool:
        return self.text is not None

    @property
    def config_sha(self) -> str:
        """sha256 of what the pod serves: the given file's bytes, or "" for the image's default."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest() if self.text is not None else ""

    def env(self) -> dict[str, str]:
        return {deploy_env.ENV: deploy_env.encode(self.text)} if self.text is not None else {}

    def describe(self) -> str:
        if self.text is None:
            return f"the image's own deploy config ({self.target.deploy_config_path.name})"
        return f"deploy config {self.target.deploy_config_path} (sha256 {self.config_sha[:12]})"


def carried_text(env: dict[str, str] | None) -> str | None:
    """The deploy config a pod (or endpoint) carries in its env; None for the image's default."""
    value = (env or {}).get(deploy_env.ENV)
    if not value:
        return None
    try:
        return deploy_env.decode(value)
    except KilnError:
        return f"<unreadable {deploy_env.ENV}>"


def load(target_name: str, config_path: str | None, *, gpu: str | None = None, count: int | None = None) -> Deployment:
    target = load_target(target_name)
    if config_path is None:
        cfg = target.deploy_config()
        if gpu is not None or count is not None:
            target = with_config(target, target.deploy_config_path, gpu_type=gpu, gpu_count=count)
            target = _baked(target, target_name)
        return Deployment(target, cfg, None, "--gpu" if gpu else "the target's [runpod] gpu_type",
                          "--gpu-count" if count is not None else "the target's [runpod] gpu_count")
    path = Path(config_path)
    if not path.is_file():
        raise KilnError(f"--config {config_path}: no such file (a deploy config: `python build.py plan --model SRC "
                        "--write-config FILE` writes one; images/deploy/ has the field notes' own)")
    text = read_text(path)
    if len(text.encode("utf-8")) > deploy_env.MAX_BYTES:
        raise KilnError(f"--config {config_path}: {len(text.encode())} bytes; a deploy config travels in the pod's "
                        f"environment and may be at most {deploy_env.MAX_BYTES}")
    cfg = load_config(path, env={})
    plan_gpu = cfg.plan.gpu or None
    plan_count = cfg.plan.cards or None
    shape_gpu = gpu or plan_gpu
    shape_count = count if count is not None else plan_count or cfg.hardware.gpu_count
    gpu_from = "--gpu" if gpu else "[plan] gpu" if plan_gpu else "the target's [runpod] gpu_type"
    count_from = "--gpu-count" if count is not None else "[plan] cards" if plan_count else \
        "[hardware] gpu_count" if cfg.hardware.gpu_count is not None else "the target's [runpod] gpu_count"
    per_node = shape_count if shape_count is not None else target.runpod.gpu_count
    moved = with_config(target, path, gpu_type=shape_gpu, gpu_count=shape_count if target.is_gpu else None,
                        nodes=nodes_of(cfg, per_node) if target.is_gpu else 1)
    return Deployment(moved, cfg, text, gpu_from, count_from)


def nodes_of(cfg: DeployConfig, per_node: int) -> int:
    """How many nodes a config's first vLLM rung spans: its tensor x pipeline parallel over the GPUs a
    node has (1 for llama.cpp, or when it fits in one node)."""
    from .target import parallel_of

    if cfg.engine != "vllm" or not cfg.ladder.rungs or per_node < 1:
        return 1
    args = list(cfg.server.extra_args) + list(cfg.ladder.rungs[0].args)
    total = parallel_of(args, ("-tp", "--tensor-parallel-size")) * parallel_of(args, ("-pp", "--pipeline-parallel-size"))
    return total // per_node if total % per_node == 0 and total > per_node else 1


def _baked(target: Target, name: str) -> Target:
    """The shape-overridden target keeps its own baked config and profiles (no KILN_DEPLOY_CONFIG)."""
    import dataclasses

    return dataclasses.replace(target, profiles=load_target(name).profiles)
