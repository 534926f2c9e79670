"""The prompt cache across the loop's engine stops and starts (supervisor/promptcache/ holds the how):
saved before a planned stop of an engine that served (a reload, a rollback, TERM: never a stall's stop,
whose engine is hung, nor a crash, whose engine is gone), restored into a new engine before /ready turns
200. Restoring costs little (0.07 s for 7,295 tokens, 168 MB, on this project's CPU machine; a GPU pod's
network volume reads faster than a cold prefill computes) and its point is the first request after the
restart, so /ready waits for it, bounded by [cache] restore_s. /status `prompt_cache` and /metrics say
what was saved, restored and skipped, with why."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from ..config import DeployConfig
from ..promptcache.key import cache_key
from ..promptcache.slots import SlotAPI
from ..promptcache.store import Store
from .runtime import Runtime

log = logging.getLogger("kiln")


class PromptCache:
    def __init__(self, rt: Runtime):
        self.rt = rt
        self.totals = {"saved_slots": 0, "restored_slots": 0, "skipped": 0, "saved_bytes": 0, "restored_bytes": 0}
        self.last: dict[str, Any] = {}

    def _applies(self, cfg: DeployConfig) -> bool:
        return cfg.engine == "llamacpp" and cfg.cache.keep

    def _store(self, cfg: DeployConfig) -> Store:
        tag = self.rt.env.get("RUNPOD_POD_ID") or os.uname().nodename
        return Store(self.rt.prompt_cache_dir, tag=tag, max_bytes=cfg.cache.max_bytes,
                     max_entries=cfg.cache.max_entries, min_tokens=cfg.cache.min_tokens)

    def _api(self, cfg: DeployConfig, timeout_s: float) -> SlotAPI:
        host, port = cfg.engine_address
        return SlotAPI("127.0.0.1" if host in ("0.0.0.0", "::", "") else host, port, self.rt.api_key,
                       timeout_s=max(1.0, timeout_s))

    def _key(self, argv: tuple[str, ...], model: Path | None, env: dict[str, str]) -> str | None:
        if model is None or not argv:
            return None
        try:
            return cache_key(argv, Path(model), env)
        except OSError as e:
            log.warning("prompt cache: cannot key this engine (%s): nothing saved or restored", e.strerror or e)
            return None

    def before_stop(self, eng: Any, *, planned: bool) -> None:
        """An engine the loop is about to stop (run/loop.py _Engine): saved when it served and the stop is
        planned (never a stall's: the engine is hung)."""
        if eng.served and planned and eng.proc.poll() is None:
            self.save(*self._of(eng))

    def before_ready(self, eng: Any) -> None:
        """An engine about to be SERVING for the first time: what the last stop saved, restored."""
        if eng is not None and not eng.served:
            self.restore(*self._of(eng))
            eng.served = True

    def _of(self, eng: Any) -> tuple[DeployConfig, tuple[str, ...], Path | None, dict[str, str]]:
        rung = eng.live.cfg.ladder.rungs[eng.index]
        return eng.live.cfg, tuple(eng.proc.argv), eng.live.model_path, {**self.rt.env, **rung.env}

    def save(self, cfg: DeployConfig, argv: tuple[str, ...], model: Path | None, env: dict[str, str]) -> None:
        if not self._applies(cfg) or cfg.cache.save_s <= 0:
            return
        key = self._key(argv, model, env)
        if key is None:
            return
        report = self._store(cfg).save(self._api(cfg, cfg.cache.save_s), key, time.monotonic() + cfg.cache.save_s)
        self._record(report, key)

    def restore(self, cfg: DeployConfig, argv: tuple[str, ...], model: Path | None, env: dict[str, str]) -> None:
        if not self._applies(cfg) or cfg.cache.restore_s <= 0:
            return
        key = self._key(argv, model, env)
        store = self._store(cfg)
        if key is None or not store.entries():
            return
        self.rt.rec.phase("prompt_cache")    # a boot-timeline phase only when something was saved to read
        report = store.restore(self._api(cfg, cfg.cache.restore_s), key,
                              time.monotonic() + cfg.cache.restore_s)
        self._record(report, key)

    def _record(self, report: Any, key: str) -> None:
        done = report.to_dict()
        self.last[report.action] = {**done, "key": key}
        prefix = "saved" if report.action == "saved" else "restored"
        self.totals[f"{prefix}_slots"] += report.slots
        self.totals[f"{prefix}_bytes"] += report.bytes
        self.totals["skipped"] += len(report.skipped)
        if report.slots or report.skipped:
            log.info("prompt cache: %s %d slot(s), %d tokens, %.1f MB in %.2f s%s", report.action, report.slots,
                     report.tokens, report.bytes / 1e6, report.seconds,
                     f"; {len(report.skipped)} skipped ({report.skipped[0]['why']})" if report.skipped else "")
        self.rt.rec.update(prompt_cache={"dir": str(self.rt.prompt_cache_dir), **self.totals, **self.last})
