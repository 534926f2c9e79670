"""Model preflight: refuse, before launch, a GGUF file this engine build would refuse.

The field notes spent a boot on each of three blockers of one DSpark draft, found one at a time:
`general.architecture = "dflash-draft"` where llama.cpp registers `dflash`; then "DFlash model
requires 'target_layers' in GGUF metadata"; then tensors named `dflash.dspark.markov.w1` where
llama.cpp expects `markov_w1`. Each is readable from the file's header in milliseconds, against
what the engine build knows (its facts: images/build/engine_facts.py records them from the engine's
pinned source into the image's share/kiln/gguf-facts.json). This module reports all of them at
once, each with the engine's own words where it has them and the fix.

    problems = check_model(path, load_facts(share_dir), draft=draft_path)
    problems = run/launch.py model_problems(cfg, rung, model_path, snapshot)   # a rung of a deploy config
    if problems: -> failure(problems, rung.name)  (class model_incompatible: terminal, not a crash loop)

Checked, per file (and for a split model, per shard):
  - a split is missing, misnumbered or not the first one given       (needs no facts)
  - tensor data past the end of the file: truncated or incomplete     (needs no facts)
  - a tensor type this build does not know
  - the architecture is unknown to this build (with the nearest known name)
  - a key the engine reads unconditionally for that architecture is missing (with its message)
  - a tensor name is not one the architecture's loader knows (with the nearest known name)

Pure: reads headers only, never the tensor data, never starts anything. Without facts (an engine
built from a source Kiln has no facts for) only the first two run.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..failure import Failure, FailureClass
from .facts_source import FACTS_FILE, IMAGE_SHARE
from .gguf_layout import FileHeader, GGUFError, read_header

DEFAULT_SHARE = IMAGE_SHARE
CONVERT_FIX = "convert the original checkpoint with this llama.cpp's own convert_hf_to_gguf.py"
_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")
_PLACEHOLDER = re.compile(r"\\\{(?:bid|xid)\\\}")


@dataclass(frozen=True)
class ModelProblem:
    file: str            # the file the problem is in
    kind: str            # unreadable | missing_split | truncated | unknown_type | unknown_architecture
    #                      | missing_key | unknown_tensor
    message: str         # what is wrong (the engine's own words where it has them)
    fix: str
    role: str = "model"  # "model", or "draft" for the rung's speculative draft (a rung without the
    #                      draft may still load the model: the caller may fall through)

    def __str__(self) -> str:
        what = "draft model " if self.role == "draft" else ""
        return f"{what}{self.file}: {self.message}; fix: {self.fix}"


@dataclass(frozen=True)
class ArchFacts:
    tensors: tuple[str, ...]                     # templates: "blk.{bid}.attn_q", "markov_w1"
    required_keys: tuple[dict[str, str], ...]    # {"key", "read", "message"?}

    def knows(self, tensor: str) -> bool:
        """A file's tensor is one of these names, or one of them plus a suffix (.weight, .bias)."""
        return bool(_pattern(self.tensors).fullmatch(tensor))


@functools.lru_cache(maxsize=16)
def _pattern(templates: tuple[str, ...]) -> re.Pattern[str]:
    # Compiled for the architectures a boot meets, not for all of the build's ~150.
    alts = "|".join(_PLACEHOLDER.sub(r"\\d+", re.escape(t)) for t in templates) or "(?!)"
    return re.compile(rf"(?:{alts})(?:\.\w+)*")


@dataclass(frozen=True)
class EngineFacts:
    source: str
    architectures: dict[str, ArchFacts]
    ggml_types: dict[int, tuple[str, int, int]]   # id -> (name, elements per block, bytes per block)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EngineFacts":
        archs = {name: ArchFacts(tuple(a["tensors"]), tuple(a["required_keys"]))
                 for name, a in d["architectures"].items()}
        types = {int(k): (v["name"], int(v["block"]), int(v["bytes"])) for k, v in d.get("ggml_types", {}).items()}
        return cls(str(d.get("source", "")), archs, types)


