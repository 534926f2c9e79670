"""Pytest glue for kiln_dev: a real component that is missing is a skip here and a failure in CI.

kiln_dev raises `Unavailable` (with the command that provides the component) when there is no
compiled llama-server, no Docker engine, no docker-registry. Whether a test raises it itself or
through a fixture, these hooks turn it into a skip, or, under CI (CI=true), into a failure: CI must
never pass by skipping.
"""

from __future__ import annotations

import os

import pytest

from kiln_dev import Unavailable


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes", "on"}


def _skip_or_fail(err: Unavailable) -> None:
    if in_ci():
        pytest.fail(f"{err} (CI=true: failing rather than skipping)", pytrace=False)
    pytest.skip(str(err))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):  # fixtures (prefix, a docker client, ...)
    try:
        return (yield)
    except Unavailable as err:
        _skip_or_fail(err)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):  # the test body
    try:
        return (yield)
    except Unavailable as err:
        _skip_or_fail(err)
