"""Probe sets per model family: a prompt, what a right answer looks like, and how much a wrong
one matters.

Severity decides what a failure does:
- fatal:  the selftest fails (code exactness at temperature 0: any difference between
          speculative and plain decoding is a bug, and the field notes saw n-gram speculation write
          `return a -b):` for `return a - b`; a tool-calling target that makes no calls);
- scored: counted; at least [selftest] min_probe_pass of the scored probes must pass;
- info:   reported, never decides (French on a Width50 build: a known weakness).

Every probe runs greedy at temperature 0, whatever the server's sampler defaults, and every
reply goes through the degeneracy detector: a loop that happens to contain "Tokyo" fails.
`smollm2` holds questions SmolLM2-135M-Instruct does answer right (checked against the real
model on llama-server: it is "loosely right" and misses, for one, the capital of France).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from . import degeneracy
from .lexicon import FRENCH_COMMON, FRENCH_FUNCTION, cjk_ratio

FATAL, SCORED, INFO = "fatal", "scored", "info"
SEVERITIES = (FATAL, SCORED, INFO)

CHAT, COMPLETION, TOOLS = "chat", "completion", "tools"
# Share of a French reply's words outside lexicon.FRENCH_COMMON that fails it. Well-formed
# paragraphs measured 27-34% unknown (the list is small), word salad 44% and up: too close to
# judge on, so only a reply that is mostly unknown fails; the unknown words are always listed
# so a person sees "cunce" at a glance. No dictionary ships in the image; loops, English
# instead of French and elisions before a consonant ("s'fotrenci") are what fail reliably.
FRENCH_UNKNOWN_MAX = 0.5

# The tool-call probe: the field notes' check on Qwen3-Coder and Kimi-Linear (two parallel calls,
# correct arguments, finish_reason "tool_calls").
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for one city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                       "required": ["city"]},
    },
}


@dataclass(frozen=True)
class Outcome:
    passed: bool
    reason: str
    verdict: degeneracy.Degeneracy | None = None


@dataclass(frozen=True)
class Probe:
    name: str
    prompt: str
    expect: tuple[str, ...] = ()             # regexes (case-insensitive): all must match
    reject: tuple[str, ...] = ()             # regexes: none may match
    mode: str = CHAT                         # chat | completion (raw continuation) | tools
    severity: str = SCORED
    text: str = "prose"                      # how the detector reads the reply: prose | code
    max_tokens: int = 64
    judge: Callable[["Probe", str, dict[str, Any]], Outcome] | None = field(default=None, compare=False)
    note: str = ""

    def request(self) -> dict[str, Any]:
        """The probe's own request fields (the runner adds greedy sampling and the model)."""
        if self.mode == COMPLETION:
            return {"prompt": self.prompt, "max_tokens": self.max_tokens}
        msgs = [{"role": "user", "content": self.prompt}]
        if self.mode == TOOLS:
            return {"messages": msgs, "max_tokens": self.max_tokens, "tools": [WEATHER_TOOL],
                    "tool_choice": "auto", "parallel_tool_calls": True}
        return {"messages": msgs, "max_tokens": self.max_tokens}

    def evaluate(self, text: str, extra: dict[str, Any] | None = None) -> Outcome:
        """Judge a reply: `text` is its content, `extra` carries finish_reason and tool_calls."""
        extra = extra or {}
        if self.judge is not None:
            return self.judge(self, text, extra)
        return expect_patterns(self, text, extra)


def expect_patterns(probe: Probe, text: str, extra: dict[str, Any]) -> Outcome:
    verdict = degeneracy.check(text, kind=probe.text)
    if verdict.degenerate:
        return Outcome(False, "degenerate: " + "; ".join(verdict.reasons), verdict)
    if not text.strip():
        return Outcome(False, f"empty reply (finish_reason {extra.get('finish_reason')!r})", verdict)
    missing = [p for p in probe.expect if not re.search(p, text, re.I | re.M)]
    if missing:
        return Outcome(False, f"expected /{missing[0]}/ in the reply", verdict)
    bad = [p for p in probe.reject if re.search(p, text, re.I | re.M)]
    if bad:
        return Outcome(False, f"the reply matches /{bad[0]}/, which a right answer never does", verdict)
    return Outcome(True, "ok", verdict)


