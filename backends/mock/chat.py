"""The chat SIMULATOR behind the ``mock`` backend: deterministic ``chat.completion`` answers, no model.

What a choice is, in order of precedence:

- **tool calls** when ``tools`` are given and ``tool_choice`` allows: ``"auto"`` (the default
  with tools) calls when the conversation does not end with a tool result, ``"required"`` and
  ``allowed_tools`` with ``mode: "required"`` always call, a named function is called alone.
  With ``parallel_tool_calls`` (default true) and two or more candidates, two calls are made.
  Arguments are JSON generated from each function's ``parameters`` schema
  (:func:`backends.mock.json_schema.instance`); ``finish_reason`` is ``"tool_calls"``, or ``"stop"``
  for a named choice (as OpenAI and vLLM answer). Only function tools are called.
  Scripted calls, for agents under test (the Codex CLI, agent SDKs): when the last user message
  names candidate tools (whole words), those are the ones called, in the order named; and a
  JSON object in that message is the first named tool's arguments (``run exec_command with
  {"cmd": "echo hi"}``).
- **JSON** for ``response_format`` ``json_schema`` (a value of the schema) or ``json_object``.
- **text** otherwise: 5 to 24 words and a full stop, ``finish_reason`` ``"stop"``.

Determinism: everything is drawn from a ``random.Random`` seeded by a BLAKE2b hash of the
messages, tools, response format, ``seed`` and the choice index (dropped when
``temperature == 0``, so greedy choices are identical). Only ``id`` and ``created`` vary,
unless the caller passes them.

Honoured: ``max_completion_tokens``/``max_tokens`` (output cut, ``finish_reason`` ``"length"``;
arguments cut mid-JSON, as a real server does), ``n``, ``stop`` (on text and JSON content),
``logprobs``/``top_logprobs`` (chat shape, content tokens only), ``stream_options.include_usage``,
and for text replies vLLM's ``min_tokens`` and ``ignore_eos`` (the reply runs to the token limit:
how benchmarks get fixed-length streams).
Tokens: text is split into words and punctuation; prompt tokens are the words of every message
plus 3 per message and 3 for the reply, roughly as OpenAI counts.

Streams follow OpenAI: one ``id``/``created`` for all chunks, ``role`` in each choice's first
delta, tool-call deltas with a stable ``index`` and ``id``/``type``/``name`` only in a call's
first delta, arguments in fragments, ``usage: null`` on every chunk but the final usage chunk
(``choices: []``, only with ``include_usage``), then ``data: [DONE]``.

The mock backend's chat translator is :func:`chat_result` / :func:`chat_stream` (a
:class:`~backends.base.ChatCall` in, the answer paced like the completions mock out);
:func:`complete_chat`, :func:`chat_chunks` and :func:`stream_chat` are the simulator itself.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from backends.base import ChatCall, CompletionResult, TokenUsage
from backends.mock.completions import FINGERPRINT, MOCK_CONTEXT_LENGTH, VOCAB, MockStream
from backends.mock.json_schema import instance
from schemas.chat import ChatCompletionRequest
from schemas.chat_messages import (
    AllowedToolsChoice,
    FunctionTool,
    JSONSchemaResponseFormat,
    NamedFunctionChoice,
    ToolMessage,
)
from schemas.errors import InvalidRequestError

__all__ = ["chat_chunks", "chat_result", "chat_stream", "complete_chat", "stream_chat"]

_TOKEN = re.compile(r"\s*[A-Za-z0-9_]+|\s*[^A-Za-z0-9_\s]|\s+$")


def _rng(*parts: Any) -> random.Random:
    digest = hashlib.blake2b(orjson.dumps(parts), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


def _tokens(text: str) -> list[str]:
    """Words (with their leading space) and single punctuation marks; joined they give ``text`` back."""
    return _TOKEN.findall(text)


@dataclass(slots=True)
class _Call:
    id: str
    name: str
    fragments: list[str]  # the arguments JSON as tokens (cut when max tokens ran out)

    @property
    def arguments(self) -> str:
        return "".join(self.fragments)


@dataclass(slots=True)
class _Choice:
    index: int
    content: list[str] | None  # tokens; None for a tool-call answer
    logprobs: list[dict[str, Any]] | None
    calls: list[_Call] = field(default_factory=list)
    finish_reason: str = "stop"

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if self.content is None else "".join(self.content),
            "refusal": None,
        }
        if self.calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.calls
            ]
        return message

    def logprobs_json(self, lo: int = 0, hi: int | None = None) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        return {"content": self.logprobs[lo:hi], "refusal": None}


def _entry(rng: random.Random, token: str, k: int) -> dict[str, Any]:
    """OpenAI's chat logprob entry; the chosen token is the most likely of its ``k`` alternatives."""
    logprob = math.log(rng.uniform(0.3, 0.99))
    top = [{"token": token, "logprob": logprob, "bytes": list(token.encode())}]
    words = [w for w in (" " + v for v in rng.sample(VOCAB, k)) if w != token][: max(k - 1, 0)]
    for i, word in enumerate(words, 1):
        alt = logprob + math.log(rng.uniform(0.05, 0.9)) - i  # strictly below the chosen token
        top.append({"token": word, "logprob": alt, "bytes": list(word.encode())})
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": top[:k]}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(getattr(part, "text", "") or getattr(part, "refusal", "") for part in content)
    return ""