def load_facts(share_dir: str | Path = DEFAULT_SHARE) -> EngineFacts | None:
    """The engine build's facts from its share/kiln directory; None when it ships none."""
    path = Path(share_dir) / FACTS_FILE
    if not path.is_file():
        return None
    return EngineFacts.from_dict(json.loads(path.read_text(encoding="utf-8")))


# -- the check ---------------------------------------------------------------------------------
def check_model(path: str | Path, facts: EngineFacts | None, *, draft: str | Path | None = None,
                kv_overrides: Iterable[str] = ()) -> list[ModelProblem]:
    """Every reason this engine build would refuse the model (and the draft model, when given).

    kv_overrides: keys a rung's `--override-kv` supplies (engines.llamacpp.kv_override_keys): they
    stand in for a missing key that llama.cpp reads with get_key."""
    problems = _check_one(Path(path), facts, set(kv_overrides))
    if draft is not None:
        problems += [dataclasses.replace(p, role="draft") for p in _check_one(Path(draft), facts, set())]
    return problems


def failure(problems: Sequence[ModelProblem], rung: str | None = None) -> Failure:
    """The terminal failure /status shows for a refused model."""
    return Failure(FailureClass.MODEL_INCOMPATIBLE, " | ".join(str(p) for p in problems), rung=rung)


def _check_one(path: Path, facts: EngineFacts | None, overrides: set[str]) -> list[ModelProblem]:
    try:
        first = read_header(path)
    except FileNotFoundError:
        return [ModelProblem(str(path), "unreadable", "the model file does not exist",
                             "fetch the model again, or correct model.source / model.entry")]
    except (GGUFError, OSError) as e:
        return [ModelProblem(str(path), "unreadable", f"the GGUF header cannot be read ({e})",
                             "the file is not a GGUF model or ends inside its header: download it again")]
    headers, problems = _splits(first)
    if headers is None:
        return problems                # not a first shard: its header has no model to judge
    for h in headers:
        problems += _bounds(h, facts)
    if facts is not None:
        problems += _names(first, headers, facts, overrides)
    return problems


def _splits(first: FileHeader) -> tuple[list[FileHeader] | None, list[ModelProblem]]:
    """Every shard's header (None when `first` is not a model's first file); the problems llama.cpp's
    loader would raise about the split."""
    n_split = int(first.metadata.get("split.count", 0) or 0)
    if n_split <= 1:
        return [first], []
    f = str(first.path)
    if int(first.metadata.get("split.no", -1)) != 0:
        return None, [ModelProblem(f, "missing_split",
                                      f"illegal split file idx: {first.metadata.get('split.no')} (file: {f}), "
                                      "model must be loaded with the first split",
                                      "point model.entry at the -00001-of-NNNNN.gguf shard")]
    m = _SPLIT.match(first.path.name)
    if not m or int(m.group("n")) != n_split:
        return None, [ModelProblem(f, "missing_split", f"invalid split file name: {f} (split.count is {n_split})",
                                      f"keep the shards' names as published: <name>-00001-of-{n_split:05d}.gguf")]
    headers, problems = [first], []
    for i in range(2, n_split + 1):
        p = first.path.with_name(f"{m.group('stem')}-{i:05d}-of-{n_split:05d}.gguf")
        try:
            h = read_header(p)
        except FileNotFoundError:
            problems.append(ModelProblem(str(p), "missing_split",
                                         f"failed to load GGUF split from {p}: the shard is missing",
                                         f"download every shard ({n_split}) into {first.path.parent}"))
            continue
        except (GGUFError, OSError) as e:
            problems.append(ModelProblem(str(p), "missing_split", f"failed to load GGUF split from {p} ({e})",
                                         "download that shard again"))
            continue
        if int(h.metadata.get("split.no", -1)) != i - 1:
            problems.append(ModelProblem(str(p), "missing_split", f"invalid split file idx: "
                                         f"{h.metadata.get('split.no')} (file: {p}), expected {i - 1}",
                                         "the shards come from different models: download them again"))
        headers.append(h)
    expected = first.metadata.get("split.tensors.count")
    found = sum(len(h.tensors) for h in headers)
    if not problems and expected is not None and int(expected) != found:
        problems.append(ModelProblem(f, "missing_split", f"corrupted model: {expected} tensors expected but "
                                     f"{found} found", "download every shard again"))
    return headers, problems


