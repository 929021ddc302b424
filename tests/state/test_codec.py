from __future__ import annotations

import pytest

from state.codec import decode_key, decode_value, encode_key, encode_value
from state.errors import KeyEncodingError


def test_keys_are_deterministic_and_distinguish_types():
    assert encode_key(("man",)) == '["man"]'
    assert encode_key((1,)) != encode_key((1.0,))
    assert encode_key((True,)) != encode_key((1,))
    assert encode_key(({"b": 1, "a": 2},)) == encode_key(({"a": 2, "b": 1},))
    assert encode_key(()) == "[]"


@pytest.mark.parametrize(
    "key", [("a", 1), (1.5, None, True), (("x", 2), "y"), ("ünï", "中文"), (-3, 0.1)]
)
def test_compound_and_non_string_keys_round_trip(key):
    assert decode_key(encode_key(key)) == key
    assert [type(v) for v in decode_key(encode_key(key))] == [type(v) for v in key]


@pytest.mark.parametrize("bad", [(object(),), (float("nan"),), ({1: "x"},), ({"a"},)])
def test_keys_without_a_stable_encoding_are_refused(bad):
    with pytest.raises(KeyEncodingError):
        encode_key(bad)


def test_values_keep_int_and_float_apart():
    assert decode_value(encode_value([1, 1.0])) == [1, 1.0]
    assert type(decode_value(encode_value(1.0))) is float
    assert decode_value(None) is None
