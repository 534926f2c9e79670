"""The model file for a config, as the loop's Fetch effect: local at once, or fetched from the Hub
in a task beside the loop (supervisor/model/fetch/), answering with one ModelReady event.

Given what it needs (the tasks, the environment, the token, the secrets, where to post and where to
record), never the loop. What a fetched or local model is (source, revision, commit, path) is shown
and kept in `records` by its path (/status's `model` section once it serves); `show(key, record)`
hears each progress step, for /status while the fetch runs.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from ..config import DeployConfig
from ..errors import Cancelled, FetchError
from ..failure import Failure, FailureClass
from ..lifecycle.events import ModelReady
from .tasks import Task, Tasks
from ..redact import Secrets

log = logging.getLogger("kiln")
PROGRESS_LOG_S = 10.0      # a progress line in the log at most this often (every step goes to /status)


def fetch_model(token: int, cfg: DeployConfig, *, candidate: bool, tasks: Tasks, env: Mapping[str, str],
                hub_token: str | None, secrets: Secrets, post: Callable[[Any], None],
                show: Callable[[str, dict[str, Any]], None], warn: Callable[[str], None],
                records: dict[str, dict[str, Any]]) -> None:
    """The model of `cfg`; `candidate`: a published config's, fetched beside the serving engine
    (its /status section is `model_candidate` until it serves). Each model's record is shown and kept
    in `records` by its path: /status `model` shows it once that model serves."""
    from ..model import resolve

    def on_record(key: str, path: Path, record: dict[str, Any]) -> None:
        records[str(path)] = record
        show(key, record)

    key = "model_candidate" if candidate else "model"
    if not cfg.model.source:          # the router: its replicas serve the model
        post(ModelReady(token, path=None))
        return

    def load_error(e: BaseException) -> Failure:
        return Failure(FailureClass.LOAD_ERROR, secrets.redact(str(e)))

    try:
        local = resolve.resolve(cfg)
    except FetchError as e:
        post(ModelReady(token, failure=load_error(e)))
        return
    if local is not None:
        on_record(key, local, {"source": cfg.model.source, "path": str(local)})
        post(ModelReady(token, path=local))
        return
    from ..model.fetch import parent

    logged = [0.0]

    def progress(ev: dict[str, Any]) -> None:
        show(key, {"source": cfg.model.source, "fetch": ev})
        if ev.get("event") not in ("progress", "waiting") or time.monotonic() - logged[0] >= PROGRESS_LOG_S:
            logged[0] = time.monotonic()
            log.info("model fetch: %s", " ".join(f"{k}={v}" for k, v in ev.items()))

    def work(task: Task) -> ModelReady | None:
        try:
            res = parent.fetch(cfg, env, token=hub_token, should_stop=task.cancelled.is_set,
                               sleep=task.cancelled.wait, report=progress, secrets=list(secrets))
        except Cancelled:
            return None
        except FetchError as e:
            return ModelReady(token, failure=load_error(e))
        on_record(key, res.path, {"source": cfg.model.source, "revision": cfg.model.revision, **res.to_dict()})
        if res.from_cache:
            warn(f"model: {res.note}")
        else:
            log.info("model: %s at commit %s -> %s", cfg.model.source, (res.commit or "?")[:12], res.path)
        return ModelReady(token, path=res.path)

    tasks.start(token, "fetch", work, on_error=lambda e: ModelReady(token, failure=load_error(e)))
