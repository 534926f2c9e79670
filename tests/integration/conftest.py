"""Fixtures the integration tests share: the real llama-server and a tiny real GGUF."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln_dev.engine import require_prefix
from kiln_dev.models import make_tiny_gguf


@pytest.fixture(scope="module")
def prefix() -> Path:
    """The llama-server `python build.py compile --target cpu-llamacpp` built (fails in CI if absent)."""
    return require_prefix()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_gguf(tmp_path_factory.mktemp("models") / "tiny.gguf")
