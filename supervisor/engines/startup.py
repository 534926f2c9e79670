"""The [startup] levers in force, as engine flags: each one the config sets (supervisor/levers.py says
which flag and values), or fast_start's preset, unless the rung or extra_args give the flag themselves;
and the lint of a lever against the engine build's own flag snapshot."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterable

from ..levers import LEVERS, Lever

if TYPE_CHECKING:
    from ..config import DeployConfig
    from .flags import FlagSnapshot


_O_LEVEL = re.compile(r"-O\d?")


# [server] fast_start = true (issue 27, vLLM only) is a preset of [startup] levers, not a second path
# to the argv: a field [startup] sets itself wins over it, so the two can never put one flag twice.
#   safetensors_load_strategy prefetch  the checkpoint read into the page cache before the workers load
#                                       it ("useful on network or high-latency storage": the pod's volume)
# Not -O1 (in it until 2026-12-02): on the H200 it captured only piecewise CUDA graphs and the
# selftest decoded 107 tok/s against the default -O2's 503 (SmolLM2-135M, vLLM 0.26.0; docs/benchmarks.md).
FAST_START = {"safetensors_load_strategy": "prefetch"}


def _set(cfg: "DeployConfig", engine: str) -> list[tuple[str, Lever, Any]]:
    """(where, lever, value) for each lever in force: [startup]'s own, then fast_start's preset."""
    out = []
    for name, lever in LEVERS.items():
        value = getattr(cfg.startup, name)
        where = f"startup.{name}"
        if value is None and cfg.server.fast_start and name in FAST_START:
            value, where = FAST_START[name], "server.fast_start"
        if lever.engine == engine and value is not None:
            out.append((where, lever, value))
    return out


def _given(lever: Lever, user_flags: Iterable[str]) -> bool:
    """The rung or extra_args sets this flag itself, in any spelling (a dotted -cc.mode too)."""
    for f in user_flags:
        base = f.split("=", 1)[0]
        if base.startswith("--"):
            base = base.split(".", 1)[0]
        elif base.startswith("-cc."):
            base = "-cc"
        if base in (lever.flag, *lever.aliases) or (lever.flag == "--optimization-level" and _O_LEVEL.fullmatch(base)):
            return True
    return False


def args(cfg: "DeployConfig", engine: str, user_flags: Iterable[str]) -> list[str]:
    """The flags [startup] adds to this engine's argv: each lever set, unless the rung sets its flag."""
    user = list(user_flags)
    out: list[str] = []
    for _, lever, value in _set(cfg, engine):
        if not _given(lever, user):
            out += [lever.flag, str(value)]
    return out


def lint(cfg: "DeployConfig", engine: str, snapshot: "FlagSnapshot | None") -> list[tuple[str, str]]:
    """(where, message) for each lever whose flag this engine build does not have."""
    if snapshot is None:
        return []
    out = []
    for name, lever, value in _set(cfg, engine):
        flag = snapshot.get(lever.flag)
        fix = "set fast_start = false" if name == "server.fast_start" else "remove the lever"
        if flag is None:
            out.append((name, f"this {engine} build has no {lever.flag} (flag snapshot "
                        f"{snapshot.source}): {fix}, or use an image whose engine has it"))
        elif flag.choices and str(value) not in flag.choices:
            out.append((name, f"{value!r} is not one of this {engine} build's {lever.flag} values: "
                        f"{', '.join(c for c in flag.choices if c != 'None')} (flag snapshot {snapshot.source})"))
    return out
