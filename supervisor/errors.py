"""Kiln's exception tree. Each carries what a person needs to fix it.

    KilnError
    ├── ConfigError          a config, target or published change is invalid (all problems at once)
    ├── HardwareMismatch     the machine is not what the config expects
    ├── FetchError           a download failed or did not verify
    └── EngineFailure        the server failed; carries its failure class and stderr tail
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .validate import Problem


class KilnError(Exception):
    """Base of every error Kiln raises on purpose. `str()` is one readable message."""


class ConfigError(KilnError):
    def __init__(self, what: str, problems: Sequence["Problem"]):
        self.what = what
        self.problems = list(problems)
        lines = [f"{what}: {len(self.problems)} problem(s)"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class HardwareMismatch(KilnError):
    def __init__(self, mismatches: Sequence[str]):
        self.mismatches = list(mismatches)
        super().__init__("this machine does not match the config's [hardware] expectations:\n"
                         + "\n".join(f"  - {m}" for m in self.mismatches))


class FetchError(KilnError):
    pass


class EngineFailure(KilnError):
    def __init__(self, failure_class: str, message: str, tail: Sequence[str] = ()):
        self.failure_class = failure_class
        self.tail = list(tail)
        super().__init__(f"{failure_class}: {message}")
