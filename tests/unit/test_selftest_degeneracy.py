"""The degeneracy detector: the field notes' degenerate strings, and real replies of real models
(tests/fixtures/selftest/PROVENANCE.md) on both sides of every threshold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.selftest import degeneracy
from supervisor.selftest.lexicon import FRENCH_COMMON

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "selftest"
SMOL = json.loads((FIX / "smollm2-135m-q4_1-replies.json").read_text())
TINY = json.loads((FIX / "tiny-random-replies.json").read_text())


# -- the field notes' strings (field notes § "Output quality and sampler") ---------------------------------

@pytest.mark.parametrize("text", [
    "# [CS_ah]",                                              # as quoted
    "# [CS_ah]\n" * 12,                                       # as a selftest reply loops on it
    "The capital of Japan is\n" + "# [CS_ah]" * 20,
])
def test_cs_ah_is_degenerate(text):
    v = degeneracy.check(text)
    assert v.degenerate, v


@pytest.mark.parametrize("text", [
    "et d'et d'",
    "La Révolution française a commencé en 1789 et d'" + "et d'" * 15,
])
def test_et_d_loop_is_degenerate(text):
    v = degeneracy.check(text)
    assert v.degenerate and any("repetition loop" in r for r in v.reasons), v


@pytest.mark.parametrize("text", [
    "# # # #",
    "The capital of Japan is # # # # # # # # # # # # # # # # # # # # # # # #",   # "after six tokens"
])
def test_hash_run_is_degenerate(text):
    v = degeneracy.check(text)
    assert v.degenerate and v.symbol_run >= 4 and any("symbol run" in r for r in v.reasons), v


def test_s_fotrenci_is_not_a_word_by_its_shape():
    # French elides "s'" only before a vowel or h: "s'est", "s'il", never "s'f...".
    assert not degeneracy.is_word_shaped("s'fotrenci")
    assert degeneracy.is_word_shaped("s'est") and degeneracy.is_word_shaped("l'homme")
    assert degeneracy.check("s'fotrenci").degenerate
    v = degeneracy.check("Paris est une ville où les gens s'fotrenci dans les rues.")
    assert "s'fotrenci" in v.nonwords


def test_lower_case_latin_words_have_vowels():
    assert not degeneracy.is_word_shaped("blbw") and not degeneracy.is_word_shaped("ck")
    assert degeneracy.is_word_shaped("mph") and degeneracy.is_word_shaped("rhythm")
    assert degeneracy.is_word_shaped("CPU") and degeneracy.is_word_shaped("wavelengths")


def test_cunce_is_unknown_to_the_french_lexicon():
    # "cunce" is word-shaped: only a lexicon tells it from French. The check says so.
    assert not degeneracy.check("cunce").degenerate
    assert degeneracy.check("cunce", lexicon=FRENCH_COMMON).degenerate
    ratio, unknown = degeneracy.unknown_words("La cunce de la ville est zocneine.", FRENCH_COMMON)
    assert unknown == ["cunce", "zocneine"] and ratio == pytest.approx(2 / 7)


# -- real replies ----------------------------------------------------------------------------------

LOOPING = [
    "Explain how a bicycle works, part by part, in several paragraphs.",
    "Describe a walk through a forest in autumn, in rich detail.",
    "Write a long story about a lighthouse keeper and a storm.",
    "Write a short poem about the moon.",
    "What are the benefits of regular exercise?",
    "Écris un court paragraphe en français sur la ville de Paris.",
]
COHERENT = [
    "Write a detailed essay about the history of bread, from ancient Egypt to modern bakeries.",
    "Explain photosynthesis to a curious student, step by step.",
    "Explain what a database index is.",
    "Summarize the plot of Cinderella.",
    "Explain why the sky is blue.",
    "What is the difference between weather and climate?",
    "Tell me about the history of the printing press.",
    "Quelle est la capitale de la France?",
]


@pytest.mark.parametrize("prompt", LOOPING)
def test_smollm2_loops_are_degenerate(prompt):
    v = degeneracy.check(SMOL["prose"][prompt])
    assert v.degenerate, (prompt, v)


@pytest.mark.parametrize("prompt", COHERENT)
def test_smollm2_coherent_prose_is_not(prompt):
    v = degeneracy.check(SMOL["prose"][prompt])
    assert not v.degenerate, (prompt, v)


@pytest.mark.parametrize("prompt", sorted(TINY))
def test_the_tiny_random_model_loops_from_the_start(prompt):
    # 64 tokens hold less than two copies of its loop: the tail scan counts the partial one.
    v = degeneracy.check(TINY[prompt])
    assert v.degenerate and v.loop_coverage > degeneracy.LOOP_COVERAGE_MAX, v


def test_a_loop_that_starts_late_is_caught_by_how_the_reply_ends():
    text = SMOL["prose"]["What are the benefits of regular exercise?"]
    v = degeneracy.check(text)
    assert v.loop_coverage <= degeneracy.LOOP_COVERAGE_MAX      # most of the reply is fine...
    assert any("ends in" in r for r in v.reasons)               # ...but it ends in a loop


@pytest.mark.parametrize("text", [
    "Tokyo", "4", "The capital of Japan is Tokyo.", "The trip takes 3 hours 30 minutes.",
    "17:30 - 14:00 = 3 h 30 min (3.5 hours), about 72°F and 30% humidity.", "Mississippi", "ha ha",
    "1000000", "Bye bye, see you.", "春天来了，大地一片生机勃勃。小草从土里探出头来。",
    "| city | capital |\n| --- | --- |\n| Japan | Tokyo |", "## Answer\n\n- Tokyo\n\n---",
])
def test_short_right_answers_are_not_degenerate(text):
    v = degeneracy.check(text)
    assert not v.degenerate, (text, v)


def test_code_is_read_as_code():
    code = "def invert(d):\n    return {v: k for k, v in d.items()}\n"
    assert degeneracy.check(code, kind="prose").nonword_ratio > 0       # d.items() is no word...
    assert not degeneracy.check(code, kind="code").degenerate           # ...and code is not prose


def test_the_verdict_serialises():
    d = degeneracy.check("# # # #").to_dict()
    assert d["degenerate"] is True and d["symbol_run"] == 4 and json.dumps(d)
