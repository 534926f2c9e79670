"""Validation that collects every problem before it reports any.

A user who fixes one typo per run learns to hate a tool. Every reader here
records problems (field path, bad value, what is allowed, how to fix it) and
the caller raises once with all of them. Used by the deploy config and by
`images/` for target files, so both speak the same error language. The Problem itself is
defined beside the ConfigError that carries it (supervisor/errors.py) and is importable here.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from .errors import NO_VALUE as _MISSING, ConfigError, Problem

__all__ = ["Problem", "Reader", "nearest", "raise_if", "read_text"]

T = TypeVar("T")


def raise_if(problems: list[Problem], what: str) -> None:
    if problems:
        raise ConfigError(what, problems)


def read_text(path: str | os.PathLike[str], what: str | None = None) -> str:
    """A config file's text (UTF-8), or a ConfigError about `what` (default: the path) saying why not:
    it cannot be read (the system's reason), or it is not UTF-8 (where its first bad byte is)."""
    p = Path(path)
    what = what or str(p)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(what, [Problem("(file)", f"cannot be read: {e.strerror or e}", str(p))]) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ConfigError(what, [Problem(
            "(file)", f"is not UTF-8 text: byte 0x{data[e.start]:02x} at line {line}, column {column}", str(p),
            "UTF-8 text: save the file as UTF-8 (an editor's encoding setting, or iconv -t UTF-8)")]) from None


def nearest(word: str, choices: Iterable[str]) -> str | None:
    hits = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return hits[0] if hits else None


def _bounds(lo: Any, hi: Any) -> str:
    """The allowed range as a person reads it: "1 .. 64", "0.5 or more", "at most 10", "any number"."""
    if lo is not None and hi is not None:
        return f"{lo} .. {hi}"
    if lo is not None:
        return f"{lo} or more"
    if hi is not None:
        return f"at most {hi}"
    return "any finite number"


class Reader:
    """Reads one TOML table, recording a Problem for anything wrong.

    Each getter returns a usable value (the default when the field is bad) so
    validation carries on and finds the next problem too. `finish()` reports
    fields nobody asked for, with the nearest known name.
    """

    def __init__(self, data: Any, path: str, problems: list[Problem]):
        self.path = path
        self.problems = problems
        if not isinstance(data, dict):
            self._add("", "must be a table", data)
            data = {}
        self.data: dict[str, Any] = data
        self._seen: set[str] = set()

    # -- plumbing ---------------------------------------------------------
    def _p(self, key: str) -> str:
        if not key:
            return self.path or "(top level)"
        return f"{self.path}.{key}" if self.path else key

    def _add(self, key: str, message: str, value: Any = _MISSING, allowed: str | None = None) -> None:
        self.problems.append(Problem(self._p(key), message, value, allowed))

    def problem(self, key: str, message: str, value: Any = _MISSING, allowed: str | None = None) -> None:
        """Record a cross-field problem found by the caller."""
        self._add(key, message, value, allowed)

    def has(self, key: str) -> bool:
        return key in self.data

    def _get(self, key: str, default: Any, required: bool) -> Any:
        self._seen.add(key)
        if key in self.data:
            return self.data[key]
        if required:
            self._add(key, "is required")
        return default

    def _typed(self, key: str, default: Any, required: bool, kinds: tuple[type, ...], kind_name: str) -> Any:
        value = self._get(key, _MISSING, required)
        if value is _MISSING:
            return default
        # bool is an int in Python; a TOML `true` is never a number here.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            self._add(key, f"must be {kind_name}", value)
            return default
        return value

    # -- getters ----------------------------------------------------------
    def str(self, key: str, default: Any = None, *, required: bool = False,
            choices: Iterable[str] | None = None, pattern: str | None = None,
            pattern_hint: str | None = None) -> Any:
        value = self._typed(key, _MISSING, required, (str,), "a string")
        if value is _MISSING:
            return default
        if "\n" in value or "\r" in value or "\x00" in value:
            self._add(key, "must be a single line", value)
            return default
        if choices is not None:
            options = list(choices)
            if value not in options:
                hint = nearest(value, options)
                msg = "is not a known value" + (f"; did you mean {hint!r}?" if hint else "")
                self._add(key, msg, value, ", ".join(options))
                return default
        if pattern is not None and not re.fullmatch(pattern, value):
            self._add(key, "has the wrong form", value, pattern_hint or f"/{pattern}/")
            return default
        return value

    def int(self, key: str, default: Any = None, *, required: bool = False,
            min: int | None = None, max: int | None = None) -> Any:
        value = self._typed(key, _MISSING, required, (int,), "an integer")
        if value is _MISSING:
            return default
        return self._range(key, value, default, min, max)

    def float(self, key: str, default: Any = None, *, required: bool = False,
              min: float | None = None, max: float | None = None) -> Any:
        value = self._typed(key, _MISSING, required, (int, float), "a number")
        if value is _MISSING:
            return default
        value = float(value)
        if not math.isfinite(value):
            # TOML has nan and inf, and every comparison with nan is false: a range check alone
            # lets it through (stall_s = nan turned stall detection off; a nan backoff raised in PID 1).
            self._add(key, "must be a finite number (nan and inf are no setting's value): write a number",
                      value, _bounds(min, max))
            return default
        return self._range(key, value, default, min, max)

    def _range(self, key: str, value: Any, default: Any, lo: Any, hi: Any) -> Any:
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            self._add(key, "is out of range", value, _bounds(lo, hi))
            return default
        return value

    def bool(self, key: str, default: Any = None, *, required: bool = False) -> Any:
        value = self._typed(key, _MISSING, required, (bool,), "true or false")
        return default if value is _MISSING else value

    def str_list(self, key: str, default: Any = (), *, required: bool = False,
                 item: Callable[[str], str | None] | None = None) -> tuple[str, ...]:
        """A list of strings; `item` returns an error message for a bad entry."""
        value = self._typed(key, _MISSING, required, (list,), "a list of strings")
        if value is _MISSING:
            return tuple(default)
        out: list[str] = []
        for i, entry in enumerate(value):
            if not isinstance(entry, str) or "\n" in entry or "\x00" in entry:
                self._add(f"{key}[{i}]", "must be a single-line string", entry)
                continue
            err = item(entry) if item else None
            if err:
                self._add(f"{key}[{i}]", err, entry)
                continue
            out.append(entry)
        return tuple(out)

    def str_map(self, key: str, *, key_pattern: str = r"[A-Za-z_][A-Za-z0-9_]*",
                key_hint: str = "NAME made of letters, digits and _") -> dict[str, str]:
        value = self._typed(key, _MISSING, False, (dict,), "a table of strings")
        if value is _MISSING:
            return {}
        out: dict[str, str] = {}
        for k, v in value.items():
            if not re.fullmatch(key_pattern, k):
                self._add(f"{key}.{k}", "is not a valid name", k, key_hint)
            elif not isinstance(v, str) or "\n" in v or "\x00" in v:
                self._add(f"{key}.{k}", "must be a single-line string", v)
            else:
                out[k] = v
        return out

    def table(self, key: str, *, required: bool = False) -> "Reader":
        value = self._get(key, {}, required)
        return Reader(value, self._p(key), self.problems)

    def tables(self, key: str, *, required: bool = False) -> list["Reader"]:
        value = self._get(key, [], required)
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self._add(key, f"must be an array of tables ([[{key}]])", value)
            return []
        return [Reader(v, f"{self._p(key)}[{i}]", self.problems) for i, v in enumerate(value)]

    def finish(self) -> None:
        known = sorted(self._seen)
        for key in self.data:
            if key not in self._seen:
                hint = nearest(key, known)
                msg = "is not a known field" + (f"; did you mean {hint!r}?" if hint else "")
                self._add(key, msg, allowed=", ".join(known) or "(none)")
