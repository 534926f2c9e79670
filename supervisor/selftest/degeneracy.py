"""Is this output degenerate? Repetition loops, symbol runs and non-words.

The field notes' 7.3 tok/s headline was measured on selftests, three of whose five prompts produced
repetition (`# [CS_ah]`, `et d'et d'`): a loop decodes cheap, so throughput measured on it is
void. Halving the experts gave `# # # #` after six tokens; a broken build wrote French
non-words ("cunce", "s'fotrenci"). Four signals, each cheap and language-agnostic:

- **loops**: a unit that spans a word boundary repeated back to back (`et d'et d'`,
  `the balcony of the balcony of the balcony`, a whole sentence again and again);
- **repeated n-grams**: share of words inside a word 4-gram that occurs 3+ times anywhere
  (loops that are not back to back: a paragraph, then the same paragraph after a line break);
- **symbol runs**: the same punctuation token repeated (`# # # #`, ` + + + +`);
- **non-word ratio** (prose only; code is full of `d.items()`): share of tokens that are not
  word-shaped (`[CS_ah]`, `grtwo=cj`), including French/Italian elisions before a consonant
  (`s'fotrenci`: `s'` only ever comes before a vowel or h).

Thresholds were set on real outputs (tests/fixtures/selftest/): SmolLM2-135M at temperature 0
loops on some prompts and not on others, and a random model loops at once.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

# A unit of 3..200 chars containing whitespace, repeated back to back at least once more.
_TANDEM = re.compile(r"(?=(\S[^\n]{1,198}?\s{0,4})\1)", re.S)
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*", re.U)
_STRIP = "\"'“”‘’«»()[]{}<>.,;:!?¿¡…*`"
_ELISION = re.compile(r"^(?:[cdjlmnst]|qu)['’](?P<next>.)", re.I)
_VOWELISH = set("aeiouyhàâäæéèêëîïôöœùûüÿ")          # what an elision may precede
_VOWELS = _VOWELISH - {"h"}
_LATIN_LOWER = re.compile(r"[a-zß-ÿœæ]+")
# lower-case words and abbreviations without a vowel that prose does use
_VOWELLESS_WORDS = frozenset("mph km kg cm mm ml hr hrs pm st nd rd th vs etc pp ft lb lbs oz mg sq hmm shh psst brr"
                             .split())
_WORD_SHAPE = re.compile(
    r"^(?:[^\W\d_]+(?:['’-][^\W\d_]+)*['’]?"          # words, hyphenated words, elisions
    r"|\d+(?:[.,:/]\d+)*(?:°?[^\W\d_]{0,3}|%)?"        # 42, 3.5, 17:30, 1/2, 72°F, 30%, 3h
    r"|[^\W\d_]+\d+[^\W\d_]*)$",                        # H2O, mp3
    re.U)
_RULE_CHARS = set("-=_*~")       # markdown/rst rules and emphasis: long runs are legitimate
_MARKUP = re.compile(r"^[|\-:#*>+=_~`]+$")
# Whitespace and the CJK/full-width punctuation that stands between words where no space does.
_CJK_SPLIT = re.compile(r"[\s\u3000-\u303f\uff01-\uff0f\uff1a-\uff20]+")

# Calibrated on tests/fixtures/selftest/*.json (see the module docstring).
LOOP_COVERAGE_MAX = 0.35        # share of characters inside back-to-back repeats
LOOP_MIN_CHARS = 8              # a loop shorter than this is not evidence ("ha ha")
NGRAM_COVERAGE_MAX = 0.5        # share of words inside 4-grams seen 3+ times
NGRAM_MIN_WORDS = 24
SYMBOL_RUN_MAX = 3              # `# # # #` is 4
SYMBOL_CHAR_RUN_MAX = 23
NONWORD_RATIO_MAX = 0.5          # a short reply: `# [CS_ah]`
NONWORD_RATIO_LONG_MAX = 0.3     # 20+ tokens: prose with inline code measured up to 10%
NONWORD_LONG_TOKENS = 20
NONWORD_MIN_TOKENS = 1
TAIL_COPIES_MAX = 2.5          # a reply that ends in 2.5+ copies of one unit ends in a loop
UNKNOWN_RATIO_MAX = 0.6        # with a lexicon: share of words it does not know


@dataclass(frozen=True)
class Degeneracy:
    """What check() found in one reply: degenerate or not, why, and the measures that decided."""
    degenerate: bool
    reasons: tuple[str, ...]
    loop_coverage: float        # 0..1 of characters inside back-to-back repeats
    loop_unit: str | None       # the longest repeated unit, for the report
    ngram_coverage: float       # 0..1 of words inside a 4-gram seen 3+ times
    symbol_run: int             # longest run of one punctuation token repeated
    nonword_ratio: float        # 0..1 of tokens that are not word-shaped (prose only, else 0)
    nonwords: tuple[str, ...]   # a few of them, for the report
    words: int

    def to_dict(self) -> dict[str, object]:
        return {"degenerate": self.degenerate, "reasons": list(self.reasons),
                "loop_coverage": round(self.loop_coverage, 3), "loop_unit": self.loop_unit,
                "ngram_coverage": round(self.ngram_coverage, 3), "symbol_run": self.symbol_run,
                "nonword_ratio": round(self.nonword_ratio, 3), "nonwords": list(self.nonwords),
                "words": self.words}


def loops(text: str) -> tuple[float, str | None, float]:
    """(share of visible characters inside back-to-back repeats of a unit spanning words,
    the longest such unit, copies of the loop the text ends in).

    Greedy decoding that enters a loop stays in it, so a reply cut by max_tokens ends inside
    one, often mid-copy: the tail scan counts partial copies that the regex cannot.
    """
    if len(text) < LOOP_MIN_CHARS:
        return 0.0, None, 0.0
    covered = bytearray(len(text))
    best: str | None = None
    pos = 0
    while pos < len(text):
        m = _TANDEM.search(text, pos)
        if not m:
            break
        unit, start = m.group(1), m.start()
        if not _spans_words(unit):
            pos = start + 1
            continue
        end = start + len(unit)
        while text.startswith(unit, end):
            end += len(unit)
        end += _common_prefix(text, end, unit)     # a last partial copy
        if end - start >= LOOP_MIN_CHARS:
            covered[start:end] = b"\x01" * (end - start)
            if best is None or len(unit) > len(best):
                best = unit
            pos = end
        else:
            pos = start + 1
    period, length = tail_period(text)
    copies = 0.0
    if period and _spans_words(text[len(text) - length:][:period]) and length - period >= LOOP_MIN_CHARS:
        covered[len(text) - length:] = b"\x01" * length
        copies = length / period
        unit = text[len(text) - length:][:period]
        if best is None or len(unit) > len(best):
            best = unit
    visible = sum(1 for c in text if not c.isspace())
    inside = sum(1 for i, c in enumerate(text) if covered[i] and not c.isspace())
    return (inside / visible if visible else 0.0), best, copies


def tail_period(text: str, max_period: int = 400) -> tuple[int, int]:
    """(p, L): the text's last L characters repeat with period p (text[i] == text[i - p]),
    for the p giving the longest repeated stretch L - p; (0, 0) when nothing repeats."""
    n = len(text)
    best_p, best_len = 0, 0
    for p in range(3, min(max_period, n // 2) + 1):
        i = n - 1
        while i - p >= 0 and text[i] == text[i - p]:
            i -= 1
        repeated = n - 1 - i           # characters equal to the one p before
        if repeated > best_len - best_p and repeated >= p // 2:
            best_p, best_len = p, repeated + p
    return best_p, best_len


def _common_prefix(text: str, at: int, unit: str) -> int:
    k = 0
    while k < len(unit) and at + k < len(text) and text[at + k] == unit[k]:
        k += 1
    return k


def _spans_words(unit: str) -> bool:
    """`et d'` and `# [CS_ah]` span a word boundary; `iss` in "Mississippi" and `00` in
    "1000000" do not (and `+ ` is a symbol run, judged by symbol_runs)."""
    core = unit.strip()
    return len(core) >= 3 and bool(re.search(r"\w", core)) and bool(re.search(r"[\W_]", core))


def ngram_coverage(words: list[str], n: int = 4, min_count: int = 3) -> float:
    if len(words) < max(n, NGRAM_MIN_WORDS):
        return 0.0
    lowered = [w.lower() for w in words]
    grams = [tuple(lowered[i:i + n]) for i in range(len(lowered) - n + 1)]
    counts = Counter(grams)
    covered = [False] * len(words)
    for i, g in enumerate(grams):
        if counts[g] >= min_count:
            for j in range(i, i + n):
                covered[j] = True
    return sum(covered) / len(words)


def symbol_runs(text: str) -> int:
    """Longest run of one punctuation-only token repeated (`# # # #` = 4), or of one symbol
    character inside a token (`!!!!...`, rules like `-----` excepted)."""
    best = run = 0
    prev = None
    for tok in text.split():
        if not any(c.isalnum() for c in tok):
            run = run + 1 if tok == prev else 1
            prev = tok
            best = max(best, run)
        else:
            run, prev = 0, None
    for m in re.finditer(r"([^\w\s])\1{%d,}" % SYMBOL_CHAR_RUN_MAX, text):
        if m.group(1) not in _RULE_CHARS:
            best = max(best, SYMBOL_RUN_MAX + 1)
    return best


def is_word_shaped(token: str) -> bool:
    core = token.strip(_STRIP)
    if not core:
        return False                    # punctuation alone
    m = _ELISION.match(core)
    if m and m.group("next").lower() not in _VOWELISH:
        return False                    # s'fotrenci: an elision before a consonant
    if _LATIN_LOWER.fullmatch(core) and len(core) >= 2 and not set(core) & _VOWELS \
            and core not in _VOWELLESS_WORDS:
        return False                    # "blbw", "ck": lower-case Latin words have a vowel
    return bool(_WORD_SHAPE.match(core))


def nonword_tokens(text: str) -> tuple[float, list[str]]:
    """(share of tokens that are not word-shaped, those tokens). Markdown's structure (table
    pipes and rules, heading marks, bullets, fences) is neither word nor non-word: not counted."""
    tokens = [t for t in _CJK_SPLIT.split(text) if t and not _MARKUP.match(t)]
    if len(tokens) < NONWORD_MIN_TOKENS:
        return 0.0, []
    bad = [t for t in tokens if not is_word_shaped(t)]
    return len(bad) / len(tokens), bad


def words(text: str) -> list[str]:
    return _WORD.findall(text)


def check(text: str, *, kind: str = "prose", lexicon: Iterable[str] | None = None) -> Degeneracy:
    """Judge one reply. kind: "prose" (every signal) or "code" (no non-word ratio: code is
    full of `d.items()`). With a lexicon, words it does not know count as non-words too."""
    ws = words(text)
    loop_cov, unit, copies = loops(text)
    ngram_cov = ngram_coverage(ws)
    sym = symbol_runs(text)
    ratio, bad = nonword_tokens(text) if kind == "prose" else (0.0, [])
    unknown_ratio, unknown = unknown_words(text, lexicon) if lexicon is not None else (0.0, [])
    reasons: list[str] = []
    if loop_cov > LOOP_COVERAGE_MAX:
        reasons.append(f"repetition loop: {loop_cov:.0%} of the text repeats {_show(unit)} back to back")
    elif copies >= TAIL_COPIES_MAX:
        reasons.append(f"repetition loop: the reply ends in {copies:.1f} copies of {_show(unit)}")
    if ngram_cov > NGRAM_COVERAGE_MAX:
        reasons.append(f"repeated n-grams: {ngram_cov:.0%} of the words are in 4-grams seen 3+ times")
    if sym > SYMBOL_RUN_MAX:
        reasons.append(f"symbol run: the same symbol {sym} times in a row")
    tokens = len([t for t in _CJK_SPLIT.split(text) if t and not _MARKUP.match(t)])
    if ratio > (NONWORD_RATIO_MAX if tokens < NONWORD_LONG_TOKENS else NONWORD_RATIO_LONG_MAX):
        reasons.append(f"non-words: {ratio:.0%} of the tokens are not word-shaped ({_show_list(bad)})")
    if unknown_ratio > UNKNOWN_RATIO_MAX:
        reasons.append(f"non-words: {unknown_ratio:.0%} of the words are not in the lexicon "
                       f"({_show_list(unknown)})")
    return Degeneracy(degenerate=bool(reasons), reasons=tuple(reasons), loop_coverage=loop_cov, loop_unit=unit,
                   ngram_coverage=ngram_cov, symbol_run=sym, nonword_ratio=ratio,
                   nonwords=tuple(dict.fromkeys(bad + unknown))[:8], words=len(ws))


def unknown_words(text: str, lexicon: Iterable[str]) -> tuple[float, list[str]]:
    """(share of alphabetic words not in `lexicon`, those words). Elisions split off first
    (`d'et` -> `d'`, `et`), so "s'fotrenci" is judged on "fotrenci"."""
    known = {w.lower() for w in lexicon}
    found: list[str] = []
    total = 0
    for w in _WORD.findall(text):
        parts = re.split(r"(?<=['’])", w.lower())
        for p in parts:
            p = p.replace("’", "'")
            if not p or p.endswith("'") or not any(c.isalpha() for c in p):
                continue
            total += 1
            if p not in known:
                found.append(p)
    return (len(found) / total if total else 0.0), found


def _show(unit: str | None) -> str:
    if unit is None:
        return "?"
    u = unit if len(unit) <= 40 else unit[:37] + "..."
    return repr(u)


def _show_list(items: list[str]) -> str:
    shown = list(dict.fromkeys(items))[:5]
    return ", ".join(repr(x) for x in shown)