def _bounds(h: FileHeader, facts: EngineFacts | None) -> list[ModelProblem]:
    problems: list[ModelProblem] = []
    past = [t.name for t in h.past_end()]
    if past:
        problems.append(ModelProblem(
            str(h.path), "truncated",
            f"tensor '{past[0]}' data is not within the file bounds, model is corrupted or incomplete "
            f"({len(past)} tensor(s) end past the file's {h.size} bytes)",
            "the file is truncated (an interrupted download or copy): download it again"))
    if facts is not None and facts.ggml_types:
        unknown = [f"{t.name} (type {t.ggml_type})" for t in h.tensors if t.ggml_type not in facts.ggml_types]
        if unknown:
            problems.append(ModelProblem(
                str(h.path), "unknown_type", f"{len(unknown)} tensor(s) have a ggml type this build does not know, "
                f"e.g. {unknown[0]}", "use a quantisation this llama.cpp supports, or an image with a newer engine"))
    return problems


def _names(first: FileHeader, headers: list[FileHeader], facts: EngineFacts,
           overrides: set[str]) -> list[ModelProblem]:
    f = str(first.path)
    arch = first.architecture
    problems: list[ModelProblem] = []
    known = facts.architectures.get(arch)
    prefix = arch
    if known is None:
        near = _nearest_arch(arch, facts.architectures)
        hint = f" (did you mean '{near}'?)" if near else ""
        fix = (f"set general.architecture to '{near}' and rename every '{arch}.*' key to '{near}.*', or {CONVERT_FIX}"
               if near else CONVERT_FIX + ", or use an image whose engine supports it")
        problems.append(ModelProblem(f, "unknown_architecture",
                                     f"unknown model architecture: '{arch}'{hint}", fix))
        if near is None:
            return problems
        # Judge the rest against the nearest architecture too: the field notes found each next blocker
        # only after fixing the previous one, one boot each.
        known = facts.architectures[near]
        prefix = near
    problems += _keys(first, arch, prefix, known, overrides)
    problems += _tensors(f, headers, prefix, known)
    return problems


def _nearest_arch(arch: str, archs: dict[str, ArchFacts]) -> str | None:
    if not arch:
        return None
    stems = [a for a in archs if arch.startswith(a + "-") or arch.startswith(a + "_")]
    if stems:
        return max(stems, key=len)            # 'dflash-draft' -> 'dflash'
    hits = difflib.get_close_matches(arch, list(archs), n=1, cutoff=0.6)
    return hits[0] if hits else None


def _keys(h: FileHeader, arch: str, prefix: str, known: ArchFacts, overrides: set[str]) -> list[ModelProblem]:
    problems: list[ModelProblem] = []
    for req in known.required_keys:
        key = req["key"]
        # A file still named after another architecture carries its keys under that name.
        key_in_file = arch + key[len(prefix):] if key.startswith(prefix + ".") else key
        if req["read"] == "get_arr":
            present = key_in_file in h.arrays
        else:
            # --override-kv stands in for a missing key only where llama.cpp reads it with get_key
            # (get_key_or_arr looks the key up in the file first and throws).
            present = h.has(key_in_file) or (req["read"] == "get_key" and key_in_file in overrides)
        if present:
            continue
        what = "array key" if req["read"] == "get_arr" else "key"
        message = req.get("message") or f"{what} not found in model: {key}"
        if req.get("message"):
            message += f" (the array key {key})"
        problems.append(ModelProblem(str(h.path), "missing_key", message,
                                     f"add {key} to the GGUF metadata, or {CONVERT_FIX} (it writes the key)"))
    return problems


