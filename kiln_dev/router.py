"""A router in front of Kiln replicas on loopback, for the router's tests and bench (bench/router.py):
real supervisors, each with a real llama-server (SmolLM2-135M) and its selftest, and the real router
(smg) under a supervisor of its own, fed by the replicas' /ready.

    router_python()      the Python that has smg: this one (the dev extra installs it), else
                         $KILN_ROUTER_PYTHON; Unavailable otherwise
    replica_config()     a replica's deploy config: SmolLM2 on one thread, its selftest small
    router_config()      the router's deploy config in front of (url, status_url) pairs
    Fleet                replicas + router as one context manager; model id, chat, which replica
                         served (each replica's own llamacpp:prompt_tokens_total)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import Unavailable
from .supervised import Supervised, config, free_port, http, wait_for

KEY = "kiln-router-test-key-5f1c"
OPERATOR_KEY = "kiln-router-operator-key-9d3e"     # the one key that changes where traffic goes
# Small, so three replicas selftest side by side on two shared cores in seconds: the probes the
# model answers (smollm2), a short decode, no long prefill.
REPLICA_SELFTEST = ('[selftest]\nprobes = "smollm2"\ndecode_tokens = 16\nprefill_tokens = 0\n'
                    'request_wall_s = 60\ntimeout_s = 300\n')


def router_python() -> str:
    if importlib.util.find_spec("smg") is not None:
        return sys.executable
    other = os.environ.get("KILN_ROUTER_PYTHON")
    if other and Path(other).is_file():
        return other
    raise Unavailable("the router (smg) is not installed for this Python: pip install -e '.[dev]' (or '.[router]'), "
                      "or point KILN_ROUTER_PYTHON at a Python that has the smg images/targets/router.toml pins")


def replica_config(tmp: Path, *, model: Path, binary: Path, snapshot: Path, port: int, status_port: int,
                   ctx: int = 4096, slots: int = 1, selftest: str = REPLICA_SELFTEST, extra: str = "") -> str:
    rung = ('[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\n'
            f'args = {json.dumps(["-t", "1", "-c", str(ctx), "-np", str(slots), "--metrics"])}\n')
    return config(binary=binary, model=model, port=port, status_port=status_port, state_dir=tmp / "state",
                  rungs=rung, snapshot=snapshot, selftest=selftest, extra=extra)


def router_config(tmp: Path, *, port: int, status_port: int, metrics_port: int, replicas: list[tuple[str, str]],
                  policy: str = "cache_aware", poll_s: float = 0.5, binary: str | None = None, extra: str = "",
                  engine_port: int | None = None) -> str:
    """[health] leaves stop_grace_s at the router's default (smg holds its listener 5 s on TERM)."""
    reps = "".join(f'[[router.replicas]]\nurl = "{u}"\nstatus_url = "{s}"\n' for u, s in replicas)
    return f"""engine = "router"
state_dir = "{tmp / 'state'}"
[server]
host = "127.0.0.1"
port = {port}
binary = "{binary or router_python()}"
[health]
stall_s = 30
[restart]
backoff_initial_s = 0.5
[status]
host = "127.0.0.1"
port = {status_port}
[router]
policy = "{policy}"
poll_s = {poll_s}
metrics_port = {metrics_port}
engine_port = {engine_port or free_port()}
{extra}
{reps}"""


@dataclass
class Replica:
    sup: Supervised
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def status_url(self) -> str:
        return self.sup.url("/ready")

    def prompt_tokens(self) -> float:
        """The engine's own count of prompt tokens it computed (not taken from its cache)."""
        return self.counters()["computed"]

    def counters(self) -> dict[str, float]:
        """The engine's own prompt counters: tokens it computed, and tokens it took from its cache
        (their sum is what it was sent); -1 when it did not answer."""
        code, body = http(self.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
        out = {}
        for key, name in (("computed", rb"llamacpp:prompt_tokens_total"),
                          ("cached", rb"llamacpp:prompt_tokens_cached_total")):
            m = re.search(rb"^" + name + rb" (\S+)$", body, re.M) if code == 200 else None
            out[key] = float(m.group(1)) if m else -1.0
        return out


class Fleet:
    """n replicas (SmolLM2 under Kiln supervisors, `slots` each with 4096 tokens of context apiece) and a
    supervised router in front of them."""

    def __init__(self, tmp: Path, *, model: Path, prefix: Path, n: int = 2, policy: str = "cache_aware",
                 replica_extra: dict[int, str] | None = None, replica_model: dict[int, Path] | None = None,
                 poll_s: float = 0.5, router_extra: str = "", slots: int = 1):
        self.tmp = tmp
        self.replicas: list[Replica] = []
        for i in range(n):
            d = tmp / f"replica{i}"
            d.mkdir(parents=True, exist_ok=True)
            port = free_port()
            text = replica_config(d, model=(replica_model or {}).get(i, model), binary=prefix / "bin/llama-server",
                                  snapshot=prefix / "share/kiln/llama-server.help.txt", port=port,
                                  status_port=free_port(), extra=(replica_extra or {}).get(i, ""),
                                  ctx=4096 * slots, slots=slots)     # llama.cpp splits -c among the slots
            self.replicas.append(Replica(Supervised(d, text, env={"KILN_API_KEY": KEY}), port))
        d = tmp / "router"
        d.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        text = router_config(d, port=self.port, status_port=free_port(), metrics_port=free_port(),
                             replicas=[(r.url, r.status_url) for r in self.replicas], policy=policy, poll_s=poll_s,
                             extra=router_extra)
        self.router = Supervised(d, text, env={"KILN_API_KEY": KEY})
        self.model = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_routed(self, n: int, timeout: float = 240) -> dict[str, Any]:
        """The router's /status once exactly n replicas are routed."""
        def hit() -> dict[str, Any] | None:
            s = self.router.status()
            return s if s and s.get("router", {}).get("routed") == n else None
        return wait_for(hit, timeout, f"{n} replicas routed", interval=0.1)

    def routed(self) -> list[str]:
        s = self.router.status() or {}
        return [r["url"] for r in s.get("router", {}).get("replicas", []) if r["routed"]]

    def model_id(self) -> str:
        code, body = http(self.url + "/v1/models", timeout=10)
        assert code == 200, (code, body)
        self.model = json.loads(body)["data"][0]["id"]
        return self.model

    def chat(self, messages: list[dict[str, str]], *, key: str | None = KEY, max_tokens: int = 8,
             timeout: float = 120, url: str | None = None) -> tuple[int, dict[str, Any]]:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        body = {"model": self.model or "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        code, out = http((url or self.url) + "/v1/chat/completions", headers=headers, data=json.dumps(body).encode(),
                         timeout=timeout)
        try:
            return code, json.loads(out)
        except ValueError:
            return code, {"raw": out[:300].decode(errors="replace")}

    def served_by(self, messages: list[dict[str, str]], **kw: Any) -> tuple[int, dict[str, Any], list[int]]:
        """One request, and the replicas whose engine computed prompt tokens for it (run one at a time)."""
        before = [r.prompt_tokens() for r in self.replicas]
        code, out = self.chat(messages, **kw)
        after = [r.prompt_tokens() for r in self.replicas]
        return code, out, [i for i, (a, b) in enumerate(zip(before, after)) if b > a]

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc: object) -> None:
        for s in (self.router, *[r.sup for r in self.replicas]):
            s.__exit__(*exc)

