"""Shared by the benches: where the engine is, ports, condition waits, and the P-line format.

Every bench prints its ratio against a baseline measured in the same run, and ends with
its `P<n> name=<value>` line. Benches are measurements, not tests: they never assert timings.
"""

from __future__ import annotations

import os
import socket
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


def llama_prefix() -> Path:
    from tests.support.engine import cpu_prefix

    prefix = cpu_prefix()
    if prefix is None:
        sys.exit("no llama-server: run `python build.py compile --target cpu-llamacpp` first (cached)")
    return prefix


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