def _prompt_tokens(req: ChatCompletionRequest) -> int:
    words = 0
    for message in req.messages:
        words += len(_text_of(getattr(message, "content", None)).split())
        for call in getattr(message, "tool_calls", None) or ():
            words += len(str(call.model_dump()).split())
    return words + 3 * len(req.messages) + 3


def _tool_plan(req: ChatCompletionRequest) -> tuple[list[FunctionTool], bool, bool]:
    """(candidate tools, whether to call now, whether the choice was a named one)."""
    functions = [t for t in req.tools or () if isinstance(t, FunctionTool)]
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if functions else "none")
    ends_with_result = isinstance(req.messages[-1], ToolMessage)
    if isinstance(choice, NamedFunctionChoice):
        return [t for t in functions if t.function.name == choice.function.name], True, True
    if isinstance(choice, AllowedToolsChoice):
        allowed = {ref.function.name for ref in choice.allowed_tools.tools if isinstance(ref, NamedFunctionChoice)}
        candidates = [t for t in functions if t.function.name in allowed]
        return candidates, bool(candidates) and (choice.allowed_tools.mode == "required" or not ends_with_result), False
    if choice == "required":
        return functions, bool(functions), False
    if choice == "auto":
        return functions, bool(functions) and not ends_with_result, False
    return [], False, False  # "none", or only custom tools (the simulator does not call those)


_WORD = re.compile(r"[A-Za-z0-9_-]+")


def _script(req: ChatCompletionRequest, candidates: list[FunctionTool]) -> tuple[list[FunctionTool], Any]:
    """The tools the last user message names (in order named) and the JSON object it carries, if any."""
    last = next((m for m in reversed(req.messages) if m.role == "user"), None)
    text = _text_of(last.content) if last is not None else ""
    by_name = {t.function.name: t for t in candidates}
    named: list[FunctionTool] = []
    for word in _WORD.findall(text):
        tool = by_name.pop(word, None)
        if tool is not None:
            named.append(tool)
    arguments = None
    start = text.find("{")
    if named and start >= 0:
        try:
            arguments, _ = json.JSONDecoder().raw_decode(text, start)
        except ValueError:
            arguments = None
    return named, arguments if isinstance(arguments, dict) else None


def _reply_text(req: ChatCompletionRequest, rng: random.Random, at_least: int) -> str:
    fmt = req.response_format
    if isinstance(fmt, JSONSchemaResponseFormat):
        return orjson.dumps(instance(fmt.json_schema.schema_ or {}, rng)).decode()
    if fmt is not None and fmt.type == "json_object":
        answer = " ".join(rng.choice(VOCAB) for _ in range(rng.randint(2, 6)))
        return orjson.dumps({"answer": answer, "confidence": round(rng.uniform(0, 1), 2)}).decode()
    # ``at_least`` tokens: the word count plus the full stop (min_tokens / ignore_eos, for benchmarks).
    words = [rng.choice(VOCAB) for _ in range(max(rng.randint(5, 24), at_least - 1))]
    return " ".join([words[0].capitalize(), *words[1:]]) + "."


