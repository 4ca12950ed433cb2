"""Conversations over a tenant store: a chain loaded whole and in order, a missing link refused
(never silently skipped), other tenants' ids answered as unknown ones, and memory stores that
several workers would not share refusing by name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from gateway.conversations import Conversation, ConversationStore, input_items, new_id
from gateway.conversations.records import decode, encode, turn_of
from gateway.metrics import GatewayMetrics
from gateway.responses_state import FinishedTurn
from gateway.store import MemoryStore
from schemas.config import ResponsesConfig
from schemas.errors import InvalidRequestError, NotFoundError


def _store() -> ConversationStore:
    return ConversationStore(MemoryStore("responses", ttl=60, max_items=100, max_bytes=1 << 20))


def _response(rid: str, text: str, model: str = "m") -> dict[str, Any]:
    message = {"type": "message", "id": new_id("msg"), "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip
    return {"id": rid, "object": "response", "status": "completed", "model": model, "output": [message]}


async def _turns(store: ConversationStore, tenant: str, n: int) -> list[str]:
    """``n`` chained turns: user says ``q{i}``, assistant answers ``a{i}``; their ids, in order."""
    ids: list[str] = []
    for i in range(n):
        rid = new_id("resp")
        await store.save(tenant, FinishedTurn(_response(rid, f"a{i}"), input_items(f"q{i}"), ids[-1] if ids else None))
        ids.append(rid)
    return ids


def _texts(conversation: Conversation) -> list[str]:
    return [part["text"] for item in conversation.items() for part in item["content"]]


async def test_previous_response_id_loads_every_earlier_turn_in_order() -> None:
    store = _store()
    ids = await _turns(store, "a", 4)
    conversation = await store.conversation("a", ids[-1])
    assert conversation.chain == ids
    assert _texts(conversation) == ["q0", "a0", "q1", "a1", "q2", "a2", "q3", "a3"]
    middle = await store.conversation("a", ids[1])  # continuing from an earlier turn forks there
    assert _texts(middle) == ["q0", "a0", "q1", "a1"]


async def test_another_tenants_id_is_the_same_404_as_an_unknown_one() -> None:
    store = _store()
    (rid,) = await _turns(store, "team-a", 1)
    answers = []
    for tenant, wanted in (("team-b", rid), ("team-a", "resp_" + "0" * 48)):
        with pytest.raises(NotFoundError) as caught:
            await store.conversation(tenant, wanted)
        answers.append(caught.value.envelope()["error"] | {"message": caught.value.message.replace(wanted, "ID")})
        for call in (store.get, store.delete):
            with pytest.raises(NotFoundError) as other:
                await call(tenant, wanted)
            assert other.value.status == 404 and other.value.param == "response_id"
    assert answers[0] == answers[1]
    assert answers[0]["code"] == "previous_response_not_found" and answers[0]["param"] == "previous_response_id"
    assert (await store.get("team-a", rid)).response["id"] == rid


async def test_a_conversation_missing_an_earlier_turn_is_refused_naming_it() -> None:
    store = _store()
    ids = await _turns(store, "a", 3)
    await store.delete("a", ids[1])
    with pytest.raises(NotFoundError) as caught:
        await store.conversation("a", ids[2])
    assert ids[1] in caught.value.message and caught.value.param == "previous_response_id"


async def test_continuing_keeps_a_conversation_from_being_evicted_first() -> None:
    memory = MemoryStore("responses", ttl=60, max_items=3, max_bytes=1 << 20)
    store = ConversationStore(memory)
    first = await _turns(store, "a", 1)
    await _turns(store, "a", 1)
    await store.conversation("a", first[0])  # read: touched
    await _turns(store, "a", 1)
    await _turns(store, "a", 1)  # four values, bound three: the untouched second one goes
    assert (await store.get("a", first[0])).response["id"] == first[0]


def test_input_items_are_named_and_in_list_form() -> None:
    items = input_items(
        [
            {"role": "developer", "content": "be brief"},
            {"type": "message", "role": "assistant", "content": "earlier"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
            {"type": "message", "id": "msg_mine", "role": "user", "content": [{"type": "input_text", "text": "x"}]},
        ]
    )
    assert [item["id"][:4] for item in items[:3]] == ["msg_", "msg_", "fco_"]
    assert items[0]["content"] == [{"type": "input_text", "text": "be brief"}]
    assert items[0]["type"] == "message" and items[0]["status"] == "completed"
    assert items[1]["content"] == [{"type": "output_text", "text": "earlier", "annotations": []}]
    assert items[2] == {"type": "function_call_output", "call_id": "c1", "output": "42", "id": items[2]["id"]}
    assert items[3]["id"] == "msg_mine"
    assert len({new_id("resp") for _ in range(1000)}) == 1000 and len(new_id("resp")) == 5 + 48


async def test_a_turn_is_kept_as_sent_goes_upstream_so_and_is_listed_in_parts() -> None:
    store = _store()
    sent = [{"id": "msg_1", "type": "message", "role": "user", "content": "hi"}, {"role": "user", "content": "again"}]
    await store.save("a", FinishedTurn(_response("resp_1", "hello"), sent, None))
    earlier = await store.history("a", "resp_1")
    assert earlier[0] == sent[0]  # as the client sent it: no parts, no status added on the way
    assert earlier[1]["content"] == "again" and earlier[1]["id"].startswith("msg_")  # named once, at save
    listed = (await store.get("a", "resp_1")).input  # GET .../input_items
    assert listed[0] == {"id": "msg_1", "type": "message", "role": "user", "status": "completed",
                         "content": [{"type": "input_text", "text": "hi"}]}  # fmt: skip
    assert listed[1]["id"] == earlier[1]["id"] and listed[1]["content"] == [{"type": "input_text", "text": "again"}]
    assert sent[1] == {"role": "user", "content": "again"}  # the caller's items are not changed


async def test_the_chain_is_read_when_history_was_not_loaded_in_this_process() -> None:
    store = _store()
    ids = await _turns(store, "a", 2)
    other = ConversationStore(store.store)  # another worker on the same (shared) store
    rid = new_id("resp")
    await other.save("a", FinishedTurn(_response(rid, "a2"), input_items("q2"), ids[-1]))
    assert (await store.conversation("a", rid)).chain == [*ids, rid]


async def test_a_turn_over_the_byte_bound_is_logged_on_either_save_path(caplog: pytest.LogCaptureFixture) -> None:
    """A first turn (written without awaiting) and a continuation whose chain this process never
    loaded (read, then written through the awaited path) alike: over max_bytes, not kept, and said."""
    store = ConversationStore(MemoryStore("responses", ttl=60, max_items=100, max_bytes=2048))
    (first,) = await _turns(store, "a", 1)
    for previous in (None, first):
        rid = new_id("resp")
        await store.save("a", FinishedTurn(_response(rid, "x" * 4096), input_items("q"), previous))
        assert f"response {rid} was not stored: larger than responses.max_bytes" in caplog.text
        with pytest.raises(NotFoundError):
            await store.get("a", rid)


async def test_a_store_that_fails_leaves_the_turn_unstored_without_raising(caplog: pytest.LogCaptureFixture) -> None:
    store = ConversationStore(None, unshared=2)
    await store.save("a", FinishedTurn(_response("resp_x", "hi"), [], None))
    assert "resp_x was not stored" in caplog.text


def test_a_record_reads_back_the_response_as_answered_part_by_part() -> None:
    response = {**_response("resp_x", "line one\nline two"), "metadata": {"k": "v\n"}}
    items = input_items("a question\nover two lines")
    blob = encode(response, items, ["resp_a", "resp_b"])
    record = decode(blob)
    assert orjson.dumps(record.response) == orjson.dumps(response)  # the same keys in the same order
    assert record.chain == ["resp_a", "resp_b"] and record.input == items and record.model == "m"
    assert record.turn("resp_x").items == [*items, *response["output"]]
    assert turn_of("resp_x", blob) == record.turn("resp_x")  # a continuation's read of an earlier turn


@pytest.mark.parametrize("chain", [[], (), ["resp_a"], ("resp_a", "resp_b")], ids=str)
def test_a_record_is_one_dumps_per_line_whatever_the_chain(chain: Sequence[str]) -> None:
    """A first turn's empty chain is written without its dumps: the bytes are the dumps' all the same."""
    response = _response("resp_x", "hi")
    items = input_items("a question")
    lines = [chain, items, response["output"], {**response, "output": None}]
    assert encode(response, items, chain) == b"\n".join(orjson.dumps(line) for line in lines)
    assert decode(encode(response, items, chain)).chain == list(chain)


@pytest.mark.parametrize("output", ["kept", "absent", "not a list"])
def test_encoding_leaves_the_response_as_it_was_even_when_it_cannot_be_held(output: str) -> None:
    """encode writes the Response's other fields from the dict itself (its output null meanwhile):
    the caller's dict comes back with the same keys, values and order, a dumps that raised or not."""
    response: dict[str, Any] = {**_response("resp_x", "hi"), "usage": {"total_tokens": 3}}
    if output == "absent":
        del response["output"]
    elif output == "not a list":
        response["output"] = None
    before = orjson.dumps(response)
    lines = encode(response, [], ()).split(b"\n")
    assert orjson.dumps(response) == before
    assert orjson.loads(lines[2]) == (response["output"] if output == "kept" else [])
    assert orjson.loads(lines[3]) == {**response, "output": None}
    response["created_at"] = 2**70  # JSON (orjson) cannot hold it: the dumps raises
    held = repr(response)  # (not a dumps: it could not write this one either)
    with pytest.raises(TypeError):
        encode(response, [], ())
    assert repr(response) == held


