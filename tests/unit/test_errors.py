"""Every error Kiln raises on purpose belongs to one tree, and errors.py's docstring lists it all."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import images
import supervisor
from supervisor import errors
from supervisor.errors import KilnError

# Exceptions that are not errors a person reads: control flow inside one module.
NOT_ERRORS: set[str] = {
    "Stop",                  # lifecycle.Stop: goes with the event loop (issue 16)
    "_Again", "_Stop",       # fleet.cluster_terminate: retry or give up inside its search, said there as a warning
}


def _exception_classes() -> list[type[BaseException]]:
    found = []
    for pkg in (supervisor, images):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if info.name.endswith("__main__"):
                continue
            mod = importlib.import_module(info.name)
            for _, obj in inspect.getmembers(mod, inspect.isclass):
                if issubclass(obj, BaseException) and obj.__module__ == mod.__name__:
                    found.append(obj)
    return found


def test_every_exception_class_kiln_defines_is_a_kiln_error():
    stray = [f"{c.__module__}.{c.__name__}" for c in _exception_classes()
             if not issubclass(c, KilnError) and c.__name__ not in NOT_ERRORS]
    assert stray == [], f"exceptions outside the KilnError tree: {stray}"


def test_the_errors_docstring_lists_every_kiln_error():
    doc = errors.__doc__ or ""
    unlisted = [f"{c.__module__}.{c.__name__}" for c in _exception_classes()
                if issubclass(c, KilnError) and f" {c.__name__} " not in doc.replace("\n", " ")]
    assert unlisted == [], f"add these to the tree in supervisor/errors.py: {unlisted}"


def test_the_errors_docstring_names_no_class_that_does_not_exist():
    names = {c.__name__ for c in _exception_classes()}
    import re
    listed = set(re.findall(r"[├└]── (\w+)", errors.__doc__ or ""))
    assert listed - names == set(), f"listed but not defined: {sorted(listed - names)}"
