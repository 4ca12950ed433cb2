"""The conversation-state seam's in-process implementation keeps its contract (gateway.responses_state)."""

from __future__ import annotations

import pytest

from gateway.responses_state import FinishedTurn, MemoryResponsesState
from schemas.errors import NotFoundError


def _turn(rid: str, said: str, answered: str, previous: str | None = None) -> FinishedTurn:
    item = {"id": f"msg_in_{rid}", "type": "message", "role": "user", "content": said}
    out = {
        "id": f"msg_out_{rid}",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": answered}],
    }
    return FinishedTurn({"id": rid, "status": "completed", "output": [out]}, [item], previous)


async def test_history_walks_the_chain_oldest_first() -> None:
    state = MemoryResponsesState()
    await state.save("k", _turn("a", "hi", "hello"))
    await state.save("k", _turn("b", "more", "sure", previous="a"))
    items = await state.history("k", "b")
    assert [i["id"] for i in items] == ["msg_in_a", "msg_out_a", "msg_in_b", "msg_out_b"]


async def test_another_tenant_gets_the_same_404_as_an_unknown_id() -> None:
    state = MemoryResponsesState()
    await state.save("k1", _turn("a", "hi", "hello"))
    with pytest.raises(NotFoundError) as other:
        await state.history("k2", "a")
    with pytest.raises(NotFoundError) as unknown:
        await state.history("k2", "zzz")
    assert other.value.envelope()["error"]["param"] == "previous_response_id"
    assert other.value.message.replace("'a'", "") == unknown.value.message.replace("'zzz'", "")


async def test_bounded_by_count_oldest_evicted_first() -> None:
    state = MemoryResponsesState(max_responses=2)
    for rid in ("a", "b", "c"):
        await state.save("k", _turn(rid, rid, rid))
    with pytest.raises(NotFoundError):
        await state.history("k", "a")
    assert [i["id"] for i in await state.history("k", "c")] == ["msg_in_c", "msg_out_c"]
