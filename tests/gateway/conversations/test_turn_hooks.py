"""The Responses handler's hooks without a coroutine where nothing is awaited (gateway/flow/responses_turns.py):
``begin_now`` does a first turn's work at once and hands back a continuation's expansion to await; a
store that cannot keep the turn refuses before either."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from backends.responses.answer import ResponseFrame, response_from_chat
from backends.responses.capabilities import chat_request_of
from gateway.conversations import ConversationStore
from gateway.flow.responses_turns import ResponsesTurns
from gateway.responses_state import NO_AUTH_TENANT
from gateway.store import MemoryStore
from schemas.endpoints import Endpoint
from schemas.errors import InvalidRequestError
from schemas.responses import ResponsesRequest


@dataclass
class _Entry:
    omit_builtin_tools: bool = False
    served: Mapping[Endpoint, Sequence[Any]] = field(default_factory=dict)


async def test_a_first_turn_begins_at_once_and_a_continuation_is_awaited() -> None:
    memory = MemoryStore("responses", ttl=60, max_items=10, max_bytes=1 << 20)
    turns, store = ResponsesTurns(), ConversationStore(memory)
    first = ResponsesRequest.model_validate({"model": "m", "input": "one"})
    assert turns.begin_now(first, _Entry(), store, None) is None  # nothing to await: it goes on as it is
    assert await turns.begin(first, _Entry(), store, None) is first
    chat = {"choices": [{"message": {"role": "assistant", "content": "two"}, "finish_reason": "stop"}]}
    frame = ResponseFrame(first, "m", chat_request_of(first)[1])
    result, response = response_from_chat(orjson.dumps(chat), frame, "b")
    assert turns.end_now(first, response, store, None, result.body, result.output_at) is None
    assert memory.get_now(NO_AUTH_TENANT, [response["id"]]) != [None]  # kept before end_now returned
    follow = ResponsesRequest.model_validate({"model": "m", "input": "three", "previous_response_id": response["id"]})
    continuing = turns.begin_now(follow, _Entry(), store, None)
    assert continuing is not None
    expanded = await continuing
    sent = [
        orjson.loads(orjson.dumps(item.model_dump(mode="json", exclude_none=True))) for item in expanded.input or ()
    ]
    assert [item.get("content") for item in sent][-1] == "three"
    assert len(sent) == 3 and sent[1]["id"] == response["output"][0]["id"]  # one, its answer, three
    assert (await turns.begin(follow, _Entry(), store, None)).input == expanded.input


async def test_a_store_that_cannot_keep_the_turn_refuses_before_anything() -> None:
    unshared = ConversationStore(None, unshared=2)
    request = ResponsesRequest.model_validate({"model": "m", "input": "one"})
    with pytest.raises(InvalidRequestError) as refused:
        ResponsesTurns().begin_now(request, _Entry(), unshared, None)
    assert refused.value.param == "store"
    unstored = ResponsesRequest.model_validate({"model": "m", "input": "one", "store": False})
    assert ResponsesTurns().begin_now(unstored, _Entry(), unshared, None) is None
