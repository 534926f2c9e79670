"""What an engine's flags did between two versions, read off the two flag snapshots (each the engine's
own `--help`, as images are built with it) and nothing else: no guessing from names.

    removed     spelled in the old help, rejected by the new parser. The replacement is the new help's
                own "removed, use X" (llama.cpp prints it), else the engine's table of removals with the
                changelog's words (supervisor/engines: vllm.REMOVED, llamacpp.KNOWN_RENAMES), else
                another spelling of the same flag the new parser still takes, else "none named"
    renamed     still accepted, no longer shown: vLLM 0.33 shows `--disable-X` where it showed
                `--no-enable-X` and takes both
    added       accepted by the new parser, rejected by the old (with every spelling)
    defaults    both helps print a default and they differ (a help that prints none says nothing: vLLM
                0.27.1's Frontend flags printed no default, 0.33.0's do, and that is not a change);
                the JSON config options (--compilation-config ...) are listed apart: their printed
                default is a whole object
    choices     values an {a,b,c} list lost or gained; a list the new help no longer prints
    deprecated  the new help says "deprecated" where the old did not
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

_USE = re.compile(r"\buse (-[\w-]+(?: or -[\w-]+)*)", re.I)
_CONFIG_DEFAULT = re.compile(r"^(\{|\[\{|[A-Z]\w*Config\()")


@dataclass(frozen=True)
class Change:
    flag: str
    detail: str


@dataclass
class FlagDiff:
    old_version: str
    new_version: str
    old_source: str
    new_source: str
    removed: list[Change] = field(default_factory=list)
    renamed: list[Change] = field(default_factory=list)
    added: list[Change] = field(default_factory=list)
    defaults: list[tuple[str, str, str]] = field(default_factory=list)       # flag, old, new
    config_defaults: list[str] = field(default_factory=list)
    choices: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = field(default_factory=list)   # flag, lost, gained
    choices_unlisted: list[str] = field(default_factory=list)
    deprecated: list[Change] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def replacement(self, flag: str) -> str | None:
        """The fix for a removed spelling (None when the flag was not removed)."""
        return next((c.detail for c in self.removed if c.flag == flag), None)

    def lost_values(self, flag_names: tuple[str, ...]) -> tuple[str, ...]:
        return next((lost for f, lost, _ in self.choices if f in flag_names), ())

    @property
    def changed(self) -> bool:
        return bool(self.removed or self.renamed or self.added or self.defaults or self.config_defaults
                    or self.choices or self.choices_unlisted or self.deprecated)


def _label(flag: Any) -> str:
    return ", ".join(flag.names)


def _norm(value: str) -> str:
    return re.sub(r"\s+", "", value)


def diff(old: Any, new: Any, *, old_version: str, new_version: str,
         known: Mapping[str, str] | None = None) -> FlagDiff:
    """old, new: FlagSnapshots (supervisor/engines/flags.py); known: flag -> what to do instead, the
    engine's own table of removals."""
    known = known or {}
    d = FlagDiff(old_version, new_version, old.source, new.source)
    d.counts = {"old_flags": len(old.flags), "old_spellings": sum(len(f.names) for f in old.flags),
                "new_flags": len(new.flags), "new_spellings": sum(len(f.names) for f in new.flags),
                "new_hidden": sum(len(f.hidden) for f in new.flags)}
    for f in old.flags:
        if f.removed:
            continue                      # already removed in the old version: no change
        for name in f.names:
            now = new.get(name)
            if now is None:
                d.removed.append(Change(name, _fix(name, f, new, known, new_version)))
            elif now.removed:
                d.removed.append(Change(name, f"the {new_version} help says: {now.removed}"))
            elif name in now.hidden:
                d.renamed.append(Change(name, "still accepted, not shown: the help shows it as "
                                        + _shown_as(name, now)))
    for f in new.flags:
        if f.removed:
            continue
        fresh = [n for n in f.names if old.get(n) is None]
        if fresh:
            kept = [n for n in f.names if n not in fresh]
            note = f"beside {', '.join(kept)} (the same flag)" if kept else ""
            d.added.append(Change(", ".join(fresh), note or _first_sentence(f.description)))
        was = next((old.get(n) for n in f.names if old.get(n) is not None), None)
        if was is None or was.removed:
            continue
        if was.default is not None and f.default is not None and _norm(was.default) != _norm(f.default):
            if _CONFIG_DEFAULT.match(f.default) or _CONFIG_DEFAULT.match(was.default):
                d.config_defaults.append(_label(f))
            else:
                d.defaults.append((_label(f), was.default, f.default))
        if was.choices and f.choices and set(was.choices) != set(f.choices):
            d.choices.append((_label(f), tuple(c for c in was.choices if c not in f.choices),
                              tuple(c for c in f.choices if c not in was.choices)))
        elif was.choices and not f.choices:
            d.choices_unlisted.append(_label(f))
        if "deprecated" in f.description.lower() and "deprecated" not in was.description.lower():
            d.deprecated.append(Change(_label(f), _sentence_with(f.description, "deprecated")))
    for changes in (d.removed, d.renamed, d.added, d.deprecated):
        changes.sort(key=lambda ch: ch.flag.lstrip("-"))
    d.defaults.sort()
    d.choices.sort()
    return d