def _cut_at_stop(tokens: list[str], stops: list[str]) -> tuple[list[str], int] | None:
    """Tokens before the first stop sequence and how many were generated (through the stop), if one occurs."""
    text = "".join(tokens)
    best: tuple[int, int] | None = None
    for stop in stops:
        start = text.find(stop)
        if start >= 0 and (best is None or start + len(stop) < best[1]):
            best = (start, start + len(stop))
    if best is None:
        return None
    kept, pos, generated = [], 0, 0
    for token in tokens:
        if pos < best[0]:
            kept.append(token[: best[0] - pos])
        if pos < best[1]:
            generated += 1
        pos += len(token)
    return [t for t in kept if t], generated


def _simulate(req: ChatCompletionRequest) -> tuple[list[_Choice], int, int]:
    """Every choice, prompt tokens and completion tokens."""
    prompt_tokens = _prompt_tokens(req)
    limit = req.max_output_tokens
    if limit is not None and prompt_tokens + limit > MOCK_CONTEXT_LENGTH:
        raise InvalidRequestError(
            f"This model's maximum context length is {MOCK_CONTEXT_LENGTH} tokens. However, you requested "
            f"{prompt_tokens + limit} tokens ({prompt_tokens} in the messages, {limit} in the completion).",
            param="max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens",
        )
    if limit is None and prompt_tokens >= MOCK_CONTEXT_LENGTH:  # as vLLM: the prompt alone fills the window
        raise InvalidRequestError(
            f"This model's maximum context length is {MOCK_CONTEXT_LENGTH} tokens. However, your request has "
            f"{prompt_tokens} input tokens. Please reduce the length of the input messages.",
            param="messages",
        )
    budget = MOCK_CONTEXT_LENGTH - prompt_tokens if limit is None else limit
    key = req.model_dump(mode="json", include={"messages", "tools", "tool_choice", "response_format"})
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    candidates, call_now, named = _tool_plan(req)
    scripted, script_args = _script(req, candidates) if call_now and not named else ([], None)
    choices: list[_Choice] = []
    completion_tokens = 0
    for index in range(req.effective_n):
        rng = _rng(key, req.seed, None if req.temperature == 0 else index)
        if call_now:
            count = 2 if req.parallel_tool_calls is not False and len(candidates) >= 2 and not named else 1
            choice = _Choice(index, None, [] if req.logprobs else None, finish_reason="stop" if named else "tool_calls")
            left = budget
            picked = scripted[: max(count, 1)] if scripted else rng.sample(candidates, count)
            for n_call, tool in enumerate(picked):
                if n_call == 0 and script_args is not None:
                    args = orjson.dumps(script_args).decode()
                else:
                    args = orjson.dumps(instance(tool.function.parameters or {"type": "object"}, rng)).decode()
                fragments = _tokens(args)
                if len(fragments) > left:
                    fragments, choice.finish_reason = fragments[:left], "length"
                left -= len(fragments)
                choice.calls.append(_Call(f"call_{rng.getrandbits(96):024x}", tool.function.name, fragments))
                if left <= 0:
                    break
            completion_tokens += budget - left
        else:
            # ignore_eos: one token past the limit, so the reply ends by length as on a real server.
            at_least = budget + 1 if req.ignore_eos else min(req.min_tokens or 0, budget)
            tokens = _tokens(_reply_text(req, rng, at_least))
            generated, finish = len(tokens), "stop"
            if len(tokens) > budget:
                tokens, generated, finish = tokens[:budget], budget, "length"
            cut = _cut_at_stop(tokens, stops)
            if cut is not None:
                tokens, generated, finish = cut[0], cut[1], "stop"
            k = req.top_logprobs or 0
            logprobs = [_entry(rng, t, k) for t in tokens] if req.logprobs else None
            choice = _Choice(index, tokens, logprobs, finish_reason=finish)
            completion_tokens += generated
        choices.append(choice)
    return choices, prompt_tokens, completion_tokens


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _head(model: str, completion_id: str | None, created: int | None, obj: str) -> dict[str, Any]:
    return {
        "id": completion_id or f"chatcmpl-mock-{uuid.uuid4().hex}",
        "object": obj,
        "created": int(time.time()) if created is None else created,
        "model": model,
        "system_fingerprint": FINGERPRINT,
    }


