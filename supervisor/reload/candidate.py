"""A published config the watcher found, and whether it may replace the running one.

Everything here is read-only and fast: the lifecycle loop validates a candidate while the server
keeps serving, and an invalid change is rejected with the server untouched (same PID). What is
checked, all of it collected before answering (llama-swap keeps the old config only when the new
one fails to *parse*; Kiln refuses everything it can know before stopping anything):

    size (<= MAX_BYTES), UTF-8, no NUL byte
    TOML and the deploy-config schema (unknown keys, wrong types, ranges, shell syntax in values,
        path-traversing names), with the same environment overrides as the boot config
    what the supervisor reads only at boot (config.BOOT_ONLY: [watch], state_dir, [status], [runpod],
        server.tcp_port) left as it is -- a change is rejected by name --, then the cross-table checks
        (ports) on the config as it will run
    the engine is in this image (its module and its binary)
    every rung linted against the engine's flag snapshot (removed and unknown flags)
    the [hardware] expectations against this host
    a local model file exists; a key file exists
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..engines import registry as engines
from ..host import hardware
from ..config import BOM, DeployConfig, cross_problems, parse_config
from ..errors import ConfigError, FetchError
from .boot_only import boot_only_changes, keep_boot_only

MAX_BYTES = 256 * 1024


@dataclass(frozen=True)
class Candidate:
    """What a watcher reports: the bytes it found and where. `error` when it could not take them."""
    source: str                   # "hub" or "local"
    origin: str                   # "hf://owner/name@branch:path" or the local file's path
    data: bytes = b""
    revision: str | None = None   # the Hub commit the file was read at
    detected_at: float = 0.0      # time.time() when the watcher saw the change
    error: str | None = None

    @property
    def content_sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def seen_key(self) -> str:
        """What the watcher compares to know it has reported this one already."""
        return self.revision or self.content_sha256

    def describe(self) -> str:
        return f"{self.origin}" + (f" @ {self.revision[:12]}" if self.revision else "")


@dataclass
class CandidateCheck:
    cfg: DeployConfig | None
    problems: list[str] = field(default_factory=list)
    text: str | None = None

    @property
    def ok(self) -> bool:
        return self.cfg is not None and not self.problems


def decode(data: bytes) -> tuple[str | None, list[str]]:
    """The text of a published file, or why it cannot be one."""
    if len(data) > MAX_BYTES:
        return None, [f"(file): is {len(data)} bytes; a deploy config is at most {MAX_BYTES} bytes"]
    nul = data.find(b"\x00")
    if nul >= 0:
        return None, [f"(file): contains a NUL byte at offset {nul}"]
    try:
        return data.decode("utf-8").removeprefix(BOM), []
    except UnicodeDecodeError as e:
        return None, [f"(file): is not UTF-8 (byte {e.start}: {data[e.start:e.start + 1]!r})"]


def validate(c: Candidate, *, running: DeployConfig, env: Mapping[str, str], hw: hardware.Hardware | None,
             engine_get: Callable[[str], Any] = engines.get,
             binary_present: Callable[[str], bool] = engines.binary_present) -> CandidateCheck:
    if c.error:
        return CandidateCheck(None, [c.error])
    text, problems = decode(c.data)
    if text is None:
        return CandidateCheck(None, problems)
    # Boot-only: the supervisor keeps its own; a published config may repeat them, not change them.
    # Named first, and even when the rest does not validate ([runpod] api_url to anywhere but RunPod).
    try:
        problems += boot_only_changes(tomllib.loads(text), running, env)
    except tomllib.TOMLDecodeError:
        pass                            # parse_config says where
    try:
        cfg = parse_config(text, source=c.describe(), env=env)
    except ConfigError as e:
        return CandidateCheck(None, problems + [str(p) for p in e.problems], text)
    cfg = keep_boot_only(cfg, running)
    # The cross-table checks again, on the config as it will run: a published config that moves
    # server.port onto the running status port passed them against the default [status].
    problems += [str(x) for x in cross_problems(cfg)]

    engine = None
    try:
        engine = engine_get(cfg.engine)
    except KeyError as e:
        problems.append(f"engine: {e.args[0]}")
    if not binary_present(cfg.server.binary):
        problems.append(engines.missing_binary_message(cfg.server.binary, cfg.engine))
    if engine is not None:
        snap_path = Path(cfg.server.flag_snapshot)
        snapshot = engine.load_snapshot(snap_path) if snap_path.is_file() else None
        gpus = len(hw.gpus) if hw else None
        for i, rung in enumerate(cfg.ladder.rungs):
            problems += [str(x) for x in engine.lint_rung(cfg, i, rung, snapshot,
                                                          gpu_count=cfg.hardware.gpu_count or gpus)]
    if hw is not None:
        problems += [f"hardware: {m}" for m in hardware.check(cfg.hardware, hw)]
    if not cfg.model.hf_repo:
        from ..model.resolve import resolve_local

        try:
            resolve_local(cfg)
        except FetchError as e:
            problems.append(f"model: {e}")
    kind, _, ref = cfg.server.api_key.partition(":")
    if kind == "file" and not os.path.isfile(ref):
        problems.append(f"server.api_key: the key file {ref} does not exist")
    return CandidateCheck(cfg, problems, text)

