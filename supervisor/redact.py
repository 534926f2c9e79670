"""One redaction for every place a secret could leak: logs, /status, errors, engine output.

Secrets are masked longest first: with "sk-ab" and "sk-abcd" both secret, masking the short one
first would leave "cd" of the long one in the clear. Structured data is redacted before it is
rendered, because JSON and HTML escaping can change how a secret is spelt in the body (a quote
becomes \\" or &quot;) and a text-only pass over the rendered body would miss it.

A secret shorter than SHORT characters (a 2-letter key someone set) is masked where it stands as a
token of its own, not inside other words: masked everywhere it turned every message into asterisks
("a l***el ***out t***s" for "ab"), and a key that short is in no word's place when it is used.
"""

from __future__ import annotations

import enum
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"
SHORT = 8


def _mask(text: str, secret: str) -> str:
    if len(secret) >= SHORT:
        return text.replace(secret, MASK)
    return re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", MASK, text)


def ordered(secrets: Iterable[str | None]) -> tuple[str, ...]:
    """The non-empty secrets, each once, longest first."""
    return tuple(sorted({s for s in secrets if isinstance(s, str) and s}, key=len, reverse=True))


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """`text` with every secret replaced by ***."""
    for s in ordered(secrets):
        text = _mask(text, s)
    return text


def redact_data(value: Any, secrets: Iterable[str | None]) -> Any:
    """A plain copy of `value` with every secret in every string (keys too) replaced by ***.
    Enum members become their values on the way, so a State reads "SERVING", not "State.SERVING"."""
    keys = ordered(secrets)

    def walk(v: Any) -> Any:
        if isinstance(v, enum.Enum):
            v = v.value
        if isinstance(v, str):
            for s in keys:
                v = _mask(v, s)
            return v
        if isinstance(v, Mapping):
            return {walk(k): walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        return v

    return walk(value)


class Secrets:
    """The secrets one process knows (tokens, keys), shared by threads; iterates longest first."""

    def __init__(self, values: Iterable[str | None] = ()):
        self._lock = threading.Lock()
        self._values: tuple[str, ...] = ordered(values)

    def add(self, *values: str | None) -> None:
        with self._lock:
            self._values = ordered((*self._values, *values))

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, value: object) -> bool:
        return value in self._values

    def redact(self, text: str) -> str:
        return redact(text, self._values)

    def redact_data(self, value: Any) -> Any:
        return redact_data(value, self._values)
