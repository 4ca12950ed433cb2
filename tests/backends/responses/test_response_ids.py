"""Response and item ids (backends/responses/answer.py new_id): OpenAI's shape, never repeated, across
the pools of random bytes they are cut from and across a fork."""

from __future__ import annotations

import os
import re

import pytest

from backends.responses.answer import new_id


def test_ids_are_openai_shaped_and_never_repeat_across_pools() -> None:
    ids = [new_id("msg") for _ in range(1000)]  # ~4 pools of 256
    assert all(re.fullmatch(r"msg_[0-9a-f]{48}", i) for i in ids)
    assert len(set(ids)) == len(ids)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_never_takes_its_parents_next_id() -> None:
    new_id("resp")  # the pool is filled in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.write(write, new_id("resp").encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert re.fullmatch(r"resp_[0-9a-f]{48}", child) and child != new_id("resp")


def test_the_inline_mints_share_the_pool_and_never_repeat() -> None:
    """A Response's id, its message's and a stored turn's input's (taken from ID_DIGITS inline) with
    new_id's, across the pools' ends: OpenAI-shaped, all distinct."""
    from backends.responses.answer import ResponseFrame, output_items
    from backends.responses.capabilities import chat_request_of
    from gateway.flow.responses_turns import own_items
    from schemas.responses import ResponsesRequest

    request = ResponsesRequest.model_validate({"model": "m", "input": "hi"})
    names = chat_request_of(request)[1]
    ids: list[str] = []
    for _ in range(300):  # more than a pool: each kind crosses a refill
        frame = ResponseFrame(request, "m", names)
        ids += [frame.id, output_items(frame, {"content": "x"}, None, "completed")[0]["id"]]
        ids += [own_items(request)[0]["id"], new_id("fc")]
    assert all(re.fullmatch(r"(resp|msg|fc)_[0-9a-f]{48}", i) for i in ids)
    assert len({i.split("_", 1)[1] for i in ids}) == len(ids)