def _tensors(f: str, headers: list[FileHeader], arch: str, known: ArchFacts) -> list[ModelProblem]:
    bad = [t.name for h in headers for t in h.tensors if not known.knows(t.name)]
    if not bad:
        return []
    first = bad[0]
    near = _nearest_tensor(first, known.tensors)
    hint = f" (llama.cpp expects names like '{near}')" if near else ""
    return [ModelProblem(
        f, "unknown_tensor",
        f"{len(bad)} tensor name(s) are not tensors of architecture '{arch}' in this build, e.g. "
        f"'{first}'{hint}; the engine fails with \"wrong number of tensors\"",
        f"rename the tensors to llama.cpp's names, or {CONVERT_FIX}")]


def _nearest_tensor(name: str, templates: Sequence[str]) -> str | None:
    """'dflash.dspark.markov.w1.weight' -> 'markov_w1.weight'."""
    base, dot, suffix = name.rpartition(".")
    if not dot or suffix not in ("weight", "bias", "scale"):
        base, suffix = name, ""
    layer = re.search(r"\d+", base)
    concrete = {t.replace("{bid}", layer.group(0) if layer else "0").replace("{xid}", "0"): t for t in templates}
    norm = re.sub(r"[._]", "_", base)
    ends = [c for c in concrete if norm.endswith(re.sub(r"[._]", "_", c))]
    pick = max(ends, key=len) if ends else None
    if pick is None:
        hits = difflib.get_close_matches(base, list(concrete), n=1, cutoff=0.5)
        pick = hits[0] if hits else None
    if pick is None:
        return None
    return pick + (f".{suffix}" if suffix else "")


# -- `python -m supervisor check-model` -----------------------------------------------------------
EXIT_REFUSED = 2


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("check-model", help="check a GGUF model (and a draft) against the engine build; exit 0 or 2")
    p.add_argument("file")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--target", metavar="T", help="in a checkout: the facts of target T's pinned engine "
                       "(images/engine-facts/)")
    where.add_argument("--facts", metavar="FILE", help="an engine facts file (images/engine-facts/*.json, or an "
                       f"image's {FACTS_FILE})")
    where.add_argument("--engine-share", metavar="DIR", help=f"an engine's share/kiln directory holding {FACTS_FILE}")
    p.add_argument("--draft", help="a speculative draft model the rung names (-md)")
    p.add_argument("--strict", action="store_true",
                   help="exit 2 when the architecture, keys and tensor names could not be checked (no engine facts)")
    p.epilog = (f"Without --target/--facts/--engine-share: this image's facts ({DEFAULT_SHARE}/{FACTS_FILE}), else "
                "the checkout's when it holds exactly one set.")


def main(args: argparse.Namespace) -> int:
    """Problems go to stderr (exit 2). What was checked goes to stdout: `ok` only when the engine's
    facts were there; without them it says what was NOT checked (--strict: exit 2), as check-config
    does for flags, so a script cannot mistake an unchecked file for a good one."""
    from .facts_source import choose

    found = choose(facts=args.facts, engine_share=args.engine_share, target=args.target)
    if found.error:
        print(f"check-model: {found.error}", file=sys.stderr)
        return EXIT_REFUSED
    facts = None
    if found.path is not None:
        try:
            facts = EngineFacts.from_dict(json.loads(found.path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            print(f"check-model: {found.where}: the facts cannot be read ({type(e).__name__}: {e})", file=sys.stderr)
            return EXIT_REFUSED
    problems = check_model(args.file, facts, draft=args.draft)
    names = ", ".join([args.file] + ([args.draft] if args.draft else []))
    unchecked = (f"architecture, keys and tensor names NOT checked ({found.where}); checked: the file's splits and "
                 "size only") if facts is None else ""
    if problems:
        print(f"{len(problems)} problem(s): this llama.cpp build would refuse the model"
              if facts is not None else f"{len(problems)} problem(s): no llama.cpp build would load the model",
              file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        if unchecked:
            print(f"  ({unchecked})", file=sys.stderr)
        return EXIT_REFUSED
    if facts is None:
        print(f"{names}: {unchecked}")
        if args.strict:
            print(f"check-model: {names}: not fully checked (--strict): {found.where}", file=sys.stderr)
            return EXIT_REFUSED
        return 0
    print(f"{names}: ok (engine facts: {facts.source}, from {found.where})")
    return 0
