"""Where the ladder walk starts: the rung that won last time on this kind of machine.

The winning rung is remembered in the volume (<state_dir>/ladder-memory.json), keyed by what makes
it the right answer — GPU model x count, driver, image and config — so the next boot on the same
kind of machine starts there instead of re-learning the OOMs. `ladder.start` in the config wins
over the memory; `ladder.remember = false` turns it off. A memory that cannot be written (a full
disk) is a warning on /status (process/statefile.py): the next boot walks from the first rung.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

from ..config import DeployConfig
from ..host.hardware import Hardware
from ..process.statefile import Writes, write_atomic

BUILD_INFO = Path("/opt/kiln/build-info.json")


def image_identity(path: Path = BUILD_INFO) -> str:
    """What image this is: the build info baked at build time (labels, versions), hashed."""
    try:
        with path.open("rb") as f:
            return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return "dev"


def memory_key(cfg: DeployConfig, hw: Hardware, image: str) -> str:
    parts = {"gpus": sorted(g.name for g in hw.gpus), "count": len(hw.gpus), "driver": hw.driver,
             "image": image, "config": cfg.hash}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class LadderMemory:
    """key -> winning rung name, in one small JSON file written atomically. Every published config
    is a new key, so only the KEEP most recently won entries stay (it grew one entry per config)."""

    KEEP = 32

    def __init__(self, path: Path, keep: int = KEEP, writes: Writes | None = None):
        self.path = path
        self.keep = keep
        self.writes = writes or Writes()

    def _load(self) -> dict[str, dict[str, object]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}  # a missing or damaged memory only costs a full walk

    def recall(self, key: str) -> str | None:
        entry = self._load().get(key)
        rung = entry.get("rung") if isinstance(entry, dict) else None
        return rung if isinstance(rung, str) else None

    def recall_env(self, key: str, allowed: dict[str, set[str]]) -> dict[str, str]:
        """The environment the winner was relaunched with (a vLLM fork that met CUDA: spawn), each
        variable and value only where `allowed` (the engine's RELAUNCH_ENV) names it: the file is on
        a volume, and an environment read from it must not be a way to inject one."""
        entry = self._load().get(key)
        env = entry.get("env") if isinstance(entry, dict) else None
        if not isinstance(env, dict):
            return {}
        return {k: v for k, v in env.items() if isinstance(v, str) and v in allowed.get(k, ())}

    def remember(self, key: str, rung: str, env: dict[str, str] | None = None) -> None:
        data = self._load()
        data.pop(key, None)
        data[key] = {"rung": rung, "at": time.time(), **({"env": dict(env)} if env else {})}
        if len(data) > self.keep:                 # the newest win (by its time; this one last on a tie)
            order = sorted(data, key=lambda k: (k == key, self._at(data[k])))
            data = {k: data[k] for k in order[-self.keep:]}
        body = json.dumps(data, indent=2, sort_keys=True).encode("utf-8")
        self.writes.attempt(f"the ladder memory ({self.path})", "the next boot on this machine walks the ladder "
                            "from its first rung", lambda: write_atomic(self.path, body))

    @staticmethod
    def _at(entry: object) -> float:
        at = entry.get("at") if isinstance(entry, dict) else None
        ok = isinstance(at, (int, float)) and not isinstance(at, bool) and math.isfinite(at)
        return float(at) if ok else 0.0


def start_index(cfg: DeployConfig, remembered: str | None) -> tuple[int, str]:
    """Where the walk begins, and why."""
    names = [r.name for r in cfg.ladder.rungs]
    if cfg.ladder.start:
        return names.index(cfg.ladder.start), f"ladder.start = {cfg.ladder.start}"
    if cfg.ladder.remember and remembered in names:
        return names.index(remembered), f"remembered winner on this hardware: {remembered}"
    return 0, "first rung"
