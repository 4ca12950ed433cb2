"""Every implementation of the Responses handler's seam (``gateway.responses_state``) keeps its
contract: the chain oldest first with each turn's input then output, tenants apart with one 404
for all unknowns, nothing raised by ``save``. The trivial one, and the store in memory and Redis."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.conversations import ConversationStore
from gateway.responses_state import FinishedTurn, MemoryResponsesState, ResponsesState
from gateway.store import MemoryStore, RedisStore
from schemas.errors import NotFoundError
from tests.gateway.security.conftest import RedisServer


def _turn(rid: str, said: str, answered: str, previous: str | None = None) -> FinishedTurn:
    item = {"id": f"msg_in_{rid}", "type": "message", "role": "user", "content": said}
    out = {"id": f"msg_out_{rid}", "type": "message", "role": "assistant",
           "content": [{"type": "output_text", "text": answered, "annotations": []}]}  # fmt: skip
    return FinishedTurn({"id": rid, "status": "completed", "output": [out]}, [item], previous)


@pytest.fixture(params=["trivial", "memory", "redis"])
async def state(request: pytest.FixtureRequest) -> AsyncIterator[ResponsesState]:
    if request.param == "trivial":
        yield MemoryResponsesState()
        return
    if request.param == "memory":
        yield ConversationStore(MemoryStore("responses", ttl=60, max_items=100, max_bytes=1 << 20))
        return
    redis: RedisServer = request.getfixturevalue("redis_server")
    store = ConversationStore(RedisStore(redis.url, "responses", ttl=60, prefix=f"t{time.monotonic_ns()}"))
    yield store
    await store.close()


async def test_history_is_the_chain_oldest_first(state: ResponsesState) -> None:
    state.check_storable()
    await state.save("k", _turn("a", "hi", "hello"))
    await state.save("k", _turn("b", "more", "sure", previous="a"))
    await state.save("k", _turn("c", "again", "ok", previous="b"))
    items = await state.history("k", "c")
    assert [i["id"] for i in items] == ["msg_in_a", "msg_out_a", "msg_in_b", "msg_out_b", "msg_in_c", "msg_out_c"]
    texts: list[Any] = [i["content"] if isinstance(i["content"], str) else i["content"][0]["text"] for i in items]
    assert texts == ["hi", "hello", "more", "sure", "again", "ok"]


async def test_other_tenants_and_unknown_ids_are_one_404(state: ResponsesState) -> None:
    await state.save("k1", _turn("a", "hi", "hello"))
    with pytest.raises(NotFoundError) as other:
        await state.history("k2", "a")
    with pytest.raises(NotFoundError) as unknown:
        await state.history("k2", "zzz")
    assert other.value.status == unknown.value.status == 404
    assert other.value.envelope()["error"]["param"] == "previous_response_id"
    assert other.value.message.replace("'a'", "") == unknown.value.message.replace("'zzz'", "")
