"""`python -m supervisor.model.fetch`: one fetch attempt, run by the supervisor (parent.py) in a child
process; events are JSON lines on stdout (child.py lists them)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from ... import hubclient
from .child import EXIT_ERROR, Child


def emitter(stream: Any) -> Callable[..., None]:
    lock = threading.Lock()

    def emit(event: str, **kv: Any) -> None:
        with lock:
            stream.write(json.dumps({"event": event, **kv}) + "\n")
            stream.flush()
    return emit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m supervisor.model.fetch", description="fetch one model into the cache "
                                 "(the supervisor runs this; events are JSON lines on stdout)")
    ap.add_argument("--repo", required=True)
    ap.add_argument("--revision", default="main")
    ap.add_argument("--cache", required=True)
    ap.add_argument("--entry", required=True)
    ap.add_argument("--allow", action="append", default=[])
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--segment-mib", type=int, default=0)
    ap.add_argument("--take-over", action="store_true", help="another worker's download stalled: write beside "
                    "it without waiting for its per-file locks")
    a = ap.parse_args(argv)
    emit = emitter(sys.stdout)
    try:
        return Child(a.repo, a.revision, Path(a.cache), a.allow, a.entry, hubclient.token(), emit,
                     connections=a.connections, segment_mib=a.segment_mib, take_over=a.take_over).run()
    except Exception as e:  # noqa: BLE001 - the parent needs one line, not a traceback
        emit("error", kind="other", message=hubclient.describe(e))
        return EXIT_ERROR


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # Worker threads may sit in a blocking read; nothing they hold needs flushing (every write is a
    # pwrite, every journal line one O_APPEND write), so leave without waiting for them.
    os._exit(code)
