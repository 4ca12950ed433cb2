"""An upstream's embeddings answer (``relay_embeddings``) relayed without parsing its vectors.

The promise is ``relay_completion_body``'s: the upstream's bytes with only the top-level model
swapped, its ``usage`` read, a body that is not a list object refused. The vectors are cut out
and the rest (the skeleton) parsed; whatever the skeleton's checks cannot vouch for takes the
full parse, so every answer here is compared with what the full parse gives.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.base import EmbeddingCall, TokenUsage
from backends.errors import UpstreamProtocolError
from backends.openai.body import relay_completion_body
from backends.openai.pooling import _relayed_unparsed, pooling_usage, relay_embeddings
from schemas.embeddings import EmbeddingRequest

UP = "org/up-embed"
PUB = "public-embed"


def _call() -> EmbeddingCall:
    return EmbeddingCall(EmbeddingRequest(model=PUB, input="hi"), UP, PUB, "req-1")


def _full(data: bytes) -> Any:
    return relay_completion_body(data, _call(), "b", "list", items="data", read_usage=pooling_usage)


def _same_as_the_full_parse(data: bytes) -> None:
    """``relay_embeddings`` answers ``data`` as the full parse does: the same body and usage, or a refusal."""
    try:
        full = _full(data)
    except UpstreamProtocolError:
        with pytest.raises(UpstreamProtocolError):
            relay_embeddings(data, _call(), "b")
        return
    relayed = relay_embeddings(data, _call(), "b")
    assert (relayed.body, relayed.usage) == (full.body, full.usage)


def _floats(n: int, seed: int) -> list[float]:
    """``n`` float32 values (as an engine sends them), different per ``seed``."""
    raw = [((seed * 7919 + i * 104729) % 2001 - 1000) / 9973 for i in range(n)]
    return list(struct.unpack(f"<{n}f", struct.pack(f"<{n}f", *raw)))


def _b64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def _openai(vectors: list[Any]) -> dict[str, Any]:
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": UP, "usage": {"prompt_tokens": 5, "total_tokens": 5}}


def _vllm(vectors: list[Any]) -> dict[str, Any]:
    data = [{"index": i, "object": "embedding", "embedding": v} for i, v in enumerate(vectors)]
    usage = {"prompt_tokens": 7, "total_tokens": 7, "completion_tokens": 0, "prompt_tokens_details": None}
    return {"id": "embd-1", "object": "list", "created": 1, "model": UP, "data": data, "usage": usage}


@pytest.mark.parametrize("shape", [_openai, _vllm])
@pytest.mark.parametrize("encoding", ["float", "base64"])
@pytest.mark.parametrize("spaced", [False, True])
@pytest.mark.parametrize("count", [1, 3])
def test_the_upstreams_bytes_with_the_model_swapped(shape: Any, encoding: str, spaced: bool, count: int) -> None:
    vectors: list[Any] = [_floats(16, i) for i in range(count)]
    if encoding == "base64":
        vectors = [_b64(v) for v in vectors]
    obj = shape(vectors)
    data = json.dumps(obj).encode() if spaced else orjson.dumps(obj)
    relayed = _relayed_unparsed(data, PUB)
    assert relayed is not None, "the unparsed path must take an ordinary answer"
    assert relayed.body == data.replace(b'"' + UP.encode() + b'"', b'"' + PUB.encode() + b'"')
    assert relayed.usage == TokenUsage(obj["usage"]["prompt_tokens"], 0)
    full = _full(data)
    assert (relayed.body, relayed.usage) == (full.body, full.usage)
    answer = orjson.loads(relayed.body)
    assert answer["data"] == [{**d} for d in obj["data"]] and answer["model"] == PUB


def _list(data: str, after: str = ',"model":"org/up-embed"') -> bytes:
    return ('{"object":"list","data":[' + data + "]" + after + "}").encode()


@pytest.mark.parametrize(
    ("why", "data"),
    [
        ("a vector holding a string", _list('{"index":0,"embedding":[1,"x"]}')),
        ("a nested array", _list('{"index":0,"embedding":[[1],2]}')),
        ("an object in a vector", _list('{"index":0,"embedding":[1,{}]}')),
        ("a brace in a vector", _list('{"index":0,"embedding":[1}]}')),
        ("an escape in a base64 string", _list('{"index":0,"embedding":"AA\\u0041"}')),
        ("an index that is a bool", _list('{"index":false,"embedding":[1]}')),
        ("no index", _list('{"embedding":[1]}')),
        ("a vector outside data", _list("", ',"embedding":[1],"model":"org/up-embed"')),
        ("an item of two vectors", _list('{"index":0,"embedding":[1],"embedding":[2]}')),
        ("a vector of another type", _list('{"index":0,"embedding":null}')),
        ("a second model token", _list('{"index":0,"embedding":[1],"model":"x"}')),
        ("an escaped model key", _list('{"index":0,"embedding":[1]}', ',"\\u006dodel":"org/up-embed"')),
        ("a space before the model's colon", _list('{"index":0,"embedding":[1]}', ',"model" :"org/up-embed"')),
        ("no model", _list('{"index":0,"embedding":[1]}', "")),
    ],
)
def test_what_the_skeleton_cannot_vouch_for_takes_the_full_parse(why: str, data: bytes) -> None:
    assert _relayed_unparsed(data, PUB) is None, why
    _same_as_the_full_parse(data)


def test_an_answer_out_of_order_is_put_in_input_order() -> None:
    data = _list('{"index":1,"embedding":[2.5]},{"index":2,"embedding":"AAAA"},{"index":0,"embedding":[1e-05]}')
    data = data[:-1] + b',"usage":{"prompt_tokens":3,"total_tokens":3},"id":18446744073709551616}'
    relayed = relay_embeddings(data, _call(), "b")
    answer = json.loads(relayed.body)
    assert answer["data"] == [
        {"index": 0, "embedding": [1e-05]},
        {"index": 1, "embedding": [2.5]},
        {"index": 2, "embedding": "AAAA"},
    ]
    assert answer["model"] == PUB and answer["id"] == 18446744073709551616  # kept exact
    assert relayed.usage == TokenUsage(3, 0)
    # Indices that are not 0..n-1 are the server's to answer for: relayed as they came.
    odd = _list('{"index":3,"embedding":[1]},{"index":1,"embedding":[2]}')
    assert [d["index"] for d in orjson.loads(relay_embeddings(odd, _call(), "b").body)["data"]] == [3, 1]


@pytest.mark.parametrize(
    "data",
    [
        b'{"object":"list","data":[{"index":0,"embedding":[1,2',  # cut inside a vector
        b'{"object":"list","data":[{"index":0,"embedding":[1,2]}],"model":"org/up-embed","usage":{"prompt',  # after
        b'{"object":"list","data":[{"index":0,"embedding":"AAAA',  # inside a base64 string
        b'{"object":"list","data":{"index":0,"embedding":[1]},"model":"org/up-embed"}',  # data not a list
        b'["embedding":[1]]',
    ],
)
def test_a_broken_answer_is_the_upstreams_error(data: bytes) -> None:
    with pytest.raises(UpstreamProtocolError):
        relay_embeddings(data, _call(), "b")


_NUMBERS = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(
    vectors=st.lists(st.lists(_NUMBERS, min_size=1, max_size=6), min_size=1, max_size=4),
    base64_form=st.booleans(),
    spaced=st.booleans(),
    vllm=st.booleans(),
    cut=st.integers(min_value=0, max_value=400),
)
def test_the_same_answer_as_the_full_parse(
    vectors: list[list[float]], base64_form: bool, spaced: bool, vllm: bool, cut: int
) -> None:
    """Whole or cut at any byte, an answer gets what the full parse gives: the same body and
    usage, or the same refusal."""
    obj = (_vllm if vllm else _openai)([_b64(v) if base64_form else v for v in vectors])
    whole = json.dumps(obj).encode() if spaced else orjson.dumps(obj)
    _same_as_the_full_parse(whole)
    _same_as_the_full_parse(whole[: min(cut, len(whole) - 1)])
