"""The ``mock`` backend's completions SIMULATOR: deterministic text without any model.

Use it to run and load-test the gateway with no upstream. Nothing here is a language model:
tokens are words drawn from a small fixed vocabulary, each rendered as ``" word"``.

Determinism: the text of a choice is a function of the prompt (text or token ids), ``seed``
(``None`` counts as a value too), the candidate's index and ``temperature``: a ``random.Random``
seeded by a BLAKE2b hash of those, never Python's salted ``hash()``. The simulator accepts the
OpenAI sampling parameters (``temperature``, ``top_p``, penalties, ``logit_bias``, ``user``) but
they do not change the text, except ``temperature == 0``, which drops the index from the hash so
that every choice of one prompt is identical (greedy). vLLM's extras and ``suffix`` are unsupported,
except ``response_format`` ``json_object`` / ``json_schema``: the text is then a JSON value (of the
schema), as the chat simulator writes it, cut by ``max_tokens`` like a model's.

Honoured: ``max_tokens`` (default 16; 0 gives an empty completion with ``finish_reason`` "length"),
``n``, prompt batches (``index = prompt_index * n + i``), ``stop`` (text cut before the first stop
sequence, ``finish_reason`` "stop"; otherwise "length"), ``echo``, ``logprobs``, ``best_of`` and
``stream_options.include_usage``. A text prompt counts one token per whitespace-separated word
(at least 1), a token-id prompt one per id; ``echo`` renders token ids as decimal numbers joined by
spaces. With ``logprobs=k`` every position lists the chosen token, always the most likely, plus
``k - 1`` alternatives (so ``max(k, 1)`` entries); echoed prompt tokens come first, the first with
``null`` logprobs, as in OpenAI's and vLLM's answers. ``best_of > n`` keeps the ``n`` candidates with
the highest mean token logprob, best first; usage counts every candidate's tokens. Like a real
server, a request whose prompt plus ``max_tokens`` exceeds :data:`MOCK_CONTEXT_LENGTH` is refused.

Streams send one event per token per choice (choices interleaved step by step), after
``first_token_delay_ms`` and then ``token_delay_ms`` per step; without delays all events are
coalesced into few large writes. Answers carry ``system_fingerprint: "mock-simulator"``.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import re
import time
import uuid
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, cast

import orjson

from backends.base import CompletionResult, CompletionStream, TokenUsage, UpstreamCall
from backends.mock.json_schema import instance
from backends.native.common import first_stop
from schemas.chat_messages import JSONSchemaResponseFormat
from schemas.completions import DEFAULT_MAX_TOKENS, CompletionRequest, Prompt
from schemas.errors import InvalidRequestError

__all__ = [
    "FINGERPRINT",
    "MOCK_CONTEXT_LENGTH",
    "VOCAB",
    "MockStream",
    "complete_text",
    "stream_text",
]

MOCK_CONTEXT_LENGTH = 8192  # simulated max_model_len: bounds the work one request can ask for
FINGERPRINT = "mock-simulator"

VOCAB = tuple(
    "the a of and to in is it that was for on with as by at from this model token text data stream "
    "gateway request answer simple quick brown fox lazy dog river stone light".split()
)
_FLUSH_BYTES = 64 * 1024  # without delays, coalesce events into writes of about this size


def _rng(*parts: Any) -> random.Random:
    digest = hashlib.blake2b(orjson.dumps(parts), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


def _top(seed: int, token: str, logprob: float, k: int) -> dict[str, float]:
    """The chosen token (the most likely) and ``k - 1`` less likely alternatives, total mass <= 1."""
    top = {token: logprob}
    if k > 1:
        rng = random.Random(seed)
        p, rest = math.exp(logprob), -math.expm1(logprob)
        words = [w for w in (" " + v for v in rng.sample(VOCAB, k)) if w != token][: k - 1]
        for i, word in enumerate(words, 1):
            q = min(rest * rng.uniform(0.5, 1.0) * 0.5**i, p * 0.9**i)
            top[word] = math.log(max(q, 1e-12))
    return top


@dataclass(slots=True)
class _Choice:
    """One candidate: its text as tokens (echoed prompt tokens first) and their logprobs."""

    tokens: list[str]
    logprobs: list[float | None]
    tops: list[dict[str, float] | None]
    n_echo: int  # how many leading tokens are the echoed prompt
    generated: int  # completion tokens the simulator produced (usage), including any cut by stop
    finish_reason: str  # "stop" or "length"
    index: int = 0

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    @property
    def score(self) -> float:
        """Mean logprob of the completion tokens (``best_of`` ranking)."""
        own = [lp for lp in self.logprobs[self.n_echo :] if lp is not None]
        return sum(own) / len(own) if own else 0.0

    def logprobs_json(self, lo: int, hi: int, starts: list[int]) -> dict[str, Any]:
        """Legacy logprobs of tokens ``lo:hi``; ``starts`` comes from :meth:`offsets`."""
        return {
            "tokens": self.tokens[lo:hi],
            "token_logprobs": self.logprobs[lo:hi],
            "top_logprobs": self.tops[lo:hi],
            "text_offset": starts[lo:hi],
        }

    def offsets(self) -> list[int]:
        return list(accumulate((len(t) for t in self.tokens), initial=0))


def _prompts(prompt: Prompt) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(item, int) for item in prompt):
        return [cast(list[int], prompt)]
    return cast(list[str | list[int]], list(prompt))


def _prompt_tokens(prompt: str | list[int]) -> list[str]:
    """The prompt as it is echoed, split into its tokens."""
    if not isinstance(prompt, str):
        return [str(tid) if i == 0 else f" {tid}" for i, tid in enumerate(prompt)]
    tokens = re.findall(r"\s*\S+", prompt)
    trailing = prompt[sum(len(t) for t in tokens) :]
    if trailing:
        tokens = [*tokens[:-1], tokens[-1] + trailing] if tokens else [trailing]
    return tokens


def _prompt_len(prompt: str | list[int]) -> int:
    return max(1, len(prompt.split())) if isinstance(prompt, str) else len(prompt)


def _echo(prompt: str | list[int], k: int) -> tuple[list[str], list[float | None], list[dict[str, float] | None]]:
    """The echoed prompt's tokens; the first has no logprob, as in OpenAI's and vLLM's answers."""
    tokens = _prompt_tokens(prompt)
    rng = _rng("prompt", prompt)
    draws = [(math.log(rng.uniform(0.01, 0.9)), rng.getrandbits(64)) for _ in tokens[1:]]
    first: list[None] = [None] if tokens else []
    logprobs: list[float | None] = [*first, *(lp for lp, _ in draws)]
    tops: list[dict[str, float] | None] = [
        *first,
        *(_top(sub, token, lp, k) for token, (lp, sub) in zip(tokens[1:], draws, strict=True)),
    ]
    return tokens, logprobs, tops


