"""Shared by the benches: where the engine is, ports, condition waits, and the P-line format.

Every bench prints its ratio against a baseline measured in the same run, and ends with
its `P<n> name=<value>` line. Benches are measurements, not tests: they never assert timings.
Engines and supervisors a bench starts go through kiln_dev.children (spawn/stop), and every
bench's main calls stop_on_term(): a bench stopped by `timeout` leaves nothing running.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kiln_dev import Unavailable  # noqa: E402 - needs the repo on sys.path
from kiln_dev.children import spawn, stop, stop_on_term  # noqa: E402,F401 - for the benches
from kiln_dev.supervised import free_port  # noqa: E402,F401 - for the benches


# The interpreter the supervisor runs under: the image's lean venv is what a pod has; on a machine
# whose python3 carries a large site-packages (a GPU box with PyTorch), point this at a lean venv.
SUPERVISOR_PYTHON = os.environ.get("KILN_BENCH_PYTHON", sys.executable)


def llama_prefix() -> Path:
    from kiln_dev.engine import require_prefix

    try:
        return require_prefix()
    except Unavailable as e:
        sys.exit(str(e))


def status_code(url: str, timeout: float = 1.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def wait_until(cond: Callable[[], bool], timeout: float, interval: float = 0.005) -> float:
    """Monotonic time at which cond() first held; raises on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(interval)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def env_without_kiln() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def deploy_toml(*, model: Path, binary: Path, port: int, status_port: int, state_dir: Path, rungs: str,
                api_key: str = "none", snapshot: Path | None = None, extra: str = "") -> str:
    """A deploy config for a bench run: the tests' builder, with no remembered rung, no key unless
    asked, and the engine's own flag snapshot; selftest off unless `extra` has a [selftest] table
    (benches measure the boot, not the model's answers) and no [health] table unless `extra` has one."""
    from kiln_dev.supervised import config

    return config(binary=binary, model=model, port=port, status_port=status_port, state_dir=state_dir,
                  rungs=rungs, snapshot=snapshot or binary.parent.parent / "share/kiln/llama-server.help.txt",
                  extra=extra, health="", api_key=api_key, ladder_options="remember = false\n")


def rung_toml(name: str, args: list[str], placement: str = "cpu", env: dict[str, str] | None = None) -> str:
    import json

    out = f'[[ladder.rungs]]\nname = "{name}"\nplacement = "{placement}"\nargs = {json.dumps(args)}\n'
    if env:
        out += "[ladder.rungs.env]\n" + "".join(f'{k} = "{v}"\n' for k, v in env.items())
    return out


def add_device_root(ap) -> None:  # type: ignore[no-untyped-def]
    """--root: where the device scripts keep what lasts between calls (scripts/device/common.sh
    exports it as KILN_DEVICE_ROOT); required when the environment does not say."""
    env = os.environ.get("KILN_DEVICE_ROOT")
    ap.add_argument("--root", type=Path, default=Path(env) if env else None, required=env is None,
                    help="the device run's state directory (default: $KILN_DEVICE_ROOT)")
