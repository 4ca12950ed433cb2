"""schemas.common._json_safe (a JsonObject's check: a tool's JSON Schema, say) by exact types gives the
answer and the error of the walk by isinstance, for any value: parsed JSON, subclasses, other types."""

from __future__ import annotations

import enum
import math
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.common import _json_safe, _json_safe_walk


class Big(enum.IntEnum):
    HUGE = 2**70


class Ratio(float):
    pass


_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=3),
    st.integers(-(2**65), 2**65),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([Big.HUGE, Ratio(1.5), Ratio(math.inf), (1, math.nan), b"x", 1.5j]),
)
_JSON = st.recursive(
    _LEAF,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=2), inner, max_size=4)
        | st.dictionaries(st.text(max_size=2), inner, max_size=3).map(OrderedDict)
    ),
    max_leaves=20,
)


def _outcome(check: Any, value: Any) -> tuple[str, Any]:
    try:
        return "ok", check(value)
    except ValueError as exc:
        return "refused", str(exc)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_the_fast_check_answers_as_the_walk(value: Any) -> None:
    fast, walk = _outcome(_json_safe, value), _outcome(_json_safe_walk, value)
    assert fast[0] == walk[0] and (fast[1] is walk[1] if fast[0] == "ok" else fast[1] == walk[1])


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"a": [1, {"b": math.nan}]}, "numbers must be finite"),
        ({"a": -math.inf}, "numbers must be finite"),
        ({"a": [2**64]}, "integer 18446744073709551616 is out of range"),
        ({"a": -(2**63) - 1, "b": math.inf}, "numbers must be finite"),  # the walk's order: the last value first
        ({"a": Big.HUGE}, "out of range"),
        (OrderedDict(a=Ratio(math.nan)), "numbers must be finite"),
    ],
)
def test_what_cannot_be_written_back_is_refused(value: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        _json_safe(value)


def test_json_and_other_values_pass_as_they_are() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 2**64 - 1, "minimum": -(2**63)}},
              "x": [1.5, True, None, "s"], "t": (math.nan,)}  # fmt: skip
    assert _json_safe(schema) is schema  # a tuple is not walked (the walk never did)
