"""`python build.py router --replicas URL...`: the same supervised router a router pod runs, here, in
front of any OpenAI-compatible servers: it writes a deploy config (engine = "router") into a state
directory and becomes `python -m supervisor run --config` with it (exec: the supervisor is this
process, so Ctrl-C and SIGTERM reach it as they reach PID 1 in a pod).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

from supervisor.config import parse_config
from supervisor.errors import ConfigError, KilnError
from supervisor.validate import Problem

from ..paths import REPO_ROOT
from ..pins.requirements import router_top_level


def _q(value: str) -> str:
    return json.dumps(value)         # a TOML basic string is a JSON string


def deploy_config(args: argparse.Namespace, *, python: str, state_dir: Path) -> str:
    """The router's deploy config from the command's arguments (validated by the caller)."""
    status_urls = args.status_urls or [None] * len(args.replicas)
    key = "none" if args.no_api_key else f"env:{args.api_key_env}"
    lines = ['engine = "router"', f"state_dir = {_q(str(state_dir))}", "", "[server]",
             f"host = {_q(args.host)}", f"port = {args.port}", f"api_key = {_q(key)}", f"binary = {_q(python)}", "",
             "[status]", f"host = {_q(args.host)}", f"port = {args.status_port}", "", "[router]",
             f"policy = {_q(args.policy)}", f"poll_s = {args.poll_s}", f"metrics_port = {args.metrics_port}",
             f"engine_port = {args.engine_port}"]
    for url, status in zip(args.replicas, status_urls):
        lines += ["", "[[router.replicas]]", f"url = {_q(url)}"]
        if status:
            lines.append(f"status_url = {_q(status)}")
    return "\n".join(lines) + "\n"


def router_python(args: argparse.Namespace) -> str:
    if args.router_python:
        return args.router_python
    if importlib.util.find_spec("smg") is None:
        raise KilnError(f"the router (smg) is not installed for {sys.executable}: pip install -e '.[router]' "
                        f"(or pip install {router_top_level()[0]}), or name a Python that has it with --router-python")
    return sys.executable


def require_key(args: argparse.Namespace, env: dict[str, str]) -> None:
    """The router sends its key to the replicas, which accept only the one they were started with: a
    key made up here would route nothing (issue 37 item 10), so the replicas' key is required."""
    if args.no_api_key or env.get(args.api_key_env, "").strip():
        return
    raise KilnError(f"{args.api_key_env} is not set: the router checks the key clients send and sends it on to the "
                    "replicas, which accept only the key they were started with. Export the replicas' key as "
                    f"{args.api_key_env} (a Kiln replica's server.api_key; for pods, the value of your RunPod secret "
                    "kiln_api_key), name another variable with --api-key-env, or pass --no-api-key for replicas "
                    "that take no key")


def run(args: argparse.Namespace) -> int:
    require_key(args, dict(os.environ))
    if args.status_urls and len(args.status_urls) != len(args.replicas):
        raise ConfigError("router", [Problem("--status-urls", f"gives {len(args.status_urls)} URL(s) for "
                                             f"{len(args.replicas)} replica(s): one per replica, in the same order",
                                             args.status_urls)])
    state_dir = Path(args.state_dir or Path.home() / ".cache" / "kiln" / f"router-{args.port}").resolve()
    text = deploy_config(args, python=router_python(args), state_dir=state_dir)
    parse_config(text, source="the router's deploy config")       # every problem named, before anything runs
    if args.print_config:
        sys.stdout.write(text)
        return 0
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "deploy.toml"
    path.write_text(text, encoding="utf-8")
    print(f"router: {path} (policy {args.policy}, {len(args.replicas)} replica(s)) -> "
          f"http://{args.host}:{args.port}/v1; "
          f"status http://{args.host}:{args.status_port}/status", file=sys.stderr, flush=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    os.execve(sys.executable, [sys.executable, "-m", "supervisor", "run", "--config", str(path)], env)
    return 0                         # not reached

