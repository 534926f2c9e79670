"""`router`: the supervised router (smg) in front of replicas, here. Arguments and wiring only: what it
does is images/router/local.py; the router itself is engine = "router" (supervisor/engines/router.py,
supervisor/router/)."""

from __future__ import annotations

import argparse

from supervisor.config import ROUTER_ENGINE_PORT, ROUTER_METRICS_PORT, ROUTER_POLICIES

from .command import Command


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replicas", nargs="+", required=True, metavar="URL",
                   help="each replica's OpenAI-compatible server, its root (http://host:port)")
    p.add_argument("--status-urls", nargs="+", metavar="URL",
                   help="one per replica, in the same order: where its readiness is asked. A Kiln replica's "
                   "status port (http://host:8081: its /ready, 200 only after its selftest); any other server's "
                   "health URL. Default: each replica's own /health")
    p.add_argument("--policy", choices=ROUTER_POLICIES, default="cache_aware",
                   help="how the router picks a replica (default cache_aware: a session stays where its prefix "
                   "is warm)")
    p.add_argument("--host", default="127.0.0.1", help="where the router and its status port listen "
                   "(default 127.0.0.1; 0.0.0.0 to serve others)")
    p.add_argument("--port", type=int, default=8080, help="the router's port: clients' one URL (default 8080)")
    p.add_argument("--status-port", type=int, default=8081, help="its supervisor's /ready /status (default 8081)")
    p.add_argument("--metrics-port", type=int, default=ROUTER_METRICS_PORT,
                   help=f"the router's own Prometheus port, on loopback (default {ROUTER_METRICS_PORT})")
    p.add_argument("--engine-port", type=int, default=ROUTER_ENGINE_PORT,
                   help=f"smg's own port, on loopback, behind the router's port, which answers 503 until a "
                   f"replica is routed (default {ROUTER_ENGINE_PORT})")
    p.add_argument("--poll-s", type=float, default=1.0, help="how often each replica's readiness is asked "
                   "(default 1)")
    p.add_argument("--api-key-env", default="KILN_API_KEY", metavar="NAME",
                   help="the environment variable holding the key clients send and the replicas use "
                   "(default KILN_API_KEY; required: the replicas' own key, since they accept no other)")
    p.add_argument("--no-api-key", action="store_true", help="no key at the router, for replicas that take none")
    p.add_argument("--state-dir", help="where its config, key and logs go (default ~/.cache/kiln/router-PORT)")
    p.add_argument("--router-python", metavar="PATH", help="a Python that has the router's smg, at images/targets/router.toml's [source] "
                   "version (default: this one)")
    p.add_argument("--print-config", action="store_true", help="print the deploy config and exit")


def _run(args: argparse.Namespace) -> int:
    from ..router import local

    return local.run(args)


COMMANDS = (
    Command("router", "one URL in front of several OpenAI-compatible servers: the supervised, prefix-aware router",
            _run, _arguments,
            description="Run the router a router pod runs (smg, supervised by Kiln: restarted with backoff, /status, "
            "/ready), here, in front of any OpenAI-compatible servers. Its workers are exactly the replicas "
            "whose readiness says 200, asked every --poll-s: a Kiln replica joins once its selftest passed and "
            "leaves while it reloads, restarts or fails. Clients send one key (--api-key-env) to one URL; "
            "the router checks it and sends it to the replicas. Requests name the model the router's /v1/models "
            "lists.\n"
            "It writes a deploy config (engine = \"router\") into --state-dir and runs `python -m supervisor run` "
            "with it, in this process: Ctrl-C stops it.\n"
            "docs/router.md: Several pods, one URL."),
)
