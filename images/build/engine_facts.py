"""What a llama.cpp build knows about model files (its facts), and where a target's facts file is.

The supervisor's model preflight (supervisor/model/check.py) refuses a GGUF the engine would
refuse, before a boot is spent on it. The field notes lost three boots to one DSpark draft: an
architecture this build does not register (`dflash-draft`, not `dflash`), then "DFlash model
requires 'target_layers' in GGUF metadata", then tensors named `dflash.dspark.markov.w1` where
llama.cpp expects `markov_w1`. The answers to "which names does this build know" live in the
engine's own source tree, so they are read from it, never typed in (images/generate/facts.py
reads the pinned sdist: `python build.py generate` writes the files, `--check` verifies them).

A facts file is JSON, one per engine source (images/engine-facts/<package>-<version>.json,
reviewed like a golden file), of this shape (SCHEMA 1):

    {"schema": 1, "engine": "llama.cpp", "source": "sdist:<file>@sha256:<hex>", "generated_by": ...,
     "architectures": {ARCH: {"tensors": [name, ...], "required_keys": [{"key", "read", "message"?}]}},
     "ggml_types": {TYPE_ID: {"name", "block", "bytes"}}}

The Dockerfile bakes it beside the flag snapshot, at /opt/kiln/engine/share/kiln/gguf-facts.json
(FACTS_FILE), where the supervisor reads it. A source with no facts file (a git fork with no pinned
commit) ships none; the supervisor then runs only the checks that need no facts (truncation,
missing splits).

Why a separate step, not the compile script: images/scripts/compile-llama-server.sh's sha256 is
part of every llama.cpp artifact's key, so teaching it this would recompile every engine on every
machine and in CI. The facts depend only on the pinned source.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from supervisor.errors import KilnError

from ..paths import ENGINE_FACTS_DIR
from ..target import Target

FACTS_FILE = "gguf-facts.json"      # its name in the image: /opt/kiln/engine/share/kiln/gguf-facts.json
SCHEMA = 1


class FactsError(KilnError):
    """A facts file, or the pinned source tree it is generated from, cannot be read as the facts need."""


def facts_path(target: Target) -> Path | None:
    """The committed facts file for a target's engine source; None when it has none (git)."""
    src = target.source
    if target.engine != "llamacpp" or src.kind != "sdist":
        return None
    return ENGINE_FACTS_DIR / f"{src.package}-{src.version}.json"


def render(facts: dict[str, Any]) -> str:
    """The facts as their file holds them (sorted keys, one space of indent, a final newline)."""
    return json.dumps(facts, indent=1, sort_keys=True) + "\n"


def read(path: Path) -> dict[str, Any]:
    """A facts file, refused by name when it is not JSON of this SCHEMA."""
    try:
        facts = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise FactsError(f"{path}: cannot be read as engine facts ({e})") from e
    if not isinstance(facts, dict) or facts.get("schema") != SCHEMA:
        got = facts.get("schema") if isinstance(facts, dict) else type(facts).__name__
        raise FactsError(f"{path}: schema {got!r}, this Kiln reads schema {SCHEMA}: run `python build.py generate`")
    return facts
