"""One managed server process: own session and group, merged output, a stop that leaves nothing.

Stop follows llama-swap/TGI: SIGTERM to the process group, a grace measured on the monotonic
clock, SIGKILL to the group, reap. Descendants are tracked with psutil while the tree is intact,
so a grandchild that called setsid (and so escaped the group) is still found and killed.

A process in uninterruptible sleep (D state: a wedged GPU driver) outlives even SIGKILL until the
kernel call it waits in returns, which may be never. stop() does not raise then (it did, through
PID 1): it records the process (`unkillable`: pid, state), says so in the log and to the owner's
`on_unkillable`, leaves it tracked, and returns None; the supervisor goes on.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
import psutil

from .leftovers import MARK, ChildrenJournal, mark_of
from .statefile import Writes
from .logfile import RotatingFile
from ..redact import ordered
from ..redact import redact as redact_text

__all__ = ["ManagedProcess", "ProcessRegistry", "REGISTRY"]

log = logging.getLogger(__name__)

_REFRESH_S = 0.5  # how often the reader thread re-scans the tree while it runs and changes
# ... backing off, doubling, to this while scans find nothing new (a serving engine's tree is still):
# a scan reads every process's /proc/<pid>/stat (~2-3 ms on a host of 120 processes), twice a second
# half of a serving supervisor's CPU (P2b, bench/supervisor_cpu.py). A new process in the tree
# brings the 0.5 s back; stop() scans again before it kills.
_REFRESH_MAX_S = 8.0
_KILL_WAIT_S = 10.0  # after SIGKILL only an uninterruptible (D state) process takes this long
_UNKNOWN = "unknown"  # a state psutil could not read
_READER_JOIN_S = 2.0  # after the tree is dead its pipe reaches EOF at once; this is a backstop
_PIPE_BYTES = 1 << 20     # the engine's output pipe while batched: 1 MiB, Linux's default pipe-max-size
_BATCH_MAX_BYTES = 1 << 20  # one batched read's most: the rest waits for the next
_MAX_LINE = 64 * 1024  # a line without newline (progress dots) is cut here, not buffered forever
# util-linux's setpriv sets PR_SET_PDEATHSIG and execs (Python's preexec_fn is unsafe with threads).
_SETPRIV = None if os.environ.get("KILN_NO_PDEATHSIG") else shutil.which("setpriv")


def _queued(fd: int) -> int:
    """Bytes waiting in a pipe (FIONREAD), 0 where it cannot say."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except (OSError, struct.error):
        return 0


