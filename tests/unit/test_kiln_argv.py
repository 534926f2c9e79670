"""The flags Kiln itself puts on an engine's command line, read from the supervisor's real argv builders
(images/upgrade/kiln_argv.py; issue 37 item 12): what `upgrade` checks against a new parser besides the
configs' own flags."""

from __future__ import annotations

from pathlib import Path

from images.upgrade import kiln_argv
from images.upgrade.kiln_argv import builder, kiln_flags
from supervisor.config import load_config, parse_config
from supervisor.engines import registry

ROOT = Path(__file__).resolve().parents[2]


def flags_of(path: str, engine: str) -> list[str]:
    cfg = load_config(ROOT / "images" / "deploy" / path, env={})
    return kiln_flags(registry.get(engine), cfg, cfg.ladder.rungs[0])


def test_each_engines_own_flags_are_read_from_its_builder():
    assert {"--api-key-file", "--metrics", "--host", "--port"} <= set(flags_of("cpu-small.toml", "llamacpp"))
    assert "--served-model-name" in flags_of("qwen3-coder-a40.toml", "vllm")
    router = flags_of("router.toml", "router")
    assert "--api-key" in router and "--health-check-interval-secs" in router      # the launcher's, smg's
    assert builder(registry.get("vllm")) == "supervisor/engines/vllm.py build_argv"


def test_a_flag_the_config_gives_itself_is_the_configs_not_kilns():
    text = (ROOT / "images/deploy/qwen3-coder-a40.toml").read_text()
    cfg = load_config(ROOT / "images/deploy/qwen3-coder-a40.toml", env={})
    mine = cfg.ladder.rungs[0]
    given = parse_config(text.replace('args = [', 'args = ["--served-model-name", "mine", ', 1), env={})
    assert "--served-model-name" in kiln_flags(registry.get("vllm"), cfg, mine)
    assert "--served-model-name" not in kiln_flags(registry.get("vllm"), given, given.ladder.rungs[0])


def test_a_cluster_configs_node_flags_are_read_from_the_cluster_builder_for_rank_0_and_a_headless_rank():
    from images.upgrade.kiln_argv import NODE_BUILDER, node_flags

    cluster = load_config(ROOT / "images/deploy/kimi-k3-nvfp4-b200-cluster.toml", env={})
    assert node_flags(registry.get("vllm"), cluster, nodes=2) == [
        "--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"]
    assert NODE_BUILDER == "supervisor/cluster/engine.py argv"
    single = load_config(ROOT / "images/deploy/qwen3-coder-a40.toml", env={})
    assert node_flags(registry.get("vllm"), single, nodes=1) == []               # one pod: no node argv
    llama = load_config(ROOT / "images/deploy/cpu-small.toml", env={})
    assert node_flags(registry.get("llamacpp"), llama, nodes=2) == []            # clusters are vLLM's only


def _help_without(text: str, flag: str) -> str:
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith(f"  {flag} ") or line.startswith(f"  {flag},") or line.rstrip("\n") == f"  {flag}":
            skipping = True
            continue
        if skipping and line.startswith("   "):
            continue
        skipping = False
        out.append(line)
    return "".join(out)


def test_a_published_config_whose_rungs_span_two_nodes_gets_its_node_flags_linted_on_a_one_node_target(tmp_path):
    # Issue 50 item 4: a config given with `cluster up --config` runs as a cluster when its rungs span more
    # GPUs than a node has (images/deployment.py nodes_of), whatever its target's [runpod] nodes says.
    import dataclasses

    from images.target import load_target
    from images.upgrade import engine as upgrade
    from images.upgrade import flagdiff
    from supervisor.engines import vllm

    help_text = (ROOT / "images/engine-flags/vllm-0.33.0.txt").read_text()
    old = vllm.load_snapshot(ROOT / "images/engine-flags/vllm-0.33.0.txt")
    (tmp_path / "new.txt").write_text(_help_without(help_text, "--master-port"))
    new = vllm.load_snapshot(tmp_path / "new.txt")
    assert new.get("--master-port") is None and new.get("--master-addr") is not None
    target = load_target("a40-vllm")                       # [runpod] nodes = 1
    assert target.runpod.nodes == 1
    moved = dataclasses.replace(target, source=dataclasses.replace(target.source, version="9.9.9"))
    d = flagdiff.diff(old, new, old_version="0.33.0", new_version="9.9.9", known=vllm.REMOVED)
    wide, narrow = tmp_path / "wide.toml", tmp_path / "narrow.toml"
    body = ('engine = "vllm"\n[model]\nsource = "/m/config.json"\nentry = "config.json"\n[hardware]\n'
            'gpu_count = 4\n[ladder]\n[[ladder.rungs]]\nname = "r"\nargs = [{}]\n')
    wide.write_text(body.format('"-tp", "4", "-pp", "2"'))       # 8 GPUs over nodes of 4: 2 nodes
    narrow.write_text(body.format('"-tp", "4"'))                 # one node
    for path, refused in ((narrow, []), (wide, [(kiln_argv.NODE_BUILDER, "--master-port")])):
        p = upgrade.Plan(target, moved, {}, "", "", "", d, {})
        upgrade._lint_all(p, vllm, old, new, [path])
        assert [(r.file, r.flag) for r in p.refusals] == refused, p.refusals
