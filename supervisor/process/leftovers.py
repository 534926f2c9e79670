"""Nothing of a killed supervisor outlives it: every child Kiln starts is recorded in the volume,
and the next supervisor ends what is left of them before it starts anything.

A SIGKILLed supervisor cannot stop its children, and a child in its own session (every engine
is) does not die with it: the engine kept its port and the next supervisor took it for its own
engine; a fetch child went on downloading unsupervised. Three guards:

  * children get a parent-death signal where the platform has one (managed.py, through
    util-linux's `setpriv --pdeathsig KILL`), so the kernel ends them with the supervisor;
  * this journal, `<state_dir>/run/children.json`: pid, start time and command line of each child.
    At boot, a recorded process still alive is ended only when its start time and command line
    are the ones recorded (a reused pid is someone else's, never touched); nothing is found by name;
  * a mark in every child's environment, KILN_CHILD_OF=<this run directory>, which what the child
    starts inherits. The parent-death signal reaches only the process Kiln started: vLLM's EngineCore
    and Worker_TP* processes outlived a SIGKILLed supervisor, held torch's rendezvous port, and every
    relaunch failed EADDRINUSE (issue 50 item 6); and a child started just before its journal entry
    was written was recorded nowhere. At boot every process carrying this run directory's mark (never
    this supervisor or its ancestors) is ended with the recorded ones.

The journal forgets a child before the child counts as exited (managed.py), so a stop that returns
has its write behind it: a supervisor exiting after a clean stop cut that write on the reaper's
daemon thread, leaving `.children.json.<pid>.<tid>.tmp` and the ended child recorded (issue 50
item 12). A temp file of that exact form that a killed supervisor left is removed at the next start.

A journal that cannot be written (a full disk) never keeps a child from starting or from being
tracked: the registry tracks it in memory as ever, the journal keeps every entry and writes them
all at its next change, and /status warns meanwhile (statefile.py) that only the parent-death
signal would end such a child after a SIGKILL.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import psutil

from .statefile import Writes, sweep_temps, write_atomic

JOURNAL = "children.json"
MARK = "KILN_CHILD_OF"             # in every child's environment: the run directory of the supervisor that started it
_TIME_SLACK_S = 0.05          # psutil's create_time is rounded to the clock tick


class ChildrenJournal:
    """The children this supervisor runs, written atomically on every change."""

    def __init__(self, run_dir: Path, writes: Writes | None = None):
        self.path = run_dir / JOURNAL
        self.writes = writes or Writes()
        self._lock = threading.Lock()
        self._entries: dict[int, dict[str, Any]] = {}
        sweep_temps(self.path)            # a killed supervisor's half-written journal: nothing writes it yet

    def add(self, pid: int, role: str, argv: list[str]) -> None:
        try:
            entry = {"pid": pid, "create_time": psutil.Process(pid).create_time(), "cmdline": list(argv),
                     "role": role}
        except psutil.Error:
            return
        with self._lock:
            self._entries[pid] = entry
            self._write()

    def remove(self, pid: int) -> None:
        with self._lock:
            if self._entries.pop(pid, None) is not None:
                self._write()

    def _write(self) -> None:
        data = json.dumps(list(self._entries.values()), indent=1).encode("utf-8")
        self.writes.attempt(f"the children journal ({self.path})",
                            "a supervisor killed now would leave its children to the parent-death signal alone",
                            lambda: write_atomic(self.path, data))


def _same(p: psutil.Process, entry: dict[str, Any]) -> bool:
    """The very process recorded: its start time (a reused pid has another), and its command line
    (a script run through its #! interpreter shows the interpreter first: compare the arguments)."""
    try:
        argv = [str(a) for a in entry["cmdline"]]
        cmdline = p.cmdline()
        started_then = abs(p.create_time() - float(entry["create_time"])) <= _TIME_SLACK_S
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False
    if not started_then or not argv:
        return False
    args = argv[1:]
    return cmdline == argv or (bool(args) and cmdline[-len(args):] == args)


def _recorded(entry: dict[str, Any]) -> psutil.Process | None:
    try:
        p = psutil.Process(int(entry["pid"]))
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None
    return p if _same(p, entry) else None


def mark_of(run_dir: Path) -> str:
    return str(Path(run_dir).resolve())


def _marked(run_dir: Path) -> list[psutil.Process]:
    """Live processes whose environment carries this run directory's mark, but this process and its
    ancestors (a supervisor started by another keeps its parent's mark, of another directory)."""
    mark = mark_of(run_dir)
    mine = {os.getpid(), *(p.pid for p in _ancestors())}
    out = []
    for p in psutil.process_iter(["pid"]):
        if p.pid in mine:
            continue
        try:
            if p.environ().get(MARK) == mark and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            continue                    # gone, or not ours to read
    return out


def _ancestors() -> list[psutil.Process]:
    try:
        return psutil.Process().parents()
    except psutil.Error:
        return []


def end_leftovers(run_dir: Path, log: logging.Logger, grace_s: float = 5.0) -> list[int]:
    """End the recorded children of an earlier supervisor that are still alive, and every process
    carrying this run directory's mark (what they started, and a child its journal never named);
    the pids ended."""
    path = run_dir / JOURNAL
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        entries = []
    found = [(p, e) for e in entries if isinstance(e, dict) and (p := _recorded(e)) is not None]
    seen = {p.pid for p, _ in found}
    for p in _marked(run_dir):
        if p.pid not in seen:
            seen.add(p.pid)
            try:
                found.append((p, {"role": "process", "cmdline": p.cmdline()}))
            except psutil.Error:
                continue
    ended: list[int] = []
    for p, entry in found:
        tree = [p]
        try:
            tree += p.children(recursive=True)
        except psutil.Error:
            pass
        log.warning("ending a leftover %s of an earlier supervisor: pid %d (%s)", entry.get("role", "child"),
                    p.pid, " ".join(entry.get("cmdline", [])[:3])[:160])
        for q in tree:
            try:
                q.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(tree, timeout=grace_s)
        for q in alive:
            try:
                q.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=grace_s)
        ended += [q.pid for q in tree]
    path.unlink(missing_ok=True)
    return ended
