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