def judge_french(probe: Probe, text: str, extra: dict[str, Any]) -> Outcome:
    """Fluent French: not degenerate, French function words present, most words known."""
    verdict = degeneracy.check(text, kind="prose")
    if verdict.degenerate:
        return Outcome(False, "degenerate: " + "; ".join(verdict.reasons), verdict)
    tokens = [t.replace("’", "'") for t in re.findall(r"[^\W\d_]+['’]?", text.lower())]
    if len(tokens) < 8:
        return Outcome(False, f"too short for a paragraph ({len(tokens)} words)", verdict)
    function_share = sum(1 for t in tokens if t in FRENCH_FUNCTION) / len(tokens)
    unknown_ratio, unknown = degeneracy.unknown_words(text, FRENCH_COMMON)
    shape_bad = [w for w in text.split() if not degeneracy.is_word_shaped(w) and any(c.isalpha() for c in w)]
    if function_share < 0.2:
        return Outcome(False, f"not French: {function_share:.0%} French function words", verdict)
    if shape_bad:
        return Outcome(False, f"non-words: {', '.join(repr(w) for w in shape_bad[:5])}", verdict)
    if unknown_ratio > FRENCH_UNKNOWN_MAX:
        return Outcome(False, f"{unknown_ratio:.0%} of the words are unknown: "
                              f"{', '.join(repr(w) for w in list(dict.fromkeys(unknown))[:6])}", verdict)
    return Outcome(True, f"ok ({function_share:.0%} function words; unknown: "
                         f"{', '.join(list(dict.fromkeys(unknown))[:6]) or 'none'})", verdict)


def judge_chinese(probe: Probe, text: str, extra: dict[str, Any]) -> Outcome:
    verdict = degeneracy.check(text, kind="prose")
    if verdict.degenerate:
        return Outcome(False, "degenerate: " + "; ".join(verdict.reasons), verdict)
    cjk = sum(1 for c in text if "\u4e00" <= c <= "\u9fff")
    ratio = cjk_ratio(text)
    if cjk < 8 or ratio < 0.6:
        return Outcome(False, f"not a Chinese continuation: {cjk} CJK characters, {ratio:.0%} of the letters",
                       verdict)
    return Outcome(True, f"ok ({cjk} CJK characters)", verdict)


def judge_tools(probe: Probe, text: str, extra: dict[str, Any]) -> Outcome:
    """Two parallel get_weather calls, Paris and Tokyo, JSON arguments, finish_reason tool_calls."""
    calls = extra.get("tool_calls") or []
    finish = extra.get("finish_reason")
    if not calls:
        return Outcome(False, f"no tool calls (finish_reason {finish!r}; the reply said {text[:80]!r})")
    cities: list[str] = []
    for c in calls:
        fn = c.get("function") or {}
        if fn.get("name") != "get_weather":
            return Outcome(False, f"called {fn.get('name')!r}, not get_weather")
        try:
            args = json.loads(fn.get("arguments") or "")
        except ValueError:
            return Outcome(False, f"arguments are not JSON: {fn.get('arguments')!r}")
        if not isinstance(args, dict) or not isinstance(args.get("city"), str):
            return Outcome(False, f"arguments lack a city: {fn.get('arguments')!r}")
        cities.append(args["city"].strip().lower())
    if sorted(cities) != ["paris", "tokyo"]:
        return Outcome(False, f"expected one call each for Paris and Tokyo, got {cities}")
    if finish != "tool_calls":
        return Outcome(False, f"finish_reason {finish!r}, expected 'tool_calls'")
    return Outcome(True, "ok (2 parallel calls)")


# -- the probes ----------------------------------------------------------------------------------

TRAIN_RIGHT = (r"3\s*(h|hours?|hrs?)\.?,?\s*(and\s*)?30\s*(m|min|mins|minutes?)\b|3[.,]5\s*(h|hours?)\b"
               r"|three and a half hours|three hours and thirty minutes|210\s*minutes")

CODE_ADD = Probe(
    "code-add", "Write a Python function add(a, b) that returns the sum of a and b. Reply with only the code.",
    expect=(r"def add\(\s*a\s*,\s*b\s*\)\s*:", r"^\s*return a \+ b\s*$"),
    reject=(r"return a\s*[-+]\s*\w*\)",),
    severity=FATAL, text="code", max_tokens=96,
    note="code exactness at temperature 0 (the field notes' speculation bug wrote `return a -b):`)")
TOOL_CALL = Probe(
    "tool-call", "What is the weather in Paris and in Tokyo right now? Use the get_weather tool, once per city.",
    mode=TOOLS, severity=FATAL, max_tokens=256, judge=judge_tools,
    note="two parallel calls, correct arguments, finish_reason tool_calls")