def _shown_as(name: str, now: Any) -> str:
    """The spelling the help shows for a hidden one: `--disable-X` for `--no-enable-X`, and back."""
    bare = "--" + name.removeprefix("--no-")
    for a, b in (("--enable-", "--disable-"), ("--disable-", "--enable-")):
        if bare.startswith(a) and b + bare[len(a):] in now.names:
            return b + bare[len(a):]
    return ", ".join(now.names)


def _fix(name: str, old_flag: Any, new: Any, known: Mapping[str, str], new_version: str) -> str:
    if name in known:
        return known[name]
    if old_flag.removed and _USE.search(old_flag.removed):
        return old_flag.removed
    other = next((new.get(n) for n in old_flag.names if n != name and new.get(n) is not None), None)
    if other is not None and not other.removed:
        return f"renamed: the same flag is now {', '.join(other.names)}"
    return (f"not in {new_version}'s parser, and neither its help nor Kiln's table of removals names a "
            "replacement: remove it")


def _first_sentence(text: str, limit: int = 110) -> str:
    s = re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0] if text else ""
    return s if len(s) <= limit else s[:limit - 1].rstrip() + "…"


def _sentence_with(text: str, word: str, limit: int = 200) -> str:
    for s in re.split(r"(?<=[.!?])\s", text):
        if word in s.lower():
            return s if len(s) <= limit else s[:limit - 1].rstrip() + "…"
    return _first_sentence(text, limit)


# -- the report ---------------------------------------------------------------------------------------
def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(d: FlagDiff) -> list[str]:
    """The diff as Markdown lines (a section of `upgrade`'s report)."""
    c = d.counts
    out = [f"{d.old_version}: {c['old_flags']} flags, {c['old_spellings']} spellings shown. "
           f"{d.new_version}: {c['new_flags']} flags, {c['new_spellings']} spellings shown"
           + (f" and {c['new_hidden']} accepted but not shown." if c["new_hidden"] else "."), ""]
    out += [f"### Removed: the {d.new_version} parser rejects them ({len(d.removed)})", ""]
    if d.removed:
        out += ["| flag | replacement |", "|---|---|"]
        out += [f"| `{ch.flag}` | {_cell(ch.detail)} |" for ch in d.removed]
    else:
        out.append("None.")
    out += ["", f"### Renamed: still accepted, no longer shown ({len(d.renamed)})", ""]
    out += [f"- `{ch.flag}`: {ch.detail}" for ch in d.renamed] or ["None."]
    out += ["", f"### Defaults changed ({len(d.defaults)})", ""]
    if d.defaults:
        out += ["| flag | " + d.old_version + " | " + d.new_version + " |", "|---|---|---|"]
        out += [f"| `{f}` | `{_cell(_short(a))}` | `{_cell(_short(b))}` |" for f, a, b in d.defaults]
    else:
        out.append("None.")
    if d.config_defaults:
        out += ["", "JSON config options whose printed default (a whole object) changed: "
                + ", ".join(f"`{f}`" for f in d.config_defaults) + "."]
    out += ["", f"### Choices changed ({len(d.choices) + len(d.choices_unlisted)})", ""]
    out += [f"- `{f}`: " + "; ".join(x for x in (("lost " + ", ".join(f"`{v}`" for v in lost)) if lost else "",
                                                 ("gained " + ", ".join(f"`{v}`" for v in gained)) if gained else "")
                                     if x) for f, lost, gained in d.choices]
    out += [f"- `{f}`: its help no longer prints the choices as {{a,b,…}}: the parser no longer checks them "
            "at parse time (the engine may still refuse a value when it starts)" for f in d.choices_unlisted]
    if not d.choices and not d.choices_unlisted:
        out.append("None.")
    out += ["", f"### Deprecated in {d.new_version} (still accepted) ({len(d.deprecated)})", ""]
    out += [f"- `{ch.flag}`: {ch.detail}" for ch in d.deprecated] or ["None."]
    out += ["", f"### Added ({len(d.added)})", ""]
    out += [f"- `{ch.flag}`" + (f": {ch.detail}" if ch.detail else "") for ch in d.added] or ["None."]
    return out


def _short(value: str, limit: int = 60) -> str:
    return value if len(value) <= limit else value[:limit - 1] + "…"
