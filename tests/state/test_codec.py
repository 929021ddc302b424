from __future__ import annotations

import pytest

from tridentflow_state.codec import decode_key, decode_value, encode_key, encode_value
from tridentflow_state.errors import KeyEncodingError


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


# -- the key encoding is a pure, injective function of the value -------------------------------

import math  # noqa: E402
import random  # noqa: E402

from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tridentflow.plan import KeyEncoder  # noqa: E402
from tridentflow_state.codec import private  # noqa: E402

SPECIAL = [
    0.0,
    -0.0,
    1,
    1.0,
    True,
    False,
    0,
    None,
    "1",
    "",
    "ünï",
    "\ud800",
    float("nan"),
    float("inf"),
    -float("inf"),
    2**63,
    -(2**63),
    1e-300,
    5e-324,
]
scalars = st.one_of(
    st.sampled_from(SPECIAL),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),  # includes lone surrogates
    st.booleans(),
    st.none(),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
keys = st.lists(values, min_size=0, max_size=3).map(tuple)
# keys that compare equal in Python but differ as JSON, alone and in pairs, drawn often so
# that a batch holds several of them in every order
near_keys = st.one_of(
    st.sampled_from([(v,) for v in SPECIAL]),
    st.tuples(st.sampled_from(SPECIAL), st.sampled_from(SPECIAL)),
    keys,
)


def _encode(encoder, key):
    try:
        return encoder(key)
    except KeyEncodingError:
        return "REFUSED"


def _same(a, b) -> bool:
    """Identity as JSON sees it: type, float bits, recursively (lists and tuples alike)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return math.copysign(1, a) == math.copysign(1, b) and (a == b or (a != a and b != b))
    return a == b


@settings(max_examples=300, deadline=None)
@given(st.lists(near_keys, min_size=1, max_size=12), st.randoms(use_true_random=False))
@example([(0.0,), (-0.0,)], random.Random(0))
@example([(1,), (1.0,), (True,), ("1",)], random.Random(1))
def test_an_encoded_key_never_depends_on_the_rest_of_the_batch(batch, rnd: random.Random):
    alone = [_encode(encode_key, k) for k in batch]
    shared = KeyEncoder()
    in_order = [_encode(shared, k) for k in batch]
    shuffled = list(range(len(batch)))
    rnd.shuffle(shuffled)
    other = KeyEncoder()
    out_of_order = {i: _encode(other, batch[i]) for i in shuffled}
    assert in_order == alone
    assert [out_of_order[i] for i in range(len(batch))] == alone


@settings(max_examples=300, deadline=None)
@given(keys, keys)
def test_the_key_encoding_is_injective(a, b):
    ea, eb = _encode(encode_key, a), _encode(encode_key, b)
    if "REFUSED" in (ea, eb):
        return
    assert (ea == eb) == _same(a, b)
    assert _same(decode_key(ea), a)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), "a\ud800b", ["\udfff"]])
def test_nan_infinities_and_lone_surrogates_are_refused_with_a_clear_error(bad):
    with pytest.raises(KeyEncodingError, match=r"NaN/inf|lone surrogate"):
        encode_key((bad,))


def test_zero_and_negative_zero_are_two_keys_whatever_comes_first():
    for order in ([0.0, -0.0], [-0.0, 0.0]):
        encoder = KeyEncoder()
        assert [encoder((v,)) for v in order] == [encode_key((v,)) for v in order]
    assert encode_key((0.0,)) == "[0.0]" and encode_key((-0.0,)) == "[-0.0]"


def test_private_copies_containers_and_shares_immutables():
    nested = {"a": [1, {"b": [2]}], "c": (3, [4])}
    copy = private(nested)
    assert copy == nested
    copy["a"][1]["b"].append(9)
    copy["c"][1].append(9)
    assert nested == {"a": [1, {"b": [2]}], "c": (3, [4])}
    text = "x" * 10
    assert private(text) is text and private(5) == 5


@given(st.text())
@example('é"x\\\n\u2028y\x00')
@example("\ud800")
@settings(max_examples=500)
def test_a_one_string_key_takes_the_fast_path_to_the_same_encoding(text):
    """encode_key's fast path for ``(str,)`` is json.dumps of the general path, byte for byte;
    a string without a UTF-8 form is refused by both, with the same line."""
    import json

    from tridentflow_state.codec import encode_str_key

    try:
        general = json.dumps([text], separators=(",", ":"), ensure_ascii=False, sort_keys=True)
        text.encode("utf-8")
    except UnicodeEncodeError:
        with pytest.raises(KeyEncodingError, match=r"group key \[0\] holds a lone surrogate"):
            encode_str_key(text)
        with pytest.raises(KeyEncodingError, match=r"group key \[0\] holds a lone surrogate"):
            encode_key([text])
        return
    assert encode_str_key(text) == encode_key((text,)) == encode_key([text]) == general