GENERIC = (
    Probe("capital-japan", "What is the capital of Japan? Answer in one word.", expect=(r"\bTokyo\b",)),
    Probe("arithmetic", "What is 12 + 30? Reply with the number only.", expect=(r"\b42\b",)),
    Probe("train-duration", "A train leaves at 14:00 and arrives at 17:30 the same day. How long is the trip?",
          expect=(TRAIN_RIGHT,), max_tokens=96),
    Probe("days-in-week", "How many days are in a week? Answer with a number.", expect=(r"\b(7|seven)\b",)),
    CODE_ADD,
)

SMOLLM2 = (
    Probe("capital-japan", "What is the capital of Japan?", expect=(r"\bTokyo\b",)),
    Probe("two-plus-two", "What is 2+2?", expect=(r"\b(4|four)\b",)),
    Probe("dog-legs", "How many legs does a dog have?", expect=(r"\b(4|four)\b",), reject=(r"\b(3|5|three|five)\b",)),
    Probe("opposite-hot", "What is the opposite of hot?", expect=(r"\bcold\b",)),
    Probe("days-in-week", "How many days are in a week?", expect=(r"\b(7|seven)\b",)),
    Probe("ten-times-three", "What is 10 times 3?", expect=(r"\b30\b",)),
    Probe("first-month", "Name the first month of the year.", expect=(r"\bJanuary\b",)),
    CODE_ADD,
)

# The field notes' probes on Kimi-K3 (field notes § "Output quality and sampler"), as they ran them:
# raw continuations where it quoted a prompt, chat where it quoted a question.
KIMI_K3 = (
    Probe("capital-japan", "The capital of Japan is", mode=COMPLETION, expect=(r"\bTokyo\b",), max_tokens=24),
    Probe("train-duration", "A train leaves at 14:00 and arrives at 17:30. How long does the trip take?",
          expect=(TRAIN_RIGHT,), max_tokens=96),
    Probe("code-invert", "def invert(d):\n", mode=COMPLETION, severity=FATAL, text="code", max_tokens=48,
          expect=(r"return\s*\{\s*(\w+)\s*:\s*(\w+)\s+for\s+\2\s*,\s*\1\s+in\s+d\.items\(\)\s*\}",),
          note="code exactness: a dict comprehension swapping keys and values"),
    Probe("code-fibonacci", "def fibonacci(n):\n", mode=COMPLETION, text="code", max_tokens=64,
          expect=(r"fibonacci\(\s*n\s*-\s*1\s*\)\s*\+\s*fibonacci\(\s*n\s*-\s*2\s*\)",),
          reject=(r"\(n\s*-\s*1\s*\(",), note="the field notes' corrupted form was fibonacci(n-1(n-1)"),
    Probe("chinese-continuation", "春天来了，", mode=COMPLETION, max_tokens=48, judge=judge_chinese,
          note="Moonshot's other strong language: continues fluently in Chinese"),
    Probe("french-knowledge", "La Révolution française a commencé en", mode=COMPLETION, expect=(r"\b1789\b",),
          max_tokens=16, note="French knowledge survives on Width50"),
    Probe("french-free-form", "Écris un court paragraphe en français sur la ville de Paris.", severity=INFO,
          judge=judge_french, max_tokens=128,
          note="known weakness of Width50 builds (moe_intermediate_size halved): non-words such as "
               "'cunce', 's'fotrenci'; reported, not fatal"),
)

FRENCH_FLUENT = Probe("french-free-form", "Écris un court paragraphe en français sur la ville de Paris.",
                      judge=judge_french, max_tokens=128)

SETS: dict[str, tuple[Probe, ...]] = {
    "generic": GENERIC,
    "smollm2": SMOLLM2,
    "kimi-k3": KIMI_K3,
    # The field notes measured both on vLLM: French fluent / correct, code correct without speculation.
    "kimi-linear": GENERIC + (FRENCH_FLUENT, dataclasses.replace(KIMI_K3[3], severity=FATAL)),
    "qwen3-coder": GENERIC + (FRENCH_FLUENT,),
}


def probe_set(name: str, *, tools: bool = False) -> tuple[str, tuple[Probe, ...], str | None]:
    """(set used, probes, note): an unknown family falls back to "generic", said out loud."""
    note = None
    if name not in SETS:
        note = f"no probe set for family {name!r}: using 'generic' ({', '.join(sorted(SETS))} exist)"
        name = "generic"
    probes = SETS[name] + ((TOOL_CALL,) if tools else ())
    return name, probes, note
