"""The supervisor's log on stderr, and the engine's output in it. Its own module, importing only
logging: PID 1 sets it up before it reads the config, and a config that fails to load is said
without the loop ever being imported."""

from __future__ import annotations

import logging
import sys

ENGINE_LOG = logging.getLogger("kiln.engine")


def engine_lines(lines: list[str]) -> None:
    """The engine's output on stderr, one record per read: a record per line cost ~10 us, at a GPU's
    request rate (~10 lines a request) the supervisor's largest CPU cost while serving (P2b)."""
    ENGINE_LOG.info("%s", "\n".join(lines))


class LineFormatter(logging.Formatter):
    """The log's prefix on every line of an engine record: a log reader sees one line per engine line,
    as when each was its own record, with the time of the read that brought it."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        msg = record.message
        if record.name != ENGINE_LOG.name or "\n" not in msg:
            return super().formatMessage(record)
        record.message = ""
        prefix = super().formatMessage(record)     # the time, name and level (the format ends with the message): once per read
        record.message = msg
        return "\n".join(prefix + part for part in msg.split("\n"))


def setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger("kiln")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False
