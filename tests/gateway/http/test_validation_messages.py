"""What the 400 says when a union field's member failed its own check, not its shape."""

from __future__ import annotations

import pytest

from gateway.http.validation import parse_chat_request, parse_completion_request
from schemas.errors import InvalidRequestError

BIG = 2**64


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "prompt": "x", "guided_json": {"type": "object", "maximum": %d}}' % BIG,
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "guided_json": {"maximum": %d}}' % BIG,
    ],
)
def test_an_out_of_range_integer_inside_guided_json_is_named_as_such(body: bytes) -> None:
    parse = parse_chat_request if b"messages" in body else parse_completion_request
    with pytest.raises(InvalidRequestError) as info:
        parse(body)
    assert info.value.param == "guided_json"
    assert f"integer {BIG} is out of range" in str(info.value) and "Value error" not in str(info.value)


def test_a_guided_json_of_the_wrong_shape_still_gets_the_shapes() -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_completion_request(b'{"model": "m", "prompt": "x", "guided_json": 5}')
    assert info.value.param == "guided_json" and "a JSON schema, as an object or a string" in str(info.value)


def test_a_nan_in_the_body_leaves_the_tag_out_of_the_path() -> None:
    """pydantic's parser reads NaN, orjson does not: the path was found without the body, and so kept
    the union's tag (``tools[0].function.function.parameters``)."""
    body = (
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}],'
        b' "tools": [{"type": "function", "function": {"name": "f", "parameters": {"x": NaN}}}]}'
    )
    with pytest.raises(InvalidRequestError) as info:
        parse_chat_request(body)
    assert info.value.param == "tools[0].function.parameters"
