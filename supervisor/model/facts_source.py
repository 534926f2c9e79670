"""Where `check-model` finds the engine's facts (what a llama.cpp build knows about GGUF files).

In an image they sit beside the flag snapshot, /opt/kiln/engine/share/kiln/gguf-facts.json. On a
workstation they sit in the checkout, one file per pinned engine source,
images/engine-facts/<package>-<version>.json (images/build/engine_facts.py writes them). The
field notes needed this check before renting a pod, so a checkout must not answer "ok" for want of an
image's directory:

    --facts FILE        that file
    --engine-share DIR  DIR/gguf-facts.json (an image's share/kiln, or a copy of it)
    --target T          the facts of target T's pinned engine, found in the checkout
    (none)              the image's, else the checkout's when it holds exactly one set

The supervisor never imports images/ (an image ships without it): a target's facts file is found
by the checkout's layout, reading images/targets/T.toml by path; tests/unit/test_model_check.py
holds this to images.build.engine_facts.facts_path for every target. `choose()` only finds a
path and says how; it reads no facts and never raises.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

IMAGE_SHARE = "/opt/kiln/engine/share/kiln"
FACTS_FILE = "gguf-facts.json"
# The checkout this supervisor package sits in (none in an image: there is no images/ beside it).
CHECKOUT = Path(__file__).resolve().parents[2]
_TARGET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]*")


@dataclass(frozen=True)
class FactsChoice:
    path: Path | None           # the facts file to read; None: no facts for this check
    where: str                  # how it was chosen, or why there are none: said to the user
    error: str | None = None    # a usage error (an unknown target, a --facts file that is not there): exit 2


def choose(*, facts: str | None = None, engine_share: str | None = None, target: str | None = None,
           checkout: Path | None = CHECKOUT, image_share: str = IMAGE_SHARE) -> FactsChoice:
    if facts is not None:
        p = Path(facts)
        if not p.is_file():
            return FactsChoice(None, "", f"--facts {facts}: no such file (an engine facts file: images/engine-facts/"
                                         f"*.json in a checkout, {FACTS_FILE} in an image's {image_share})")
        return FactsChoice(p, f"--facts {facts}")
    if engine_share is not None:
        p = Path(engine_share) / FACTS_FILE
        if p.is_file():
            return FactsChoice(p, f"--engine-share {engine_share}")
        return FactsChoice(None, f"no {FACTS_FILE} in --engine-share {engine_share}")
    root = _checkout(checkout)
    if target is not None:
        if root is None:
            return FactsChoice(None, "", f"--target {target}: there are no targets here (not a Kiln checkout): "
                                         "pass --facts FILE or --engine-share DIR")
        return _target(root, target)
    p = Path(image_share) / FACTS_FILE
    if p.is_file():
        return FactsChoice(p, f"this image's engine, {p}")
    if root is None:
        return FactsChoice(None, f"no engine facts here (no {p}, not a Kiln checkout): pass --facts FILE")
    sets = sorted((root / "images/engine-facts").glob("*.json"))
    if len(sets) == 1:
        users = [t for t, f in _target_facts(root).items() if f == sets[0]]
        return FactsChoice(sets[0], f"the checkout's only engine facts, {_rel(root, sets[0])}"
                                    + (f" (the pinned engine of {', '.join(users)})" if users else ""))
    if not sets:
        return FactsChoice(None, f"no engine facts in {_rel(root, root / 'images/engine-facts')}: write them with "
                                 "python build.py generate --only engine-facts")
    return FactsChoice(None, f"{len(sets)} engine fact sets in {_rel(root, root / 'images/engine-facts')}: "
                             "pass --target T for a target's engine (or --facts FILE)")


def target_facts_file(root: Path, target: str) -> Path | None:
    """The facts file of a target's pinned engine (whether or not it exists); None when its engine
    has none by design (not llama.cpp, or a git source with no pinned package)."""
    data = tomllib.loads((root / "images/targets" / f"{target}.toml").read_text(encoding="utf-8"))
    src = data.get("source")
    if data.get("engine", "llamacpp") != "llamacpp" or not isinstance(src, dict) or src.get("kind") != "sdist":
        return None
    return root / "images/engine-facts" / f"{src.get('package')}-{src.get('version')}.json"


def _target(root: Path, name: str) -> FactsChoice:
    known = sorted(p.stem for p in (root / "images/targets").glob("*.toml"))
    if not _TARGET_NAME.fullmatch(name) or name not in known:
        return FactsChoice(None, "", f"--target {name}: no such target in {_rel(root, root / 'images/targets')} "
                                     f"(targets: {', '.join(known) or 'none'})")
    try:
        path = target_facts_file(root, name)
        data = tomllib.loads((root / "images/targets" / f"{name}.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return FactsChoice(None, "", f"--target {name}: images/targets/{name}.toml cannot be read ({e})")
    if path is None:
        src = data.get("source") if isinstance(data.get("source"), dict) else {}
        engine = data.get("engine", "llamacpp")
        if engine != "llamacpp":
            return FactsChoice(None, f"target {name} runs {engine}, not llama.cpp: GGUF engine facts are llama.cpp's")
        what = " ".join(str(src.get(k)) for k in ("url", "branch", "commit") if src.get(k))
        return FactsChoice(None, f"target {name} builds llama.cpp from a {src.get('kind', '?')} source ({what}): "
                                 "Kiln keeps facts only for a pinned sdist")
    if not path.is_file():
        return FactsChoice(None, f"target {name}'s engine has no facts file {_rel(root, path)}: write it with "
                                 "python build.py generate --only engine-facts")
    return FactsChoice(path, f"target {name}'s pinned engine, {_rel(root, path)}")


def _target_facts(root: Path) -> dict[str, Path]:
    out = {}
    for t in sorted((root / "images/targets").glob("*.toml")):
        try:
            f = target_facts_file(root, t.stem)
        except (OSError, ValueError):
            continue
        if f is not None:
            out[t.stem] = f
    return out


def _checkout(root: Path | None) -> Path | None:
    return root if root is not None and (root / "images/engine-facts").is_dir() else None


def _rel(root: Path, p: Path) -> str:
    try:
        return str(p.relative_to(root))
    except ValueError:
        return str(p)
