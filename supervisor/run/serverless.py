"""What the lifecycle loop does for a Serverless worker, given what it needs and never the loop.

    boot        show()     who it is, where its own state and the shared state are (/status, log),
                           and a warning when there is no volume to share
    PREFLIGHT   tidy()     once: this worker's directory marked as Kiln's and kept alive by a
                           heartbeat; a dead worker's JIT cache of this image and GPU kind taken
                           over (before the engine starts); dead workers' directories pruned in
                           the background, bounded (serverless/workdirs.py)
                recall()   a fresh failure two other workers recorded for this image, config and GPU
                           kind: the loop answers Prepare with it, so nothing is fetched or loaded;
                           witnesses older than the endpoint's clear mark are ignored and deleted
    SERVING     served()   this image, config and GPU kind served (the selftest passed): the key's
                           witnesses so far were their hosts', so they are deleted and the time
                           marked (in the background: /ready does not wait on the volume)
    FAILED      failed()   one log line with the class and the masked cause, then this worker's
                           witness on the volume when another worker would meet it again (never
                           after it served)

The release itself (exit after `[serverless] exit_grace_s`) is the machine's deadline
(lifecycle/machine.py); the health path's 503 comes from the state (runpod_env.health_code).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable, Mapping

from ..config import DeployConfig, ServerlessSpec
from ..failure import Failure
from ..host.hardware import Hardware
from ..ladder.memory import image_identity
from .record import Record
from ..redact import Secrets
from .runtime import Runtime
from ..serverless import failures, workdirs
from ..runpod_env import release_line, worker_id

log = logging.getLogger("kiln")


class ServerlessWorker:
    def __init__(self, spec: ServerlessSpec, *, shared: Path, own: Path, status_port: int, env: Mapping[str, str],
                 rec: Record, secrets: Secrets, warn: Callable[[str], None],
                 hardware: Callable[[], Hardware | None]):
        self.spec, self.shared, self.own, self.status_port = spec, shared, own, status_port
        self.id = worker_id(env)
        self.rec, self.secrets, self.warn, self.hardware = rec, secrets, warn, hardware
        self.recalled = False                   # this boot failed from other workers' records
        self.tidied = False                     # tidy() ran: the mark, the heartbeat, the prune
        self.stop = threading.Event()
        self.cleared_at, problem = failures.cleared_at(env)
        if problem:
            warn(problem)

    @classmethod
    def of(cls, cfg: DeployConfig, rt: Runtime) -> "ServerlessWorker":
        """The worker a Serverless boot of `cfg` is: its own state under rt.state_dir, the shared at state_dir."""
        return cls(cfg.serverless, shared=Path(cfg.state_dir), own=rt.state_dir, status_port=cfg.status.port,
                   env=rt.env, rec=rt.rec, secrets=rt.secrets, warn=rt.warn, hardware=lambda: rt.hw)

    def show(self) -> None:
        on_volume = Path(self.spec.volume) in self.shared.parents
        self.rec.update(serverless={"worker": self.id, "health_path": self.spec.health_path,
                                    "shared": str(self.shared), "own": str(self.own), "volume": self.spec.volume,
                                    "on_volume": on_volume})
        log.info("serverless worker %s: health %s on port %d, state %s (shared: %s)", self.id,
                 self.spec.health_path, self.status_port, self.own, self.shared)
        if not on_volume:
            self.warn(f"no network volume at {self.spec.volume}: this worker keeps the model in {self.shared}, "
                      "and every worker downloads it again (attach a network volume to the endpoint)")

    def key(self, cfg: DeployConfig) -> tuple[str, dict[str, object]]:
        hw = self.hardware()
        gpus = sorted(g.name for g in hw.gpus) if hw is not None else []
        about: dict[str, object] = {"image": image_identity(), "config": failures.config_identity(cfg),
                                    "config_hash": cfg.hash, "gpus": gpus}
        return failures.failure_key(str(about["image"]), str(about["config"]), gpus), about

    def tidy(self) -> None:
        """Once, at the first PREFLIGHT (the GPUs are known): mark this worker's directory, start its
        heartbeat, take over a dead worker's JIT cache, and prune dead directories in the background."""
        if self.tidied:
            return
        self.tidied = True
        hw = self.hardware()
        gpus, image = sorted(g.name for g in hw.gpus) if hw is not None else [], image_identity()
        try:
            workdirs.mark(self.own, worker=self.id, image=image, gpus=gpus, now=time.time())
            now = workdirs.beat(self.own)
        except OSError as e:
            self.warn(f"this worker's directory {self.own} could not be marked ({e.strerror or e}): no other "
                      "worker will ever prune it, and this one prunes nothing")
            return
        threading.Thread(target=self._heartbeat, name="kiln-heartbeat", daemon=True).start()
        workers = self.own.parent
        found = workdirs.dead(workers, self.own, now=now)
        done = workdirs.Pruned()
        done.adopted = workdirs.adopt_jit_cache(found, self.own, image=image, gpus=gpus, refused=done.refused)
        for why in done.refused:
            log.warning("%s; it is left where it is", why)
        if done.adopted:
            log.info("took over the driver JIT cache of worker %s (gone; same image and GPUs)", done.adopted)
        if not found:
            self.rec.merge("serverless", pruned=done.to_dict())
            return
        threading.Thread(target=self._prune, args=(workers, found, done), name="kiln-prune", daemon=True).start()

    def _heartbeat(self) -> None:
        while not self.stop.wait(workdirs.HEARTBEAT_S):
            try:
                workdirs.beat(self.own)
            except OSError:
                continue                        # the next beat tries again; dead only after DEAD_AFTER_S

    def _prune(self, workers: Path, found: list[Path], done: workdirs.Pruned) -> None:
        try:
            workdirs.prune(workers, self.own, found, pruner=self.id, pruned=done)
        except Exception as e:                  # housekeeping: never the worker's end
            done.errors.append(f"{type(e).__name__}: {e}")
        self.rec.merge("serverless", pruned=done.to_dict())
        log.info("pruned %d dead worker director%s (%d MiB) of %d found%s", len(done.removed),
                 "y" if len(done.removed) == 1 else "ies", done.bytes >> 20, len(found),
                 f"; could not delete: {'; '.join(done.errors[:3])}" if done.errors else "")

    def recall(self, cfg: DeployConfig) -> Failure | None:
        """A deterministic failure another worker recorded for this image, config and GPU kind, still fresh."""
        self.tidy()
        key, _ = self.key(cfg)
        shared = Path(cfg.state_dir)
        if self.cleared_at is not None:
            gone = failures.forget(shared, self.cleared_at)       # what it cannot delete it leaves: recall ignores it
            if gone:
                log.info("deleted %d failure record(s) written before the endpoint's %s", gone, failures.CLEARED_ENV)
        self.rec.merge("serverless", failure_key=key)
        rec = failures.recall(shared, key, ttl_s=self.spec.failure_ttl_s, now=time.time(), cleared_at=self.cleared_at)
        if rec is None:
            return None
        self.recalled = True
        return failures.as_failure(rec, ttl_s=self.spec.failure_ttl_s, now=time.time())

    def served(self, cfg: DeployConfig) -> None:
        """SERVING: clear the witnesses of this image, config and GPU kind written so far (a worker
        that served proves they were their hosts'), on a thread of its own."""
        key, _ = self.key(cfg)
        now = time.time()

        def clear() -> None:
            try:
                gone = failures.served(Path(cfg.state_dir), key, worker=self.id, now=now)
            except OSError as e:
                self.warn(f"the failure records of this image and config could not be cleared on the volume "
                          f"({e.strerror or e}): failures before this serve may still block the next workers")
                return
            self.rec.merge("serverless", witnesses_cleared=gone)
            if gone:
                log.info("this worker served: deleted %d failure witness(es) of this image, config and GPU kind "
                         "written before it (their hosts', not the config's)", gone)
        threading.Thread(target=clear, name="kiln-served", daemon=True).start()

    def failed(self, why: str, failure: Failure | None, cfg: DeployConfig, *, served: bool = False) -> None:
        """FAILED: say why once (`why` is masked already), and record the failure for the next workers
        when another would meet it again (`served`: this worker served before, so it would not). The
        machine releases the worker after the grace."""
        why = " ".join(why.split())
        log.error("%s", release_line(why, self.spec.health_path, self.status_port, self.spec.exit_grace_s))
        self.rec.merge("serverless", worker=self.id, exit_in_s=self.spec.exit_grace_s, cause=why)
        if self.recalled or not failures.recordable(failure, served=served):
            return
        assert failure is not None
        key, about = self.key(cfg)
        try:
            path = failures.record(Path(cfg.state_dir), key, failure, reason=self.secrets.redact(failure.reason),
                                   worker=self.id, now=time.time(), about=about)
        except OSError as e:
            self.warn(f"the failure could not be recorded on the volume ({e.strerror or e}): the next worker "
                      "will try again")
            return
        log.info("failure recorded at %s: once %d different workers have failed this way, workers of this image "
                 "and config on these GPUs fail at once for %g s ([serverless] failure_ttl_s; `python build.py "
                 "endpoint failures --target T` shows and clears)", path, failures.WITNESSES, self.spec.failure_ttl_s)