async def test_a_response_json_cannot_hold_is_not_stored_without_raising(caplog: pytest.LogCaptureFixture) -> None:
    store = _store()
    await store.save("a", FinishedTurn({**_response("resp_big", "x"), "created_at": 2**70}, [], None))
    assert "resp_big was not stored" in caplog.text
    with pytest.raises(NotFoundError):
        await store.get("a", "resp_big")


async def test_memory_stores_in_several_workers_refuse_state_by_name() -> None:
    metrics = GatewayMetrics(["m"], ["b"])
    store = ConversationStore.from_config(ResponsesConfig(), metrics, workers=4)
    with pytest.raises(InvalidRequestError) as caught:
        store.check_storable()
    assert caught.value.param == "store" and "4 worker processes" in caught.value.message
    assert caught.value.code == "store_not_shared"
    with pytest.raises(InvalidRequestError) as continued:
        await store.conversation("a", "resp_x")
    assert continued.value.param == "previous_response_id"
    single = ConversationStore.from_config(ResponsesConfig(), metrics, workers=1)
    single.check_storable()


async def test_an_id_its_conversation_already_holds_is_not_stored(caplog: pytest.LogCaptureFixture) -> None:
    store = _store()
    (first,) = await _turns(store, "a", 1)
    await store.save("a", FinishedTurn(_response(first, "again"), input_items("q"), first))  # an upstream's reused id
    assert "already holds that id" in caplog.text
    assert _texts(await store.conversation("a", first)) == ["q0", "a0"]  # the first turn as it was


