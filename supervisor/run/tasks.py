"""Slow work beside the loop: each task runs in a daemon thread, is cancellable, and answers with
one event posted to the loop's inbox. A cancelled task's answer is dropped (its token is stale
by then anyway); a task that raises answers with what `on_error` makes of the exception, so a
bug in a task fails that step visibly instead of hanging the loop.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

log = logging.getLogger("kiln")


class Task:
    def __init__(self, token: int, name: str):
        self.token = token
        self.name = name
        self.cancelled = threading.Event()
        self.on_cancel: list[Callable[[], None]] = []   # e.g. abort the selftest's in-flight request
        self.thread: threading.Thread | None = None

    def cancel(self) -> None:
        self.cancelled.set()
        for fn in self.on_cancel:
            try:
                fn()
            except Exception:  # noqa: BLE001 - cancelling must not fail the loop
                log.exception("cancelling task %s", self.name)


class Tasks:
    def __init__(self, post: Callable[[Any], None]):
        self._post = post
        self._tasks: dict[int, Task] = {}
        self._lock = threading.Lock()

    def start(self, token: int, name: str, work: Callable[[Task], Any],
              on_error: Callable[[BaseException], Any]) -> Task:
        task = Task(token, name)

        def run() -> None:
            try:
                result = work(task)
            except Exception as e:  # noqa: BLE001 - reported as the task's answer
                log.exception("task %s failed", name)
                result = on_error(e)
            with self._lock:
                self._tasks.pop(token, None)
            if result is not None and not task.cancelled.is_set():
                self._post(result)

        task.thread = threading.Thread(target=run, name=f"kiln-{name}", daemon=True)
        with self._lock:
            self._tasks[token] = task
        task.thread.start()
        return task

    def cancel(self, token: int) -> None:
        with self._lock:
            task = self._tasks.get(token)
        if task is not None:
            task.cancel()

    def cancel_all(self, join_s: float = 5.0) -> None:
        with self._lock:
            tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            if t.thread is not None:
                t.thread.join(join_s)
