"""Fan-out planning: how ``n``, ``best_of`` and prompt batches split a request into parts.

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

Limits (:data:`FANOUT_RULES`, checked by the router): at most :data:`MAX_PARTS` parts
(:data:`MAX_STREAM_PARTS` when streaming, since all are open at once); non-streaming
parts run at most :data:`backends.emulation.fanout.CONCURRENCY` at a time per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from backends.capabilities import Rule
from backends.emulation.best_of import is_greedy
from schemas.chat import ChatCompletionRequest
from schemas.completions import INT64_MAX, CompletionRequest

__all__ = [
    "FANOUT_RULES",
    "MAX_PARTS",
    "MAX_STREAM_PARTS",
    "Part",
    "Plan",
    "part_count",
    "plan",
    "plan_n",
    "too_many_parts",
]

MAX_PARTS = 256
MAX_STREAM_PARTS = 32

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
