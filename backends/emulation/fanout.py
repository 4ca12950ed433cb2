"""Fan-out: ``n``, ``best_of`` and prompt batches for upstreams that answer one prompt with one choice.

One machinery for both endpoints: completions (:func:`plan`: prompts x ``n``/``best_of``) and
chat (:func:`plan_n`: one conversation x ``n``). Past planning nothing here knows which: a
part's answer is a choice dict without its index (``text``/``message``/``delta``, ``logprobs``,
``finish_reason``, in the translator's key order; an ``index`` placeholder keeps its place),
and :func:`complete` / :class:`FanoutStream` only number, order, interleave and bill them.

The request is split into :class:`Part` objects by :mod:`backends.emulation.fanout_plan` (the
``n``, ``best_of``, greedy and prompt-batch rules, and the limits the router checks); this module
runs them.

Failure: the first part to fail cancels its siblings and its error is raised (so the
request fails over as a whole). Streams: every part is opened before :func:`open_streams`
returns; their chunks are interleaved as they arrive, each with its own index. Non-streaming
parts run at most :data:`CONCURRENCY` at a time per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import orjson

from backends.base import Call, CompletionStream, TokenUsage
from backends.emulation.best_of import pick_best_of

# The planning names stay importable from here (re-exported in __all__): the native backends
# take the whole fan-out from one module.
from backends.emulation.fanout_plan import (
    FANOUT_RULES,
    MAX_PARTS,
    MAX_STREAM_PARTS,
    Part,
    Plan,
    Req,
    plan,
    plan_n,
    too_many_parts,
)

__all__ = [
    "CONCURRENCY",
    "FANOUT_RULES",
    "MAX_PARTS",
    "MAX_STREAM_PARTS",
    "ChoiceStream",
    "FanoutStream",
    "Part",
    "PartResult",
    "Plan",
    "all_or_nothing",
    "complete",
    "open_streams",
    "part_call",
    "plan",
    "plan_n",
    "too_many_parts",
]

CONCURRENCY = 16

_T = TypeVar("_T")
_C = TypeVar("_C", bound=Call[Any])


@dataclass(slots=True)
class PartResult:
    choice: dict[str, Any]  # text or message, logprobs, finish_reason (no index, or a placeholder)
    usage: TokenUsage


# --- running parts ------------------------------------------------------------------------------


def part_call(call: _C, the_plan: Plan[Any], part: Part[Any]) -> _C:
    """The call one part sends upstream: ``call`` itself when it is the only part; otherwise a copy
    carrying the part's own trace (a child span, so each part's upstream request is visible)."""
    trace = call.trace
    if trace is None or len(the_plan.parts) == 1:
        return call
    return dataclasses.replace(call, trace=trace.part(part.prompt_index * the_plan.best_of + part.candidate))


async def _cancel(tasks: Sequence[asyncio.Future[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _all_or_nothing(
    calls: Sequence[Callable[[], Awaitable[_T]]],
    limit: int,
    discard: Callable[[_T], Awaitable[None]] | None = None,
) -> list[_T]:
    """Every call's result, or the first failure with the others cancelled (and ``discard``-ed)."""
    if len(calls) == 1:
        return [await calls[0]()]
    slots = asyncio.Semaphore(limit)

    async def run(call: Callable[[], Awaitable[_T]]) -> _T:
        async with slots:
            return await call()

    tasks = [asyncio.ensure_future(run(call)) for call in calls]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:
        await _cancel(tasks)
        raise
    failed = next((t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None), None)
    if failed is None:
        return [t.result() for t in tasks]
    await _cancel(tasks)
    if discard is not None:
        for task in tasks:
            if not task.cancelled() and task.exception() is None:
                await discard(task.result())
    raise cast(BaseException, failed.exception())


all_or_nothing = _all_or_nothing  # for the other fan-outs (an embeddings batch split into parts)


def _usage(parts: Sequence[Part[Any]], usages: Sequence[TokenUsage | None]) -> TokenUsage:
    """Prompt tokens once per prompt (from its first part), completion tokens of every part."""
    prompt = completion = 0
    for part, usage in zip(parts, usages, strict=True):
        if usage is None:
            continue
        if part.candidate == 0:
            prompt += usage.prompt_tokens
        completion += usage.completion_tokens * part.copies
    return TokenUsage(prompt, completion)


def _indexed(choice: dict[str, Any], index: int) -> dict[str, Any]:
    """The choice numbered ``index`` (an ``index`` placeholder in ``choice`` keeps its position)."""
    return {**choice, "index": index}