def _json_script(req: CompletionRequest, rng: random.Random) -> list[str] | None:
    """A JSON ``response_format``'s whole answer in tokens of up to 4 characters (None: free text):
    a value of the schema, or a small object for ``json_object``, as the chat simulator writes them."""
    fmt = req.response_format
    if isinstance(fmt, JSONSchemaResponseFormat):
        value: Any = instance(fmt.json_schema.schema_ or {}, rng)
    elif fmt is not None and fmt.type == "json_object":
        value = {"answer": " ".join(rng.choice(VOCAB) for _ in range(3)), "confidence": round(rng.random(), 2)}
    else:
        return None
    text = orjson.dumps(value).decode()
    return [text[i : i + 4] for i in range(0, len(text), 4)]


def _generate(prompt: str | list[int], candidate: int, req: CompletionRequest) -> _Choice:
    k = req.logprobs or 0
    rng = _rng(prompt, req.seed, None if req.temperature == 0 else candidate)
    tokens: list[str] = []
    logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    limit = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    script = _json_script(req, rng)
    for i in range(limit if script is None else min(limit, len(script))):
        # The same three draws whatever ``logprobs`` is, so it never changes the text.
        word, logprob, sub = " " + rng.choice(VOCAB), math.log(rng.uniform(0.05, 0.99)), rng.getrandbits(64)
        if script is not None:
            word = script[i]
        tokens.append(word)
        logprobs.append(logprob)
        tops.append(_top(sub, word, logprob, k))
    # A JSON answer ends when its value is complete ("stop"), or is cut by max_tokens as a model's would be.
    generated, finish = len(tokens), "stop" if script is not None and len(tokens) == len(script) else "length"
    text = "".join(tokens)
    match = first_stop(text, [req.stop] if isinstance(req.stop, str) else (req.stop or []))
    if match is not None:
        start, end = match
        ends = list(accumulate(len(t) for t in tokens))
        finish = "stop"
        generated = bisect_left(ends, end) + 1  # the token that completed the stop sequence was generated
        cut = bisect_right(ends, start)  # tokens wholly before the stop sequence
        partial = text[ends[cut - 1] if cut else 0 : start]  # what precedes it inside the token it starts in
        if partial:  # keep that prefix as a shortened last token, with that token's logprobs
            whole, tokens[cut] = tokens[cut], partial
            alternatives = {w: v for w, v in (tops[cut] or {}).items() if w != whole}
            tops[cut] = {partial: cast(float, logprobs[cut]), **alternatives}
            cut += 1
        tokens, logprobs, tops = tokens[:cut], logprobs[:cut], tops[:cut]
    n_echo = 0
    if req.echo:
        echo_tokens, echo_logprobs, echo_tops = _echo(prompt, k)
        n_echo = len(echo_tokens)
        tokens, logprobs, tops = echo_tokens + tokens, echo_logprobs + logprobs, echo_tops + tops
    return _Choice(tokens, logprobs, tops, n_echo, generated, finish)


