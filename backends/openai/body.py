"""An OpenAI-shaped non-streamed answer relayed to the client: the upstream's bytes, the model name swapped.

Parsed once (orjson) for the shape check and the usage; relayed as the upstream's bytes with only
the model name swapped (:func:`relay_completion_body`); a body where that swap is not provably
safe is serialised again, exactly (:func:`~backends.exact_json.dumps_exact`). Streams:
``backends.openai.relay``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from backends.base import Call, CompletionResult, TokenUsage, usage_of
from backends.errors import UpstreamProtocolError
from backends.exact_json import dumps_exact, loads_exact, may_hold_long_int

__all__ = ["relay_completion_body"]


def relay_completion_body(
    data: bytes,
    call: Call[Any],
    backend: str,
    kind: str = "text_completion",
    *,
    items: str = "choices",
    read_usage: Callable[[Any], TokenUsage | None] = usage_of,
) -> CompletionResult:
    """An upstream ``text_completion`` (or ``chat.completion``, an embeddings ``list``: ``kind``, whose
    array is ``items``) body, renamed to the client's model.

    The client gets the upstream's bytes (numbers, escapes, spacing and key order as sent)
    with only the model name swapped; the parse is for the shape check and the usage.

    The swap is made on the bytes when the body holds exactly one ``"model"`` token,
    followed by ``:`` (or ``: ``) and the upstream id as orjson spells it, and no ``\\u006``
    escape. Why that is safe: a quote inside a JSON string is escaped, so ``"model"`` occurs
    only as a whole string token (a key, or a value, which the count catches); the one other
    way to spell the top-level key escapes one of its letters, all ``\\u006X``. So the one
    token is the top-level key, and a JSON string token ends at its own closing quote: the
    swap replaces exactly the value. Anything else is serialised again, exactly.
    """
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamProtocolError("the upstream sent a body that is not JSON", backend=backend) from None
    if not isinstance(obj, dict) or not isinstance(obj.get(items), list):
        raise UpstreamProtocolError(f"the upstream sent a body that is not a {kind}", backend=backend)
    usage = read_usage(obj.get("usage"))
    upstream = obj.get("model")
    # Inline, not a helper: this is every non-streamed request's path (calls per request count).
    # One "model" token: the first is the last (one pass over the body, not a count and two more).
    at = data.find(b'"model"')
    if type(upstream) is str and at >= 0 and data.rfind(b'"model"') == at and not (b"\\" in data and b"\\u006" in data):
        value = orjson.dumps(upstream)
        start = at + 8  # past '"model":'; orjson and Python's json write no space before the colon
        if data[start : start + 1] == b" ":
            start += 1
        if data[at + 7 : at + 8] == b":" and data.startswith(value, start):  # the key's value, exactly
            end = start + len(value)
            return CompletionResult(data[:start] + orjson.dumps(call.public_model) + data[end:], usage)
    return CompletionResult(_renamed_reserialised(data, obj, call.public_model, backend), usage)


def _renamed_reserialised(data: bytes, obj: dict[str, Any], public: str, backend: str) -> bytes:
    """The body serialised again with the client's model name (the byte swap did not apply)."""
    if may_hold_long_int(data):
        # orjson read integers beyond 64 bits as floats: read the body again, keeping them.
        obj = loads_exact(data, backend)
    obj["model"] = public
    return dumps_exact(obj, backend)
