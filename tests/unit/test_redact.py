"""One redaction everywhere: longest secret first, structured data before rendering."""

from supervisor.redact import Secrets, redact, redact_data


def test_a_secret_that_contains_another_is_masked_whole():
    assert redact("key sk-abcd and sk-ab", ["sk-ab", "sk-abcd"]) == "key *** and ***"


def test_empty_and_missing_secrets_mask_nothing():
    assert redact("plain text", ["", None]) == "plain text"


def test_structured_data_is_masked_in_keys_values_and_lists():
    data = {"argv": ["--api-key", "s3cret"], "s3cret": {"nested": "x s3cret y"}, "n": 3}
    assert redact_data(data, ["s3cret"]) == {"argv": ["--api-key", "***"], "***": {"nested": "x *** y"}, "n": 3}


def test_secrets_grow_and_stay_ordered():
    s = Secrets(["ab"])
    s.add("abcd", None, "ab")
    assert list(s) == ["abcd", "ab"] and len(s) == 2 and "ab" in s
    assert s.redact("abcd ab") == "*** ***"


def test_a_very_short_secret_is_masked_as_a_token_not_inside_every_word():
    # issue 37, "small lies": a 2-letter key turned every message into asterisks
    assert redact("a label about tabs: key ab, Bearer ab", ["ab"]) == "a label about tabs: key ***, Bearer ***"
    assert redact_data({"m": "absent ab"}, ["ab"]) == {"m": "absent ***"}
    assert redact("x-sk-longer-secret-x", ["sk-longer-secret"]) == "x-***-x"     # 8 or more: wherever it is
