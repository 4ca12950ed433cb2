"""``backends.emulation.fanout`` with scripted parts: plans, indexes, seeds, ranking, cancellation, interleaving."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from backends.base import TokenUsage
from backends.emulation import fanout
from backends.emulation.fanout import ChoiceStream, FanoutStream, Part, PartResult
from backends.errors import UpstreamProtocolError, UpstreamStatusError
from schemas.completions import INT64_MAX, CompletionRequest


def req(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "Hi", **fields})


def choice(text: str, logprobs: list[float] | None = None, finish: str = "length") -> dict[str, Any]:
    lp = None
    if logprobs is not None:
        lp = {"tokens": [text] * len(logprobs), "token_logprobs": logprobs, "top_logprobs": None, "text_offset": []}
    return {"text": text, "logprobs": lp, "finish_reason": finish}


def test_single_part_reuses_the_request() -> None:
    request = req(seed=3)
    plan = fanout.plan(request)
    assert len(plan.parts) == 1 and plan.parts[0].request is request and plan.parts[0].indexes == (0,)


def test_prompts_times_n_indexes_and_seeds() -> None:
    plan = fanout.plan(req(prompt=["A", "B"], n=2, seed=INT64_MAX))
    got = [(p.request.prompt, p.indexes, p.request.seed, p.request.n) for p in plan.parts]
    assert got == [
        ("A", (0,), INT64_MAX, None),
        ("A", (1,), -(2**63), None),  # seed + 1 wraps within int64
        ("B", (2,), INT64_MAX, None),
        ("B", (3,), -(2**63), None),
    ]


def test_no_seed_stays_no_seed() -> None:
    assert {p.request.seed for p in fanout.plan(req(n=3)).parts} == {None}


def test_greedy_is_one_part_per_prompt_replicated() -> None:
    plan = fanout.plan(req(prompt=["A", "B"], n=3, best_of=4, temperature=0))
    assert [(p.indexes, p.copies) for p in plan.parts] == [((0, 1, 2), 4), ((3, 4, 5), 4)]
    assert not plan.rank


def test_best_of_plan_asks_candidates_for_logprobs() -> None:
    plan = fanout.plan(req(best_of=3))
    assert plan.rank and len(plan.parts) == 3
    assert {p.request.logprobs for p in plan.parts} == {0} and not plan.keep_logprobs


async def test_complete_ranks_best_of_and_bills_every_candidate() -> None:
    plan = fanout.plan(req(prompt=["A", "B"], n=1, best_of=2, logprobs=1))
    scores = {("A", 0): -2.0, ("A", 1): -0.5, ("B", 0): -0.1, ("B", 1): -3.0}

    async def one(part: Part) -> PartResult:
        key = (part.request.prompt, part.candidate)
        return PartResult(choice(f"{key[0]}{key[1]}", [scores[key]]), TokenUsage(5, 1))

    choices, usage = await fanout.complete(plan, one)
    assert [(c["index"], c["text"]) for c in choices] == [(0, "A1"), (1, "B0")]
    assert choices[0]["logprobs"] is not None  # the client asked for them
    assert (usage.prompt_tokens, usage.completion_tokens) == (10, 4)  # prompts once, candidates all


async def test_first_failure_cancels_the_siblings() -> None:
    plan = fanout.plan(req(n=3))
    cancelled: list[int] = []

    async def one(part: Part) -> PartResult:
        if part.candidate == 1:
            raise UpstreamStatusError(503, "busy", backend="b")
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(part.candidate)
            raise
        raise AssertionError("not reached")

    with pytest.raises(UpstreamStatusError):
        await asyncio.wait_for(fanout.complete(plan, one), 5)
    assert sorted(cancelled) == [0, 2]


class Scripted(ChoiceStream):
    """Yields the given batches (after ``delay`` each); an exception in the script is raised."""

    def __init__(self, script: list[Any], delay: float = 0.0) -> None:
        self.script = list(script)
        self.delay = delay
        self.closed = False

    async def next(self) -> list[dict[str, Any]]:
        await asyncio.sleep(self.delay)
        if not self.script:
            raise StopAsyncIteration
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        if not self.script:
            self.done = True
            self.usage = TokenUsage(3, 2)
        return list(item)

    async def aclose(self) -> None:
        self.closed = True


def events(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(e[6:]) for e in raw.split(b"\n\n") if e]


async def test_stream_interleaves_parts_with_their_indexes() -> None:
    plan = fanout.plan(req(prompt=["A", "B"], n=1, stream=True))
    parts = [
        Scripted([[choice("a1", finish=None)], [choice("a2", finish="stop")]], delay=0.01),
        Scripted([[choice("b1", finish="length")]]),
    ]
    stream = FanoutStream(
        plan, parts, {"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m"}, include_usage=True
    )
    raw = b""
    async for chunk in stream:
        raw += chunk
    await stream.aclose()
    got = events(raw)
    assert got[-1]["choices"] == [] and got[-1]["usage"] == {
        "prompt_tokens": 6,
        "completion_tokens": 4,
        "total_tokens": 10,
    }
    texts = {(e["choices"][0]["index"], e["choices"][0]["text"]) for e in got[:-1]}
    assert texts == {(0, "a1"), (0, "a2"), (1, "b1")}
    assert stream.finished and stream.usage == TokenUsage(6, 4)
    assert all(p.closed for p in parts)


async def test_stream_part_failure_ends_the_stream_and_closes_the_others() -> None:
    plan = fanout.plan(req(prompt=["A", "B"], stream=True))
    failing = Scripted([[choice("b1", finish=None)], UpstreamProtocolError("cut", reason="stream_cut")])
    slow = Scripted([[choice("a1", finish=None)], [choice("a2", finish="stop")]], delay=0.5)
    stream = FanoutStream(plan, [slow, failing], {"id": "c", "model": "m"}, include_usage=False)
    first = await stream.__anext__()
    assert events(first)[0]["choices"][0]["text"] == "b1"
    with pytest.raises(UpstreamProtocolError):
        await stream.__anext__()
    assert slow.closed and failing.closed and not stream.finished


async def test_open_streams_closes_the_opened_ones_on_failure() -> None:
    plan = fanout.plan(req(n=3, stream=True))
    opened: list[Scripted] = []

    async def open_one(part: Part) -> ChoiceStream:
        if part.candidate == 2:
            await asyncio.sleep(0.05)
            raise UpstreamStatusError(429, "slow down", backend="b")
        stream = Scripted([[choice("x")]])
        opened.append(stream)
        return stream

    with pytest.raises(UpstreamStatusError):
        await fanout.open_streams(plan, open_one)
    assert len(opened) == 2 and all(s.closed for s in opened)