async def test_save_now_keeps_what_save_keeps_and_declines_what_it_would_wait_for() -> None:
    """The handler's hook saves a turn from its fields without awaiting (``save_now``): the same
    record as ``save``'s, or False, storing nothing, where there is something to await."""
    hook, seam = _store(), _store()
    hook_store, seam_store = hook.store, seam.store
    assert isinstance(hook_store, MemoryStore) and isinstance(seam_store, MemoryStore)
    first, second = _response("resp_1", "a0"), _response("resp_2", "a1")
    items = input_items("q0")
    assert hook.save_now("a", first, items, None, None)
    await seam.save("a", FinishedTurn(first, items, None))
    assert not hook.save_now("a", second, items, "resp_1", None)  # the chain is not known here: a read
    assert hook_store.stats().items == 1
    await hook.conversation("a", "resp_1")  # history() loads (and remembers) the chain
    assert hook.save_now("a", second, items, "resp_1", orjson.dumps(second))
    await seam.save("a", FinishedTurn(second, items, "resp_1"))
    assert hook_store.get_now("a", ["resp_1", "resp_2"]) == seam_store.get_now("a", ["resp_1", "resp_2"])
    assert (await hook.conversation("a", "resp_2")).chain == ["resp_1", "resp_2"]

    class Awaited(MemoryStore):  # a store whose writes are awaited (Redis's, say)
        pass

    awaited = ConversationStore(Awaited("responses", ttl=60, max_items=100, max_bytes=1 << 20))
    assert not awaited.save_now("a", first, items, None, None)
    assert not ConversationStore(None, unshared=2).save_now("a", first, items, None, None)