def _running(p: psutil.Process) -> bool:
    """Alive and not a zombie; is_running() also guards against pid reuse (create time)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
    except OSError:  # /proc cannot be read right now (EMFILE): assume alive, the safe side
        return True


def _reap_if_ours(p: psutil.Process) -> None:
    """Reap a tracked descendant that became our zombie child (we are a subreaper)."""
    try:
        if p.ppid() == os.getpid():
            os.waitpid(p.pid, os.WNOHANG)
    except (psutil.Error, ChildProcessError):
        pass


def _wait_gone(procs: Iterable[psutil.Process], deadline: float) -> list[psutil.Process]:
    """Poll until every process is dead or a zombie, or the deadline; return those still alive.

    Not psutil.wait_procs: for a non-child it waits for the pid to vanish, and a zombie
    re-parented to a non-reaping init never vanishes.
    """
    pending = list(procs)
    delay = 0.005
    while True:
        alive = []
        for p in pending:
            if _running(p):
                alive.append(p)
            else:
                _reap_if_ours(p)
        pending = alive
        now = time.monotonic()
        if not pending or now >= deadline:
            return pending
        time.sleep(min(delay, deadline - now))
        delay = min(delay * 2, 0.1)


# A terminal's colour and cursor codes (smg colours its log lines even into a pipe): they are not
# text, and they landed in engine.log and /status as escape bytes. Taken out before anything keeps a line.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class ManagedProcess:
    """One server process, started in its own session and process group."""

    pid: int
    pgid: int
    started_at: float
    exited_at: float | None = None   # monotonic time the leader was reaped

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        *,
        on_line: Callable[[str], None] | None,
        tail_lines: int,
        on_lines: Callable[[list[str]], None] | None = None,
        redact: Sequence[str],
        log: RotatingFile | None,
        on_unkillable: Callable[[dict[str, object]], None] | None = None,
    ) -> None:
        # Use start(); the constructor only wires an already started Popen.
        self._popen = popen
        self.pid = popen.pid
        try:
            self.pgid = os.getpgid(popen.pid)
        except ProcessLookupError:  # cannot happen before we reap it; keep the session's id
            self.pgid = popen.pid
        self.started_at = time.monotonic()
        # The argv it was asked to run (setpriv's wrapper not included): secrets and all, for the
        # supervisor's own use only (the selftest reads its sampler flags); never shown as it is.
        self.argv: tuple[str, ...] = ()
        self._on_line = on_line
        self._on_lines = on_lines
        self._batch_s = 0.0
        self._pipe_bytes: int | None = None   # the output pipe's size, once batching asked for it
        self._burst_until = 0.0               # monotonic: until then a batched read does not wait (a burst)
        self._redact = ordered(redact)
        self._redact_joined = not any("\n" in s or "\r" in s for s in self._redact)
        self._log = log
        self._tail: collections.deque[str] = collections.deque(maxlen=max(tail_lines, 0))
        self._tail_lock = threading.Lock()
        self._last_output_at = self.started_at
        self._output_seq = 0                  # reads emitted so far: wait_output()'s mark
        self._in_hand = False                 # the reader holds bytes it has not handed on yet
        self._output_cond = threading.Condition()
        # Created before anything can reap the child, so it is never a stale pid.
        self._ps = psutil.Process(popen.pid)
        self._desc: dict[int, psutil.Process] = {}
        self._tree_lock = threading.Lock()
        self._scan_failed = False  # a failed scan is logged once, until one succeeds again
        self._exited = threading.Event()
        self._reader_done = threading.Event()
        self._abandon_pipe = threading.Event()
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._on_unkillable = on_unkillable
        self.unkillable: dict[str, object] | None = None   # set when SIGKILL did not end the tree
        self._waiter = threading.Thread(target=self._wait_exit, name=f"kiln-wait-{self.pid}", daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name=f"kiln-read-{self.pid}", daemon=True)
        self._waiter.start()
        self._reader.start()

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        on_line: Callable[[str], None] | None = None,
        on_lines: Callable[[list[str]], None] | None = None,
        tail_lines: int = 200,
        redact: Sequence[str] = (),
        log_file: str | None = None,
        log_max_bytes: int | None = None,
        log_keep: int = 3,
        role: str = "child",
        pdeathsig: bool = True,
        on_unkillable: Callable[[dict[str, object]], None] | None = None,
    ) -> ManagedProcess:
        """Start argv (a list, never a shell string) and track it in REGISTRY.

        With `pdeathsig` the kernel KILLs the child when the thread that started it exits
        (PR_SET_PDEATHSIG, through `setpriv`, which then execs argv: same pid). It follows the
        *thread*: start long-lived children from a thread that lives as long as they should.
        `on_line` hears each output line (redacted), `on_lines` the lines of each read together;
        `log_file` gets every output line (redacted), rotated past `log_max_bytes` with `log_keep`
        old files (supervisor/process/logfile.py). `on_unkillable` hears of a tree SIGKILL did not end."""
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a sequence of arguments, not a string (no shell)")
        args = [str(a) for a in argv]
        if not args:
            raise ValueError("argv is empty")
        if isinstance(redact, str):  # a lone str would redact each of its characters
            raise TypeError("redact must be a sequence of strings, not a string")
        if pdeathsig and _SETPRIV:
            args = [_SETPRIV, "--pdeathsig", "KILL", "--", *args]
        mark = REGISTRY.mark
        if mark is not None:            # what the child starts inherits it: a restart finds them (leftovers.py)
            env = {**(os.environ if env is None else env), MARK: mark}
        # Opened before the child exists, so a bad path cannot leave an orphan behind.
        log = RotatingFile(log_file, max_bytes=log_max_bytes, keep=log_keep) if log_file else None
        try:
            popen = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,  # own session and group: setsid in the child, thread-safe
                close_fds=True,  # another child's pipe must not keep this one's EOF away
            )
        except BaseException:
            if log:
                log.close()
            raise
        proc = cls(popen, on_line=on_line, on_lines=on_lines, tail_lines=tail_lines, redact=redact, log=log, on_unkillable=on_unkillable)
        proc.argv = tuple(str(a) for a in argv)
        REGISTRY.track(proc, role, list(proc.argv))
        return proc

    # -- state ---------------------------------------------------------------------------------

    def poll(self) -> int | None:
        """Return code once exited: >= 0 exit status, < 0 = -signal (Popen convention)."""
        return self._popen.returncode if self._exited.is_set() else None

    def alive(self) -> bool:
        """Running, as far as the kernel says now (a dead leader not yet reaped is not alive)."""
        return not self._exited.is_set() and _running(self._ps)

    def wait(self, timeout: float | None) -> int | None:
        """Wait for the process to exit; None on timeout."""
        return self._popen.returncode if self._exited.wait(timeout) else None

    def exited(self) -> threading.Event:
        """Set once the process has exited and been reaped (poll() is then not None)."""
        return self._exited

    def tail(self) -> list[str]:
        """The last tail_lines lines of output, already redacted."""
        with self._tail_lock:
            return list(self._tail)

    def last_output_at(self) -> float:
        """Monotonic time output last arrived, a partial line included (started_at before any)."""
        return self._last_output_at

    def output_mark(self) -> int:
        """How many reads of output have been handed on so far: the mark for wait_output()."""
        return self._output_seq

    def wait_output(self, mark: int, timeout: float) -> bool:
        """True as soon as output has come since `mark` (output_mark()'s), False after `timeout`:
        a health wait wakes on the engine's ready line instead of sleeping out its poll."""
        with self._output_cond:
            return self._output_cond.wait_for(lambda: self._output_seq != mark, timeout)

    def caught_up(self, timeout: float) -> bool:
        """Wait, up to `timeout`, for a moment when the pipe holds nothing and the reader holds
        nothing it has not handed on (callbacks run): then every whole line written before the call
        has been handed on. True at that moment (at once, the usual case), or once the reader has
        ended (what it could not read is lost either way); False after `timeout` (an engine that
        never stops writing leaves no such moment). A health probe can pass before the reader
        thread has read the engine's last lines of the load (two busy cores): without this, the
        boot timeline closed at SERVING and lost their phases."""
        deadline = time.monotonic() + timeout
        with self._output_cond:
            while True:
                if self._reader_done.is_set():
                    return True
                try:
                    queued = _queued(self._popen.stdout.fileno()) if self._popen.stdout else 0
                except ValueError:                # closed: the reader has ended
                    return True
                if queued == 0 and not self._in_hand:   # queued first: a read empties the pipe only
                    return True                         # after setting _in_hand, so none is missed
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._output_cond.wait(min(left, 0.01))

    # -- the tree ------------------------------------------------------------------------------

    def tree_pids(self) -> set[int]:
        """Every pid ever seen in this tree, after a fresh scan."""
        self._refresh_tree()
        with self._tree_lock:
            return {self.pid, *self._desc}

    def survivors(self) -> list[int]:
        """Tracked pids still alive (zombies do not count)."""
        with self._tree_lock:
            procs = [self._ps, *self._desc.values()]
        return sorted(p.pid for p in procs if _running(p))

    def _refresh_tree(self) -> bool:
        """Scan for descendants; True when one not tracked before was found."""
        # Children are found through parent links, which break when an intermediate process
        # dies; so scan from every tracked process still alive, not only from the leader.
        new = False
        with self._tree_lock:
            roots = [p for p in (self._ps, *self._desc.values()) if _running(p)]
            covered: set[int] = set()
            for root in roots:  # the leader first: usually its one scan covers everything
                if root.pid in covered:
                    continue
                try:
                    found = root.children(recursive=True)  # one /proc scan per call
                except psutil.Error:
                    continue
                except OSError as e:
                    # EMFILE: reading /proc needs a descriptor. What is tracked stays tracked;
                    # the next scan (every _REFRESH_S, and at stop) tries again.
                    if not self._scan_failed:
                        log.warning("pid %d: cannot scan its process tree (%s); retrying", self.pid, e)
                    self._scan_failed = True
                    return True                  # retry at the fast pace
                if self._scan_failed:
                    log.warning("pid %d: scanning its process tree again", self.pid)
                    self._scan_failed = False
                for child in found:
                    covered.add(child.pid)
                    known = self._desc.get(child.pid)
                    if child.pid != self.pid and (known is None or not _running(known)):
                        self._desc[child.pid] = child
                        new = True
        return new

    def _descendants(self) -> list[psutil.Process]:
        with self._tree_lock:
            return list(self._desc.values())

    # -- signals and stop ----------------------------------------------------------------------

    def signal_group(self, sig: int) -> None:
        """Send sig to the whole process group (a no-op once the group is gone)."""
        if self._exited.is_set() and not self._group_has_members():
            # An empty group's id can be reused by an unrelated new session: do not signal it.
            return
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass

    def _group_has_members(self) -> bool:
        self._refresh_tree()
        for p in self._descendants():
            try:
                if _running(p) and os.getpgid(p.pid) == self.pgid:
                    return True
            except ProcessLookupError:
                continue
        return False

    def _escapees(self) -> list[psutil.Process]:
        """Tracked live descendants outside our group (they called setsid or setpgid)."""
        out = []
        for p in self._descendants():
            try:
                if _running(p) and os.getpgid(p.pid) != self.pgid:
                    out.append(p)
            except ProcessLookupError:
                continue
        return out

    def stop(self, grace_s: float = 10.0) -> int | None:
        """TERM the group, wait grace_s, KILL the group and every tracked escapee, reap.

        Idempotent. Returns the process's return code (Popen convention), or None when the process
        outlived SIGKILL (uninterruptible): then `unkillable` says which and in what state. Never raises
        for a process that will not die.
        """
        with self._stop_lock:
            if self._stopped:
                return self._popen.returncode
            deadline = time.monotonic() + max(grace_s, 0.0)
            self._refresh_tree()  # last look while parent links are intact
            self.signal_group(signal.SIGTERM)
            for p in self._escapees():
                _send(p, signal.SIGTERM)
            self._exited.wait(max(0.0, deadline - time.monotonic()))
            self._refresh_tree()  # shutdown may have spawned helpers
            left = _wait_gone(self._descendants(), deadline)
            if not self._exited.is_set() or left:
                # said, so a stop that took SIGKILL is not mistaken for a clean one (exit 137 follows)
                log.warning("pid %d: %s %.0f s after SIGTERM: SIGKILL to its group", self.pid,
                            "a process of its tree still running" if self._exited.is_set() else "still running",
                            max(grace_s, 0.0))
                self.signal_group(signal.SIGKILL)
                self._refresh_tree()
                for p in self._descendants():
                    if _running(p):
                        _send(p, signal.SIGKILL)
            leader_gone = self._exited.wait(_KILL_WAIT_S)
            left = _wait_gone(self._descendants(), time.monotonic() + (_KILL_WAIT_S if leader_gone else 0.0))
            if not leader_gone or left:
                self._record_unkillable(([] if leader_gone else [self._ps]) + left)
            self._stopped = True
            if not leader_gone:          # its pipe stays open while it lives: the reader keeps draining it
                return None
            self._close_pipe()
            return self._popen.returncode

    def _record_unkillable(self, procs: list[psutil.Process]) -> None:
        """Processes of this tree that outlived SIGKILL: on `unkillable`, in the log, to the owner."""
        alive = [{"pid": p.pid, "state": _state(p)} for p in procs]
        self.unkillable = {"pid": self.pid, "leader_alive": any(a["pid"] == self.pid for a in alive),
                           "processes": alive, "since": round(time.time(), 3)}
        log.error("pid %d: %s did not die %.0f s after SIGKILL (uninterruptible sleep, such as a wedged GPU "
                  "driver, ends only when the kernel lets go); left behind, the supervisor goes on",
                  self.pid, ", ".join(f"pid {a['pid']} ({a['state']})" for a in alive), _KILL_WAIT_S)
        if self._on_unkillable is not None:
            try:
                self._on_unkillable(dict(self.unkillable))
            except Exception:  # the owner's bookkeeping must not turn this into a raise after all
                log.exception("pid %d: on_unkillable callback failed", self.pid)

    def _close_pipe(self) -> None:
        # With the tree dead the pipe is at EOF. A writer we never saw (spawned and detached
        # between scans) could hold it open; then stop reading rather than hang stop().
        if threading.current_thread() is self._reader:  # stop() called from on_line
            self._abandon_pipe.set()
            return
        self._reader.join(_READER_JOIN_S)
        if self._reader.is_alive():
            log.warning("pid %d: output pipe still open after stop; closing it", self.pid)
            self._abandon_pipe.set()
            self._reader.join(_READER_JOIN_S)

    # -- threads -------------------------------------------------------------------------------

    def _wait_exit(self) -> None:
        # The only place that reaps the leader: Popen keeps its exit status. The journal forgets it
        # before `_exited` says so: stop() waits on that, and a supervisor that stops and exits must
        # not cut this (daemon) thread in the middle of the journal's write, leaving its temp file
        # and a child it already ended still recorded (issue 50 item 12).
        self._popen.wait()
        self.exited_at = time.monotonic()
        try:
            REGISTRY.forget(self.pid)
        finally:
            self._exited.set()

    def _read_loop(self) -> None:
        assert self._popen.stdout is not None
        fd = self._popen.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        buf = b""
        interval = _REFRESH_S
        next_refresh = time.monotonic() + interval
        try:
            while not self._abandon_pipe.is_set():
                wait_s = _REFRESH_S if self._exited.is_set() else max(0.0, next_refresh - time.monotonic())
                if poller.poll(wait_s * 1000):
                    self._in_hand = True              # before the read: caught_up() never misses it
                    chunk, eof = self._read_batch(fd, poller)
                    if not chunk:
                        break
                    # Any bytes are progress, even without a newline (loading dots).
                    self._last_output_at = time.monotonic()
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    while len(buf) >= _MAX_LINE:
                        lines.append(buf[:_MAX_LINE])
                        buf = buf[_MAX_LINE:]
                    if lines:
                        self._emit(lines)
                    if eof:
                        break                         # in hand until the last part-line is handed on
                    self._done_in_hand()
                if time.monotonic() >= next_refresh and not self._exited.is_set():
                    interval = _REFRESH_S if self._refresh_tree() else min(interval * 2, _REFRESH_MAX_S)
                    next_refresh = time.monotonic() + interval
            if buf:
                self._emit([buf])
            self._done_in_hand()
        except Exception:
            # Only reading the pipe itself gets here (tree scans and callbacks catch their own):
            # nothing more can be read from it, so close it rather than spin.
            log.exception("pid %d: output reader failed", self.pid)
        finally:
            self._popen.stdout.close()
            self._close_log()
            self._reader_done.set()

    def batch_output(self, seconds: float) -> None:
        """Gather up to `seconds` of output into each read from now on (0: each read as it comes).
        For a serving engine: a GPU llama-server logs ~10 lines a request, each its own write, and a
        read per line was the supervisor's largest CPU cost while serving (P2b). The reader widens
        the pipe first, and does not wait while a burst goes on (half a pipe queued, or brought by a
        batch within the last batch time): an engine that logs faster than that is read as it writes,
        not held on a full pipe."""
        self._batch_s = max(0.0, seconds)

    def _pipe_capacity(self, fd: int) -> int:
        """The output pipe's size, widened to _PIPE_BYTES where the kernel allows (once, on the
        reader's own thread: the fd is the reader's to close)."""
        if self._pipe_bytes is None:
            try:
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
            except (OSError, AttributeError) as e:   # past pipe-user-pages-soft without CAP_SYS_RESOURCE, say
                log.info("pid %d: output pipe not widened (%s): batched reads stop waiting at half of it",
                         self.pid, getattr(e, "strerror", None) or e)
            try:
                self._pipe_bytes = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
            except (OSError, AttributeError):
                self._pipe_bytes = 65536             # Linux's default
        return self._pipe_bytes

    def _read_batch(self, fd: int, poller: "select.poll") -> tuple[bytes, bool]:
        """One read, or with batch_output a read then what else came within the batch time:
        (bytes, whether the pipe reached its end). Empty bytes: the end, nothing more."""
        chunk = os.read(fd, 65536)
        if not chunk or not self._batch_s or self._exited.is_set():
            return chunk, False
        half = self._pipe_capacity(fd) // 2
        # A burst (half a pipe queued now, or in a batch less than a batch time ago) is read as it
        # comes: waiting would hold the engine's writes on a full pipe, a pipe per batch.
        if len(chunk) + _queued(fd) >= half:
            self._burst_until = time.monotonic() + self._batch_s
        if time.monotonic() >= self._burst_until:
            self._exited.wait(self._batch_s)        # an exit (a stop) ends the wait: the rest is read at once
        parts = [chunk]
        size = len(chunk)
        eof = False
        while size < _BATCH_MAX_BYTES and poller.poll(0):
            more = os.read(fd, 65536)
            if not more:
                eof = True
                break
            parts.append(more)
            size += len(more)
        if size >= half:
            self._burst_until = time.monotonic() + self._batch_s
        return b"".join(parts), eof

    def _done_in_hand(self) -> None:
        with self._output_cond:
            self._in_hand = False
            self._output_cond.notify_all()

    def _close_log(self) -> None:
        log_file, self._log = self._log, None
        if log_file:
            try:
                log_file.close()
            except OSError:
                pass

    def _emit(self, raws: list[bytes]) -> None:
        """The lines of one read: the tail, the log file and `on_lines` take them together (one
        lock, one write, one call: a GPU engine logs ~10 lines a request, P2b), `on_line` each."""
        if self._redact_joined:                   # one decode and one pass per secret for the whole read
            text = redact_text(_ANSI.sub("", b"\n".join(raws).decode("utf-8", errors="replace")), self._redact)
            lines = [line.rstrip("\r") for line in text.split("\n")]
        else:                                     # a secret with a newline in it: line by line, as it was
            lines = [redact_text(_ANSI.sub("", raw.decode("utf-8", errors="replace")).rstrip("\r"), self._redact)
                     for raw in raws]
        with self._tail_lock:
            self._tail.extend(lines)
        self._last_output_at = time.monotonic()
        with self._output_cond:                   # once per read: a few a second while serving (batched)
            self._output_seq += 1
            self._output_cond.notify_all()
        if self._log:
            try:
                self._log.write_lines(lines)
            except (OSError, ValueError) as e:  # a full disk: keep draining, stop writing the file
                log.warning("pid %d: output log not written any more (%s)", self.pid, e)
                self._close_log()
        if self._on_lines:
            try:
                self._on_lines(lines)
            except Exception:  # a callback bug must not stop the draining of the pipe
                log.exception("pid %d: on_lines callback failed", self.pid)
        if self._on_line:
            for line in lines:
                try:
                    self._on_line(line)
                except Exception:
                    log.exception("pid %d: on_line callback failed", self.pid)


def _state(p: psutil.Process) -> str:
    """psutil's status ("disk-sleep" is D state), or "unknown"."""
    try:
        return str(p.status())
    except (psutil.Error, OSError):
        return _UNKNOWN


def _send(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)  # psutil refuses if the pid was reused
    except (psutil.Error, OSError):  # OSError: the reuse check could not read /proc (EMFILE)
        pass


class ProcessRegistry:
    """Every process Kiln starts, so nothing escapes: the ladder's reclaim barrier asks it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: list[ManagedProcess] = []
        self._journal: ChildrenJournal | None = None
        self._roles: dict[int, str] = {}
        self.mark: str | None = None          # KILN_CHILD_OF's value for every child (leftovers.py)

    def journal_to(self, run_dir: Path, writes: Writes | None = None) -> None:
        """Record every child started from now on in run_dir (supervisor/process/leftovers.py), and mark
        each one's environment with it; `writes` hears when the journal cannot be written (statefile.py)."""
        self._journal = ChildrenJournal(run_dir, writes)
        self.mark = mark_of(run_dir)

    def track(self, p: ManagedProcess, role: str = "child", argv: Sequence[str] = ()) -> None:
        with self._lock:
            # Forget finished trees so a long-lived supervisor does not grow without bound.
            self._procs = [q for q in self._procs if not q.exited().is_set() or q.survivors()]
            self._procs.append(p)
            self._roles = {q.pid: self._roles.get(q.pid, role) for q in self._procs}
            self._roles[p.pid] = role
        if self._journal is not None:
            self._journal.add(p.pid, role, list(argv))

    def forget(self, pid: int) -> None:
        if self._journal is not None:
            self._journal.remove(pid)

    def pids(self) -> set[int]:
        """Leader pids of tracked processes: pass them to reap_orphans so Popen keeps their status."""
        with self._lock:
            return {p.pid for p in self._procs}

    def survivors(self, role: str | None = None) -> list[int]:
        """Live pids of tracked trees (of one role: "engine" for the reclaim barrier, which must not
        kill a model download running beside the engine)."""
        with self._lock:
            procs = [p for p in self._procs if role is None or self._roles.get(p.pid) == role]
        return sorted({pid for p in procs for pid in p.survivors()})

    def stop_all(self, grace_s: float) -> None:
        """Stop every tracked process in parallel, so the total wait is one grace, not n."""
        with self._lock:
            procs = list(self._procs)
        errors: list[BaseException] = []

        def stop(p: ManagedProcess) -> None:
            try:
                p.stop(grace_s)
            except Exception as e:
                errors.append(e)

        threads = [threading.Thread(target=stop, args=(p,), daemon=True) for p in procs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]


REGISTRY = ProcessRegistry()
