"""Fan-out: ``n``, ``best_of`` and prompt batches for upstreams that answer one prompt with one choice.

One machinery for both endpoints: completions (:func:`plan`: prompts x ``n``/``best_of``) and
chat (:func:`plan_n`: one conversation x ``n``). Past planning nothing here knows which: a
part's answer is a choice dict without its index (``text``/``message``/``delta``, ``logprobs``,
``finish_reason``, in the translator's key order; an ``index`` placeholder keeps its place),
and :func:`complete` / :class:`FanoutStream` only number, order, interleave and bill them.

A request is split into :class:`Part`s, each one prompt and one choice, sent concurrently:

- ``n`` choices per prompt: ``n`` parts; with a ``seed``, part ``i`` gets ``seed + i``, so
  the choices differ and the whole answer is still reproducible (part 0 keeps the
  client's seed: ``n: 1`` answers exactly what a direct request would);
- ``temperature: 0``: greedy decoding gives every choice the same text, so one part per
  prompt is sent and its choice repeated ``n`` times; usage bills the completion tokens
  once per choice (``backends.emulation.best_of`` does the same for vLLM);
- ``best_of > n``: ``best_of`` candidate parts per prompt, with token logprobs, ranked by
  :func:`backends.emulation.best_of.pick_best_of` (mean token logprob); usage counts every
  candidate, as OpenAI bills it;
- several prompts: choice ``index = prompt_index * n + i``, OpenAI's numbering; prompt
  tokens are counted once per prompt, not once per part.

Failure: the first part to fail cancels its siblings and its error is raised (so the
request fails over as a whole). Streams: every part is opened before :func:`open_streams`
returns; their chunks are interleaved as they arrive, each with its own index.

Limits (:data:`FANOUT_RULES`, checked by the router): at most :data:`MAX_PARTS` parts
(:data:`MAX_STREAM_PARTS` when streaming, since all are open at once); non-streaming
parts run at most :data:`CONCURRENCY` at a time per request.
"""

from __future__ import annotations

import asyncio
import functools
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import orjson

from backends.base import CompletionStream, TokenUsage
from backends.capabilities import Rule
from backends.emulation.best_of import is_greedy, pick_best_of
from schemas.chat import ChatCompletionRequest
from schemas.completions import INT64_MAX, CompletionRequest

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
    "complete",
    "open_streams",
    "plan",
    "plan_n",
    "too_many_parts",
]

MAX_PARTS = 256
MAX_STREAM_PARTS = 32
CONCURRENCY = 16

_T = TypeVar("_T")
Req = TypeVar("Req", CompletionRequest, ChatCompletionRequest)


@dataclass(frozen=True, slots=True)
class Part(Generic[Req]):
    request: Req  # one prompt (or conversation), n and best_of unset, seed varied
    prompt_index: int
    candidate: int
    indexes: tuple[int, ...]  # the choice indexes it answers (empty: a best_of candidate, placed by rank)
    copies: int = 1  # completion tokens billed this many times (greedy replication)


@dataclass(frozen=True, slots=True)
class Plan(Generic[Req]):
    parts: tuple[Part[Req], ...]
    n: int
    best_of: int  # candidates per prompt
    rank: bool  # best_of > n: rank the candidates
    keep_logprobs: bool


@dataclass(slots=True)
class PartResult:
    choice: dict[str, Any]  # text or message, logprobs, finish_reason (no index, or a placeholder)
    usage: TokenUsage


def _prompts(request: CompletionRequest) -> list[str | list[int]]:
    prompt = request.prompt
    if isinstance(prompt, str) or not isinstance(prompt[0], str | list):
        return [prompt]
    return list(prompt)


def _seed(seed: int | None, offset: int) -> int | None:
    if seed is None or offset == 0:
        return seed
    return (seed + offset + INT64_MAX + 1) % 2**64 - INT64_MAX - 1  # stays within int64


def _shape(request: CompletionRequest) -> tuple[int, int, int, bool]:
    """``(n, best_of, parts per prompt, greedy)``."""
    n = request.effective_n
    best_of = max(request.best_of or n, n)
    greedy = best_of > 1 and is_greedy(request.temperature)
    return n, best_of, 1 if greedy else best_of, greedy


def part_count(request: CompletionRequest) -> int:
    return request.prompt_count * _shape(request)[2]


def plan(request: CompletionRequest) -> Plan[CompletionRequest]:
    n, best_of, per_prompt, greedy = _shape(request)
    rank = best_of > n and not greedy
    prompts = _prompts(request)
    if len(prompts) == 1 and per_prompt == 1 and request.n is None and request.best_of is None:
        return Plan((Part(request, 0, 0, (0,)),), 1, 1, False, request.logprobs is not None)
    logprobs = request.logprobs if request.logprobs is not None or not rank else 0
    parts: list[Part[CompletionRequest]] = []
    for p, prompt in enumerate(prompts):
        for c in range(per_prompt):
            sub = request.model_copy(
                update={
                    "prompt": prompt,
                    "n": None,
                    "best_of": None,
                    "seed": _seed(request.seed, c),
                    "logprobs": logprobs,
                }
            )
            if greedy:
                parts.append(Part(sub, p, 0, tuple(range(p * n, p * n + n)), copies=best_of))
            else:
                parts.append(Part(sub, p, c, () if rank else (p * n + c,)))
    return Plan(tuple(parts), n, best_of, rank, request.logprobs is not None)


def plan_n(request: ChatCompletionRequest) -> Plan[ChatCompletionRequest]:
    """``n`` choices of one conversation: the completions rules for one prompt without ``best_of``.

    ``n`` parts with seeds ``seed + i`` (part 0 keeps the client's request as it is), or
    one part repeated ``n`` times at ``temperature: 0`` (greedy answers are identical).
    """
    n = request.effective_n
    if n == 1:
        return Plan((Part(request, 0, 0, (0,)),), 1, 1, False, bool(request.logprobs))
    if is_greedy(request.temperature):
        sub = request.model_copy(update={"n": None})
        return Plan((Part(sub, 0, 0, tuple(range(n)), copies=n),), n, n, False, bool(request.logprobs))
    parts = tuple(
        Part(request.model_copy(update={"n": None, "seed": _seed(request.seed, c)}), 0, c, (c,)) for c in range(n)
    )
    return Plan(parts, n, n, False, bool(request.logprobs))


def too_many_parts(parts: int, *, stream: bool) -> bool:
    """Whether a request needs more upstream requests than the gateway fans out."""
    return parts > (MAX_STREAM_PARTS if stream else MAX_PARTS)


def _too_many_prompts(request: CompletionRequest) -> bool:
    return too_many_parts(request.prompt_count, stream=bool(request.stream))


def _too_many_parts(request: CompletionRequest) -> bool:
    return too_many_parts(part_count(request), stream=bool(request.stream))


FANOUT_RULES = (
    Rule(
        "prompt",
        f"more prompts than the gateway fans out (one upstream request each, at most {MAX_PARTS}; "
        f"{MAX_STREAM_PARTS} when streaming)",
        _too_many_prompts,
    ),
    Rule(
        "n",
        f"prompts x max(n, best_of) above the gateway's fan-out limit ({MAX_PARTS} upstream requests; "
        f"{MAX_STREAM_PARTS} when streaming)",
        _too_many_parts,
    ),
)


# --- running parts ------------------------------------------------------------------------------


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
