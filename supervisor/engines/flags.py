"""The engine's flag snapshot: its own `--help`, captured when the image is built.

Every rung of every deploy config is linted against it before launch, so a
flag the engine does not know costs a lint message, not a crash loop (the
field notes' `--draft-max`, removed upstream, and vLLM 0.27's removed
`--disable-log-requests`, which "crash-loops the server").
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]          # every spelling the help shows: ("-c", "--ctx-size")
    takes_value: bool
    env: str | None = None          # LLAMA_ARG_* where the engine reads it from the environment
    removed: str | None = None      # the engine's own "removed, use X" text
    choices: tuple[str, ...] | None = None   # argparse {a,b,c} choices, when the engine lists them
    hidden: tuple[str, ...] = ()    # spellings the parser accepts but the help does not show
    # What an upgrade's flag diff reads; not what the lint compares (a GPU prints another default of
    # --compilation-config than a CPU does: the same flag to the parser).
    default: str | None = field(default=None, compare=False)   # the help's "(default: X)", if printed
    description: str = field(default="", compare=False)        # the help text, its lines joined


@dataclass(frozen=True)
class FlagSnapshot:
    flags: tuple[Flag, ...]
    source: str = "<memory>"
    by_name: dict[str, Flag] = field(default_factory=dict, compare=False, repr=False)
    by_env: dict[str, Flag] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for f in self.flags:
            for n in (*f.names, *f.hidden):
                self.by_name.setdefault(n, f)
            if f.env:
                self.by_env.setdefault(f.env, f)

    def get(self, name: str) -> Flag | None:
        return self.by_name.get(name)

    def nearest(self, name: str) -> str | None:
        live = [n for f in self.flags if not f.removed for n in f.names if n.startswith("--")]
        hits = difflib.get_close_matches(name, live, n=1, cutoff=0.6)
        return hits[0] if hits else None


# llama.cpp's usage lines: "-c,    --ctx-size N      description ... (env: LLAMA_ARG_CTX_SIZE)"
_LLAMA_OPT = re.compile(r"^(-[^ ].*?)(?:\s{2,}(.*))?$")
_ENV = re.compile(r"\(env: ([A-Z0-9_]+)\)")
_REMOVED = re.compile(r"the argument has been removed\.\s*(.*)")


def parse_llama_help(text: str, source: str = "<memory>") -> FlagSnapshot:
    """Parse llama-server's `--help` (options start at column 0; descriptions wrap indented)."""
    entries: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("-"):
            # "-t,    --threads N    desc": close the gaps after commas, then the
            # first run of 2+ spaces separates the flags from the description.
            m = _LLAMA_OPT.match(re.sub(r",\s+", ", ", line.rstrip()))
            if not m:
                continue
            entries.append((m.group(1), [m.group(2) or ""]))
        elif entries and line.startswith(" ") and line.strip():
            entries[-1][1].append(line.strip())
        elif not line.strip():
            continue
        else:
            # a section heading ("----- common params -----") ends the previous entry
            entries.append(("", []))
    flags: list[Flag] = []
    for head, desc_lines in entries:
        if not head:
            continue
        names: list[str] = []
        takes_value = False
        for part in head.split(","):
            tokens = part.strip().split()
            if not tokens or not tokens[0].startswith("-"):
                continue
            names.append(tokens[0])
            if len(tokens) > 1:
                takes_value = True
        desc = " ".join(desc_lines)
        env = _ENV.search(desc)
        removed = _REMOVED.search(desc)
        removed_text = None
        if removed:
            removed_text = _ENV.sub("", removed.group(1)).strip() or "removed"
        if names:
            flags.append(Flag(tuple(names), takes_value, env.group(1) if env else None, removed_text,
                              default=_default(_ENV.sub("", desc)), description=desc))
    return FlagSnapshot(tuple(flags), source)


def _default(description: str) -> str | None:
    """The last "(default: X)" of a help text, X with its own parentheses: "(default: F(a=(1, 2)))"."""
    at = description.rfind("(default: ")
    if at < 0:
        return None
    depth, start = 0, at + len("(default: ")
    for i in range(start, len(description)):
        c = description[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                return description[start:i].strip()
            depth -= 1
    return description[start:].strip()


def load_llama_snapshot(path: str | Path) -> FlagSnapshot:
    p = Path(path)
    return parse_llama_help(p.read_text(encoding="utf-8", errors="replace"), str(p))


# vLLM's argparse help: "  --max-model-len MAX_MODEL_LEN", "  --enforce-eager, --no-enforce-eager",
# "  --tool-call-parser {a,b,...} or name registered in --tool-parser-plugin", descriptions after
# two or more spaces or on the following, deeper-indented lines.
_ARGPARSE_OPT = re.compile(r"^  (-\S.*?)(?:\s{2,}(.*))?$")
_CHOICES = re.compile(r"\{([^}]*)\}")
_DESCRIPTION = re.compile(r"^ {4,}\S")


def parse_argparse_help(text: str, source: str = "<memory>") -> FlagSnapshot:
    entries: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        m = _ARGPARSE_OPT.match(line.rstrip())
        if m:
            entries.append((m.group(1), [m.group(2) or ""]))
        elif entries and entries[-1][0] and _DESCRIPTION.match(line):
            entries[-1][1].append(line.strip())
        elif line.strip():
            entries.append(("", []))      # a group heading or its text ends the flag before it
    flags: list[Flag] = []
    for head, desc_lines in entries:
        if not head:
            continue
        names: list[str] = []
        takes_value = False
        choices: tuple[str, ...] | None = None
        for part in head.split(", "):
            tokens = part.strip().split(" ", 1)
            if not tokens[0].startswith("-"):
                continue
            names.append(tokens[0])
            if len(tokens) > 1:
                takes_value = True
                c = _CHOICES.search(tokens[1])
                if c:
                    choices = tuple(x for x in c.group(1).split(",") if x)
        if names:
            desc = " ".join(x for x in desc_lines if x)
            flags.append(Flag(tuple(names), takes_value, choices=choices, default=_default(desc),
                              hidden=_hidden_negatives(names), description=desc))
    return FlagSnapshot(tuple(flags), source)


def _hidden_negatives(names: list[str]) -> tuple[str, ...]:
    """What vLLM >= 0.33's EnableDisableAction accepts without showing it: a flag shown as
    `--enable-X, --disable-X` still takes `--no-enable-X` (the old BooleanOptionalAction negative), one
    shown as `--disable-X, --enable-X` takes `--no-disable-X` (vllm/utils/argparse_utils.py; checked
    against the real 0.33.0 parser's option strings: exactly these 50, docs/research/
    vllm-0.27.1-to-0.33.0-flags.md). A help without such pairs (0.27.1 and older) gets none."""
    for i, first in enumerate(names):
        for prefix, other in (("--enable-", "--disable-"), ("--disable-", "--enable-")):
            if first.startswith(prefix) and other + first[len(prefix):] in names[i + 1:]:
                return ("--no-" + first[2:],)
    return ()


def load_argparse_snapshot(path: str | Path) -> FlagSnapshot:
    p = Path(path)
    return parse_argparse_help(p.read_text(encoding="utf-8", errors="replace"), str(p))