def _simulate(req: CompletionRequest) -> tuple[list[_Choice], TokenUsage]:
    """Every returned choice (indexed) and the usage of the whole request."""
    n = req.effective_n
    candidates = max(req.best_of or n, n)
    max_tokens = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    choices: list[_Choice] = []
    prompt_tokens = completion_tokens = 0
    for p_index, prompt in enumerate(_prompts(req.prompt)):
        length = _prompt_len(prompt)
        if length + max_tokens > MOCK_CONTEXT_LENGTH:
            raise InvalidRequestError(
                f"This model's maximum context length is {MOCK_CONTEXT_LENGTH} tokens. However, you requested "
                f"{length + max_tokens} tokens ({length} in the prompt, {max_tokens} in the completion).",
                param="max_tokens",
            )
        prompt_tokens += length
        pool = [_generate(prompt, c, req) for c in range(candidates)]
        completion_tokens += sum(c.generated for c in pool)
        if candidates > n:
            pool = sorted(pool, key=lambda c: c.score, reverse=True)[:n]
        for i, choice in enumerate(pool):
            choice.index = p_index * n + i
            choices.append(choice)
    return choices, TokenUsage(prompt_tokens, completion_tokens)


def _head(call: UpstreamCall) -> dict[str, Any]:
    return {
        "id": f"cmpl-mock-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": call.public_model,
    }


class MockStream(CompletionStream):
    """Pre-rendered SSE steps (one per token position), paced by the configured delays."""

    def __init__(self, steps: list[bytes], usage: TokenUsage, first_delay_s: float, delay_s: float) -> None:
        self._steps = steps
        self._next = 0
        self._final_usage = usage
        self._first_delay_s = first_delay_s
        self._delay_s = delay_s

    async def __anext__(self) -> bytes:
        if self._next >= len(self._steps):
            if self._next == len(self._steps):  # finished cleanly, not closed early
                self.usage = self._final_usage
            raise StopAsyncIteration
        delay = self._first_delay_s if self._next == 0 else self._delay_s
        if delay > 0:
            await asyncio.sleep(delay)
        if self._delay_s > 0:  # paced: one token step per write
            chunk, self._next = self._steps[self._next], self._next + 1
        else:  # unpaced: coalesce steps into large writes
            parts, size = [], 0
            while self._next < len(self._steps) and size < _FLUSH_BYTES:
                parts.append(self._steps[self._next])
                size += len(parts[-1])
                self._next += 1
            chunk = b"".join(parts)
        if self._next == len(self._steps):
            self.usage = self._final_usage
        return chunk

    async def aclose(self) -> None:
        if self._next < len(self._steps):
            self._next = len(self._steps) + 1  # closed early: no more events, no usage


def complete_text(call: UpstreamCall) -> CompletionResult:
    """The ``text_completion`` answer to a completions call."""
    choices, usage = _simulate(call.request)
    k = call.request.logprobs
    body = {
        **_head(call),
        "choices": [
            {
                "text": c.text,
                "index": c.index,
                "logprobs": None if k is None else c.logprobs_json(0, len(c.tokens), c.offsets()),
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        "system_fingerprint": FINGERPRINT,
        "usage": usage.as_json(),
    }
    return CompletionResult(body=orjson.dumps(body), usage=usage)


def stream_text(call: UpstreamCall, first_delay_s: float, delay_s: float) -> MockStream:
    """The streamed answer to a completions call: one step per token position."""
    req = call.request
    choices, usage = _simulate(req)
    head = _head(call)
    per_choice: list[list[dict[str, Any]]] = []
    for c in choices:
        starts = c.offsets()
        spans = ([(0, c.n_echo)] if c.n_echo else []) + [(j, j + 1) for j in range(c.n_echo, len(c.tokens))]
        spans = spans or [(0, 0)]
        per_choice.append(
            [
                {
                    "text": "".join(c.tokens[lo:hi]),
                    "index": c.index,
                    "logprobs": None if req.logprobs is None else c.logprobs_json(lo, hi, starts),
                    "finish_reason": c.finish_reason if s == len(spans) - 1 else None,
                }
                for s, (lo, hi) in enumerate(spans)
            ]
        )
    steps: list[bytes] = []
    for step in range(max(len(events) for events in per_choice)):
        steps.append(
            b"".join(
                _sse({**head, "choices": [events[step]], "system_fingerprint": FINGERPRINT, "usage": None})
                for events in per_choice
                if step < len(events)
            )
        )
    if req.stream_options is not None and req.stream_options.include_usage:
        steps[-1] += _sse({**head, "choices": [], "system_fingerprint": FINGERPRINT, "usage": usage.as_json()})
    return MockStream(steps, usage, first_delay_s, delay_s)


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"
