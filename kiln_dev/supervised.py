"""Run the real supervisor (`python -m supervisor run`) as a child process and watch it
through its own status port; the loopback helpers every stand-in uses (free_port, http, wait_for);
and the deploy-config builder of tests and benches. Waits are conditions with deadlines, never
fixed sleeps."""

from __future__ import annotations

import base64

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

from . import children

# The checkout kiln_dev sits in: the supervisor child runs this checkout's code.
REPO_ROOT = Path(__file__).resolve().parents[1]
FAKE = Path(__file__).resolve().with_name("fake_llama_server.py")
FAKE_VLLM = Path(__file__).resolve().with_name("fake_vllm.py")


_GIVEN: set[int] = set()        # ports handed out by this process: never twice


def free_port() -> int:
    """A loopback port free now and not handed out before by this process: the kernel's pick for
    port 0 is random, and the same port given to two servers that bind later is a collision (CI:
    a pod's TCP relay took the port another pod's status page was given a moment later)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
    raise AssertionError("no loopback port free that was not handed out already")


def fake_vllm_bench(tmp: Path, wrapper: str) -> tuple[Path, Path]:
    """A `vllm` for the benches (a shell script around fake_vllm.py: `wrapper` with {python} and
    {fake} filled in picks the scenario) and a model directory it accepts: (binary, model)."""
    binary = tmp / "vllm"
    binary.write_text(wrapper.format(python=sys.executable, fake=FAKE_VLLM))
    binary.chmod(0o755)
    model = tmp / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return binary, model


def free_pair() -> int:
    """A free port whose next one is free too: benches that put a status port at --port + 1."""
    for _ in range(50):
        port = free_port()
        if port + 1 in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                _GIVEN.add(port + 1)
                return port
            except OSError:
                continue
    raise AssertionError("no two free ports in a row")


def wait_for(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)  # polling interval of a condition wait, not a stand-in for one


def http(url: str, *, headers: dict[str, str] | None = None, data: bytes | None = None,
         timeout: float = 10) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


class Supervised:
    """`config` is the file's text (bytes: written as they are, a config that is not UTF-8, say);
    `status_port` where to watch it, when its [status] table does not say (or the env moves it).
    `carried`: no --config; the config reaches the supervisor as a deployment's KILN_DEPLOY_CONFIG."""

    def __init__(self, tmp: Path, config: str | bytes, *, env: dict[str, str] | None = None,
                 args: tuple[str, ...] = (), status_port: int | None = None, carried: bool = False):
        self.tmp = tmp
        self.cfg_path = tmp / "deploy.toml"
        if isinstance(config, bytes):
            self.cfg_path.write_bytes(config)
            config = config.decode("utf-8", errors="replace")
        else:
            self.cfg_path.write_text(config)
        self.log_path = tmp / "supervisor.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
        full_env.update({"PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"})
        if carried:
            full_env["KILN_DEPLOY_CONFIG"] = base64.b64encode(self.cfg_path.read_bytes()).decode("ascii")
        full_env.update(env or {})
        self._log = open(self.log_path, "w")
        where = () if carried else ("--config", str(self.cfg_path))
        # Its parent-death signal is TERM: a supervisor killed outright would orphan its engine,
        # one that is terminated stops it. Not a session of its own: tests signal it by pid.
        self.proc = children.spawn([sys.executable, "-m", "supervisor", "run", *where, *args],
                                   death_signal=signal.SIGTERM, start_new_session=False,
                                   stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=REPO_ROOT)
        self.status_port = status_port or int(config.split("[status]")[1].split("port =")[1].split()[0])

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.status_port}{path}"

    def status(self) -> dict[str, Any] | None:
        code, body = http(self.url("/status"), timeout=2)
        return json.loads(body) if code == 200 else None

    def wait_state(self, *states: str, timeout: float = 30) -> dict[str, Any]:
        def hit() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"supervisor exited {self.proc.returncode} before {states}:\n{self.log()}")
            s = self.status()
            return s if s and s["state"] in states else None
        return wait_for(hit, timeout, f"state in {states}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = 15, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def __enter__(self) -> "Supervised":
        return self

    def __exit__(self, *exc: object) -> None:
        # A test that failed leaves the supervisor running: stop it and its engines (their own
        # sessions: stopping the supervisor alone could orphan them). No grace: it is a leftover.
        children.stop(self.proc, grace_s=0)
        if not self._log.closed:
            self._log.close()


# The selftest is on by default in a deploy config; the tiny random models most tests boot
# answer nothing right (their replies are loops), so tests that are about something else say so.
SELFTEST_OFF = "[selftest]\nenabled = false\n"


HEALTH = "[health]\nstall_s = 20\nstop_grace_s = 5\n"


def config(*, binary: str | Path, model: str | Path, port: int, status_port: int, state_dir: Path, rungs: str,
           snapshot: str | Path = "", extra: str = "", selftest: str = SELFTEST_OFF, health: str = HEALTH,
           api_key: str | None = None, ladder_options: str = "") -> str:
    """A deploy config on loopback for tests and benches. `selftest` is the [selftest] table ("" for
    the defaults; a [selftest] table in `extra` replaces it), `health` the [health] table, `api_key`
    server.api_key (None: the default, env:KILN_API_KEY), `ladder_options` lines of [ladder]."""
    snap = f'flag_snapshot = "{snapshot}"\n' if snapshot else 'flag_snapshot = "/nonexistent"\n'
    key = f'api_key = "{api_key}"\n' if api_key is not None else ""
    if "[selftest]" in extra:
        selftest = ""
    return f"""
engine = "llamacpp"
state_dir = "{state_dir}"
[model]
source = "{model}"
[server]
host = "127.0.0.1"
port = {port}
binary = "{binary}"
{key}{snap}
[ladder]
{ladder_options}{rungs}
{health}
{extra}
{selftest}
[status]
host = "127.0.0.1"
port = {status_port}
"""


def vllm_config(*, model_dir: str | Path, port: int, status_port: int, state_dir: Path, rungs: str,
                snapshot: str | Path = "", model_lines: str = "", ladder_options: str = "", extra: str = "") -> str:
    """A vLLM deploy config on loopback whose engine is the stand-in (fake_vllm.py; KILN_FAKE_SCENARIO
    picks what it does), the selftest off. `model_dir` holds config.json; `model_lines` more of [model],
    `ladder_options` lines of [ladder], `extra` more tables; `snapshot` the flag snapshot (none: unset)."""
    snap = f'flag_snapshot = "{snapshot}"\n' if snapshot else ""
    return f"""
engine = "vllm"
state_dir = "{state_dir}"
[model]
source = "{model_dir}"
entry = "config.json"
{model_lines}
[server]
host = "127.0.0.1"
port = {port}
binary = "{FAKE_VLLM}"
{snap}
[ladder]
{ladder_options}{rungs}
{extra}
{SELFTEST_OFF}
[status]
host = "127.0.0.1"
port = {status_port}
"""


def fleet_published(text: str) -> str:
    """A deploy config from `config()` as a publisher sends it to a fleet: without state_dir and
    [status], which each pod keeps from its own boot config (several pods on one host differ there;
    their engine ports differ through KILN_SERVER_PORT)."""
    import re

    return re.sub(r"^state_dir = .*\n", "", text, flags=re.MULTILINE).split("[status]")[0]