async def complete(
    the_plan: Plan[Req], one: Callable[[Part[Req]], Awaitable[PartResult]]
) -> tuple[list[dict[str, Any]], TokenUsage]:
    """Every part, concurrently; the choices in index order and the request's usage."""
    parts = the_plan.parts
    results = await _all_or_nothing([functools.partial(one, part) for part in parts], CONCURRENCY)
    usage = _usage(parts, [r.usage for r in results])
    if the_plan.rank:
        candidates = [
            _indexed(r.choice, part.prompt_index * the_plan.best_of + part.candidate)
            for part, r in zip(parts, results, strict=True)
        ]
        picked = pick_best_of(candidates, best_of=the_plan.best_of, n=the_plan.n, keep_logprobs=the_plan.keep_logprobs)
        return picked, usage
    choices = [_indexed(r.choice, index) for part, r in zip(parts, results, strict=True) for index in part.indexes]
    choices.sort(key=lambda c: int(c["index"]))
    return choices, usage


# --- streams ----------------------------------------------------------------------------------------


class ChoiceStream(ABC):
    """One part's choice deltas (dicts without ``index``).

    ``next()`` returns a non-empty list, or raises ``StopAsyncIteration`` once the
    upstream ended cleanly, or an ``UpstreamError``; ``done`` turns true with the batch
    that holds the final delta, and ``usage`` is known from then on. ``aclose()`` is
    idempotent and releases the upstream.
    """

    usage: TokenUsage | None = None
    done: bool = False

    @abstractmethod
    async def next(self) -> list[dict[str, Any]]: ...

    @abstractmethod
    async def aclose(self) -> None: ...


async def open_streams(
    the_plan: Plan[Req], open_one: Callable[[Part[Req]], Awaitable[ChoiceStream]]
) -> list[ChoiceStream]:
    """Every part's stream, opened concurrently; on a failure the opened ones are closed."""

    async def close(stream: ChoiceStream) -> None:
        await stream.aclose()

    calls = [functools.partial(open_one, part) for part in the_plan.parts]
    return await _all_or_nothing(calls, len(calls), discard=close)


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class FanoutStream(CompletionStream):
    """The parts' deltas as OpenAI chunks, interleaved as they arrive; owns the part streams.

    One part is read directly; several are read by one task each into a bounded queue,
    so a slow client slows the upstreams instead of growing memory. The first part to
    fail ends the stream with its error (after the chunks that arrived before it) and
    cancels the rest. Usage (and the ``include_usage`` chunk) comes once all parts ended.
    """

    def __init__(
        self,
        the_plan: Plan[Any],
        streams: Sequence[ChoiceStream],
        head: dict[str, Any],
        *,
        include_usage: bool,
    ) -> None:
        self._parts = the_plan.parts
        self._streams = list(streams)
        self._head = head
        self._include_usage = include_usage
        self._left = len(streams)
        self._queue: asyncio.Queue[tuple[int, list[dict[str, Any]], bool, BaseException | None]] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: BaseException | None = None
        self._closed = False
        self.usage = None
        self.finished = False

    def _render(self, part: Part[Any], choices: list[dict[str, Any]], out: list[bytes]) -> None:
        head = self._head
        for choice in choices:
            for index in part.indexes:
                out.append(
                    _sse({**head, "choices": [_indexed(choice, index)], "system_fingerprint": None, "usage": None})
                )

    def _finish(self, out: list[bytes]) -> None:
        self.finished = True
        self.usage = _usage(self._parts, [s.usage for s in self._streams])
        if self._include_usage:
            out.append(_sse({**self._head, "choices": [], "system_fingerprint": None, "usage": self.usage.as_json()}))

    async def __anext__(self) -> bytes:
        if self.finished or self._closed:
            raise StopAsyncIteration
        error = self._pending
        if error is not None:
            self._pending = None
            await self.aclose()
            raise error
        out: list[bytes] = []
        if len(self._streams) == 1:
            stream = self._streams[0]
            try:
                self._render(self._parts[0], await stream.next(), out)
            except StopAsyncIteration:
                pass
            if stream.done:
                self._finish(out)
            return b"".join(out) if out else await self.__anext__()
        queue = self._queue
        if queue is None:
            queue = self._queue = asyncio.Queue(maxsize=2 * len(self._streams))
            self._tasks = [asyncio.ensure_future(self._pump(i, s, queue)) for i, s in enumerate(self._streams)]
        items = [await queue.get()]
        while not queue.empty():
            items.append(queue.get_nowait())
        for i, choices, done, error in items:
            if error is not None:
                self._pending = error
                break
            self._render(self._parts[i], choices, out)
            self._left -= done
        if self._left == 0 and self._pending is None:
            self._finish(out)
        if out:
            return b"".join(out)
        return await self.__anext__()

    @staticmethod
    async def _pump(
        i: int, stream: ChoiceStream, queue: asyncio.Queue[tuple[int, list[dict[str, Any]], bool, BaseException | None]]
    ) -> None:
        try:
            while True:
                choices = await stream.next()
                await queue.put((i, choices, stream.done, None))
                if stream.done:
                    return
        except StopAsyncIteration:
            await queue.put((i, [], True, None))
        except Exception as exc:  # an UpstreamError (or a bug): the consumer raises it
            await queue.put((i, [], True, exc))

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._tasks:
            await _cancel(self._tasks)
        for stream in self._streams:
            await stream.aclose()
