"""Gateway-side emulation of Completions features an upstream lacks, on OpenAI-shaped data.

Backend-agnostic: every function takes and returns plain ``text_completion``
dicts (``choices``, ``logprobs``, ``usage``) so any adapter whose upstream
returns token logprobs can use them. Nothing here does I/O.

- **best_of** (OpenAI: "generates best_of completions server-side and returns the
  best, the one with the highest log probability per token"): the adapter asks
  the upstream for ``n = best_of`` candidates with token logprobs, then
  :func:`pick_best_of` ranks each prompt's candidates by their *mean* token
  logprob (ties keep upstream order), keeps the top ``n``, renumbers them
  (``index = prompt * n + i``) and strips the logprobs the client did not ask
  for. Usage is the upstream's: it already counts every candidate's completion
  tokens, which is how OpenAI bills best_of.
- **n > 1 at temperature 0** (OpenAI allows it; some upstreams refuse it): greedy
  decoding is deterministic, so one choice per prompt is generated and
  :func:`replicate_choices` repeats it ``n`` times; :func:`scale_usage` bills the
  completion tokens ``n`` times, as if they had been generated. Streams get the
  same treatment event by event in :class:`ReplicatedStream`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import orjson

from backends.base import CompletionStream, TokenUsage
from backends.errors import UpstreamProtocolError

__all__ = [
    "GREEDY_EPSILON",
    "ReplicatedStream",
    "is_greedy",
    "mean_token_logprob",
    "pick_best_of",
    "replicate_choices",
    "scale_usage",
]

# Temperatures below this are greedy decoding (vLLM's _SAMPLING_EPS).
GREEDY_EPSILON = 1e-5


def is_greedy(temperature: float | None) -> bool:
    """An explicit temperature of (about) zero; unset means the upstream's default, not greedy."""
    return temperature is not None and temperature < GREEDY_EPSILON


def mean_token_logprob(choice: dict[str, Any], skip: int = 0) -> float:
    """Mean logprob of a choice's generated tokens; ``skip`` leading entries are the echoed prompt.

    A choice without usable logprobs ranks last (``-inf``).
    """
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return -math.inf
    values = logprobs.get("token_logprobs")
    if not isinstance(values, list):
        return -math.inf
    total = 0.0
    count = 0
    for value in values[skip:]:
        if isinstance(value, int | float):
            total += value
            count += 1
    return total / count if count else -math.inf


def pick_best_of(
    choices: Sequence[dict[str, Any]],
    *,
    best_of: int,
    n: int,
    keep_logprobs: bool,
    prompt_tokens: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """The top ``n`` of each prompt's ``best_of`` candidates, renumbered.

    ``choices`` carry ``index = prompt * best_of + i`` (the upstream's numbering
    for ``n = best_of``). ``prompt_tokens[p]``, when given, is how many leading
    logprob entries of prompt ``p``'s candidates belong to the echoed prompt.
    """
    groups: dict[int, list[dict[str, Any]]] = {}
    for choice in sorted(choices, key=lambda c: int(c.get("index", 0))):
        groups.setdefault(int(choice.get("index", 0)) // best_of, []).append(choice)
    picked: list[dict[str, Any]] = []
    for prompt, candidates in sorted(groups.items()):
        skip = prompt_tokens[prompt] if prompt_tokens is not None and prompt < len(prompt_tokens) else 0
        # sorted() is stable: equal means keep the upstream's order.
        ranked = sorted(candidates, key=lambda c: mean_token_logprob(c, skip), reverse=True)
        for i, choice in enumerate(ranked[:n]):
            kept = dict(choice)
            kept["index"] = prompt * n + i
            if not keep_logprobs:
                kept["logprobs"] = None
            picked.append(kept)
    return picked


def replicate_choices(choices: Sequence[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Each prompt's single choice (``index = prompt``) repeated ``n`` times (``index = prompt * n + i``)."""
    out: list[dict[str, Any]] = []
    for choice in sorted(choices, key=lambda c: int(c.get("index", 0))):
        prompt = int(choice.get("index", 0))
        for i in range(n):
            copy = dict(choice)  # logprobs are shared read-only between the copies
            copy["index"] = prompt * n + i
            out.append(copy)
    return out


def scale_usage(usage: Any, factor: int) -> Any:
    """``usage`` with completion tokens counted ``factor`` times (prompt tokens once)."""
    if not isinstance(usage, dict) or factor == 1:
        return usage
    completion = usage.get("completion_tokens")
    prompt = usage.get("prompt_tokens")
    if not isinstance(completion, int) or not isinstance(prompt, int):
        return usage
    scaled = dict(usage)
    scaled["completion_tokens"] = completion * factor
    scaled["total_tokens"] = prompt + completion * factor
    return scaled


class ReplicatedStream(CompletionStream):
    """A stream of one greedy choice per prompt, replayed to the client as ``n`` identical choices.

    Wraps a relayed stream (already renamed and normalised); each of its events is
    parsed and re-serialised with every choice repeated ``n`` times and usage
    scaled. Only requests that need the emulation pay for the parse.
    ``aclose()`` closes the wrapped stream.
    """

    def __init__(self, inner: CompletionStream, n: int, backend: str) -> None:
        self._inner = inner
        self._n = n
        self._backend = backend

    @property
    def finished(self) -> bool:  # type: ignore[override]
        return self._inner.finished

    @property
    def usage(self) -> TokenUsage | None:  # type: ignore[override]
        usage = self._inner.usage
        if usage is None:
            return None
        return TokenUsage(usage.prompt_tokens, usage.completion_tokens * self._n)

    async def __anext__(self) -> bytes:
        block = await self._inner.__anext__()
        out: list[bytes] = []
        for event in block.split(b"\n\n"):
            if not event.strip():
                continue
            data = b"\n".join(line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:"))
            if not data:
                continue
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                raise UpstreamProtocolError(
                    "the upstream sent a stream event that is not JSON", backend=self._backend, reason="stream_garbage"
                ) from None
            if isinstance(obj, dict):
                if isinstance(obj.get("choices"), list) and obj["choices"]:
                    obj["choices"] = replicate_choices(obj["choices"], self._n)
                if obj.get("usage") is not None:
                    obj["usage"] = scale_usage(obj["usage"], self._n)
            out.append(b"data: " + orjson.dumps(obj) + b"\n\n")
        return b"".join(out)

    async def aclose(self) -> None:
        await self._inner.aclose()
