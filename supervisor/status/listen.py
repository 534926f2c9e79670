"""Listening sockets in PID 1: a bind that fails says who holds the port and which setting moves
it, and accept errors back off instead of spinning or ending the thread.

Both the status endpoint and the TCP relay listen inside the supervisor. An accept() that fails
with EMFILE (no descriptor left) fails again at once, because the connection stays queued in
the backlog: a loop that retries at once spins a core, and one that gives up leaves a port that
is open and never answers (issue 18 saw the second: the relay's thread ended, silently).
"""

from __future__ import annotations

import errno
import logging
import socket
import time

import psutil

from ..errors import KilnError

__all__ = ["AcceptErrors", "CannotListen", "PortBusy", "bind_error", "check_free", "holder"]

STATUS_PORT_FIX = "set KILN_STATUS_PORT or [status] port to a free port"
_FIRST_WAIT_S = 0.05  # the first retry after a failed accept; doubles per failure in a burst
_MAX_WAIT_S = 1.0  # a freed descriptor is noticed within this long


class CannotListen(KilnError):
    """A port could not be bound; the message names it, why, and the setting that moves it."""

    def __init__(self, message: str, port: int):
        super().__init__(message)
        self.port = port


class PortBusy(CannotListen):
    """Another process already listens on the port; `holder` names it when psutil can tell."""

    def __init__(self, message: str, port: int, holder: str | None):
        super().__init__(message, port)
        self.holder = holder


def holder(port: int) -> str | None:
    """"pid N (name)" of a process listening on TCP `port`, or None when that cannot be told.

    Only the name, never the command line: another process's argv can hold its secrets.
    """
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            try:
                name = psutil.Process(c.pid).name()
            except psutil.Error:
                return f"pid {c.pid}"
            return f"pid {c.pid} ({name})"
    return None


def bind_error(e: OSError, what: str, host: str, port: int, fix: str) -> CannotListen:
    """The one-line error for a failed bind of `what` (a config field, e.g. "status.port")."""
    if e.errno == errno.EADDRINUSE:
        who = holder(port)
        by = f" by {who}" if who else ""
        return PortBusy(f"{what} {port} is already in use{by}: stop what holds it, or {fix}", port, who)
    return CannotListen(f"{what} {port} on {host} cannot be bound ({e.strerror or e}): {fix}", port)


def check_free(what: str, host: str, port: int, fix: str) -> None:
    """Raise bind_error now when (host, port) cannot be bound: a busy port is reported before anything
    starts, not after an engine was launched. (Bound and closed at once; the real bind comes later.)"""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as the server binds: TIME_WAIT is no conflict
        try:
            s.bind((host, port))
        except OSError as e:
            raise bind_error(e, what, host, port, fix) from None


class AcceptErrors:
    """Failed accepts of one listener (or threads that would not start for a connection). The
    first of a burst is logged and the rest counted; each retry waits longer, up to a second; the
    first accept that works logs the recovery."""

    def __init__(self, what: str, log: logging.Logger):
        self.what = what
        self._log = log
        self.total = 0
        self.last: str | None = None  # the newest error, as text
        self.last_at: float | None = None  # its time.time()
        self._burst = 0

    def failed(self, e: Exception) -> float:
        """Count `e`; return how long to wait before the next accept."""
        self.total += 1
        self._burst += 1
        self.last, self.last_at = str(e), time.time()
        if self._burst == 1:
            self._log.warning("%s: could not take a connection (%s); retrying with back-off, logging "
                              "again when it recovers", self.what, e)
        return min(_FIRST_WAIT_S * 2 ** min(self._burst - 1, 8), _MAX_WAIT_S)

    def succeeded(self) -> None:
        if self._burst:
            self._log.warning("%s: accepting again after %d error(s)", self.what, self._burst)
            self._burst = 0