def complete_chat(
    req: ChatCompletionRequest, model: str, *, completion_id: str | None = None, created: int | None = None
) -> dict[str, Any]:
    """The ``chat.completion`` body for ``req``; ``model`` is the name the client asked for."""
    choices, prompt_tokens, completion_tokens = _simulate(req)
    return {
        **_head(model, completion_id, created, "chat.completion"),
        "choices": [
            {"index": c.index, "message": c.message(), "logprobs": c.logprobs_json(), "finish_reason": c.finish_reason}
            for c in choices
        ],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def _choice_events(c: _Choice) -> list[dict[str, Any]]:
    """One choice's stream entries (``choices[0]`` of each chunk), in order."""
    first: dict[str, Any] = {"role": "assistant", "content": "" if c.content is not None else None, "refusal": None}
    events = [{"index": c.index, "delta": first, "logprobs": None, "finish_reason": None}]
    for i, token in enumerate(c.content or ()):
        events.append(
            {
                "index": c.index,
                "delta": {"content": token},
                "logprobs": c.logprobs_json(i, i + 1),
                "finish_reason": None,
            }
        )
    for j, call in enumerate(c.calls):
        head = {"index": j, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        events.append({"index": c.index, "delta": {"tool_calls": [head]}, "logprobs": None, "finish_reason": None})
        for fragment in call.fragments:
            delta = {"tool_calls": [{"index": j, "function": {"arguments": fragment}}]}
            events.append({"index": c.index, "delta": delta, "logprobs": None, "finish_reason": None})
    events.append({"index": c.index, "delta": {}, "logprobs": None, "finish_reason": c.finish_reason})
    return events


def chat_chunks(
    req: ChatCompletionRequest, model: str, *, completion_id: str | None = None, created: int | None = None
) -> list[dict[str, Any]]:
    """Every ``chat.completion.chunk`` of the streamed answer, choices interleaved step by step."""
    return _chunks(req, model, completion_id, created)[0]


def _chunks(
    req: ChatCompletionRequest, model: str, completion_id: str | None, created: int | None
) -> tuple[list[dict[str, Any]], TokenUsage]:
    choices, prompt_tokens, completion_tokens = _simulate(req)
    head = _head(model, completion_id, created, "chat.completion.chunk")
    per_choice = [_choice_events(c) for c in choices]
    chunks = [
        {**head, "choices": [events[step]], "usage": None}
        for step in range(max(len(events) for events in per_choice))
        for events in per_choice
        if step < len(events)
    ]
    if req.stream_options is not None and req.stream_options.include_usage:
        chunks.append({**head, "choices": [], "usage": _usage(prompt_tokens, completion_tokens)})
    return chunks, TokenUsage(prompt_tokens, completion_tokens)


def chat_result(call: ChatCall) -> CompletionResult:
    """The ``chat.completion`` answer to a chat call (``model``: the name the client asked for)."""
    body = complete_chat(call.request, call.public_model)
    usage = body["usage"]
    usage_counts = TokenUsage(usage["prompt_tokens"], usage["completion_tokens"])
    return CompletionResult(orjson.dumps(body), usage_counts, answer=body)


def chat_stream(call: ChatCall, first_delay_s: float, delay_s: float) -> MockStream:
    """The streamed answer to a chat call: one chunk per step, paced like the completions mock."""
    chunks, usage = _chunks(call.request, call.public_model, None, None)
    steps = [b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks]
    return MockStream(steps, usage, first_delay_s, delay_s)


async def stream_chat(
    req: ChatCompletionRequest,
    model: str,
    *,
    completion_id: str | None = None,
    created: int | None = None,
    done: bool = True,
) -> AsyncIterator[bytes]:
    """The streamed answer as SSE events (``data: {...}\\n\\n``), ending with ``data: [DONE]`` when ``done``.

    The whole answer is simulated before the first event (as the completions mock does), so
    a bad request raises before any byte is sent.
    """
    for chunk in chat_chunks(req, model, completion_id=completion_id, created=created):
        yield b"data: " + orjson.dumps(chunk) + b"\n\n"
    if done:
        yield b"data: [DONE]\n\n"
