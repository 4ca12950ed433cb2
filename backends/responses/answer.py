"""OpenAI's Response object, built from a chat answer: the bridge's answer half (non-streamed), and the
envelope both halves share.

:class:`ResponseFrame` holds what every Response object of one request repeats (its id, time,
model name, and the request's settings echoed as OpenAI echoes them); :func:`response_from_chat`
turns a ``chat.completion`` body into the Response:

- the assistant's reasoning (``reasoning_content``/``reasoning``) -> a ``reasoning`` item whose
  ``content`` is the backend's reasoning text (``reasoning_text``), and whose ``summary`` repeats
  it when the client asked for one (no summariser runs here: the summary is the whole text);
- its text -> a ``message`` item with one ``output_text`` part (logprobs when asked for), a
  refusal -> a ``refusal`` part;
- each tool call -> a ``function_call`` item (``call_id`` the chat call's id, a namespace
  function's name split back into ``name`` and ``namespace``) or a ``custom_tool_call``;
- ``finish_reason`` ``length`` -> status ``incomplete`` with ``incomplete_details.reason``
  ``max_output_tokens`` (``content_filter`` likewise); usage in Responses' names.
"""

from __future__ import annotations

import os
import time
from typing import Any

import orjson

from backends.base import CompletionResult, TokenUsage, usage_of
from backends.errors import UpstreamProtocolError
from backends.exact_json import dumps_exact, loads_keeping_integers
from backends.responses.echo import FIXED, echo_of
from backends.responses.to_chat import ToolNames
from schemas.responses import ResponsesRequest

__all__ = [
    "ID_DIGITS",
    "ResponseFrame",
    "more_id_digits",
    "new_id",
    "output_items",
    "response_from_chat",
    "responses_usage",
]

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


_ID_BYTES = 24
_ID_CHARS = _ID_BYTES * 2
_POOL_BYTES = _ID_BYTES * 256
# The hex digits of ids not yet handed out (48 each), taken from the end: ``ID_DIGITS.pop() if
# ID_DIGITS else more_id_digits()`` is an id's digits with one C call (no Python frame), which is how
# the answer's hot path mints its own (a Response's id, its message's); new_id everywhere else.
# Emptied in place in a forked child (the same list object wherever it was imported), which never
# hands out its parent's.
ID_DIGITS: list[str] = []


def more_id_digits() -> str:
    """An id's digits, once ``ID_DIGITS`` is empty: it is filled from one ``getrandom`` call and one
    ``hex`` of 256 ids' bytes (24 bytes of the OS's randomness each), and one is taken."""
    ID_DIGITS[:] = os.urandom(_POOL_BYTES).hex(" ", _ID_BYTES).split(" ")  # (cut in C: no slice per id)
    return ID_DIGITS.pop()


os.register_at_fork(after_in_child=ID_DIGITS.clear)  # a forked child never reuses its parent's bytes


def new_id(prefix: str) -> str:
    """An id in OpenAI's style (``resp_``, ``msg_``, ``fc_``, ``rs_`` + 48 hex digits): 24 bytes of the
    OS's randomness, read 256 ids at a time (``ID_DIGITS``: a Response has two or more ids, a stream's
    items more)."""
    return f"{prefix}_{ID_DIGITS.pop() if ID_DIGITS else more_id_digits()}"


# The Response's bytes up to its status's value (its id, its time), and the echo's members cut from the
# bytes of ``[template]`` (the frame's ``_template``: id, time, status, output and usage null).
_HEAD = b'{"id":"%b","object":"response","created_at":%d,"status":"'
_TEMPLATE_HEAD = len(b'[{"id":null,"object":"response","created_at":null,"status":null,')
_TEMPLATE_TAIL = -len(b',"output":null,"usage":null}]')
# The non-stream Response as orjson.dumps writes its dict: id, time, status, incomplete_details, the
# echo's members after it, then the bytes of {"output": ..., "usage": ...} less their opening brace.
_BODY = _HEAD + b'%b",' + FIXED + b"%b,%b,%b"
_DETAILS: dict[str | None, bytes] = {reason: orjson.dumps({"reason": reason}) for reason in _INCOMPLETE.values()}
_DETAILS[None] = b"null"


class ResponseFrame:
    """What every Response object of one request carries; ``envelope`` makes one with a status.

    Its dicts share the echo's values with other requests' (``backends.responses.echo``): a
    Response is read, never changed but for its own keys."""

    __slots__ = ("_data", "_template", "created_at", "id", "logprobs", "names", "request", "summarises")

    def __init__(self, request: ResponsesRequest, public_model: str, names: ToolNames) -> None:
        self.request = request
        self.names = names
        self.id = "resp_" + (ID_DIGITS.pop() if ID_DIGITS else more_id_digits())  # new_id("resp"), inline
        self.created_at = int(time.time())
        # logprobs: each output_text part carries its tokens' (ResponsesRequest.wants_logprobs);
        # summarises: the reasoning text is given as summary too
        self._template, self._data, self.logprobs, self.summarises = echo_of(request, public_model)

    def around_status(self) -> tuple[bytes, bytes] | None:
        """The Response's bytes around its status, as ``orjson.dumps`` writes its envelope in an event:
        up to the status's value (its id, ``object``, ``created_at``), and the echoed request's members
        that follow it (``output`` and ``usage`` come last: ``envelope``); None where orjson refuses the
        echo (an integer beyond 64 bits, nesting past its levels): that Response takes the dicts' way."""
        rest = self._data
        if rest is not None:
            echo = FIXED + b"null," + rest
        else:
            try:  # one level down, as in its event: refused where that would be
                echo = orjson.dumps([self._template])[_TEMPLATE_HEAD:_TEMPLATE_TAIL]
            except orjson.JSONEncodeError:
                return None
        return _HEAD % (self.id.encode(), self.created_at), echo

    def envelope(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        incomplete: str | None = None,
        *,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The Response object now: ``status``, its ``output`` items and ``usage`` (None until known)."""
        out = self._template.copy()  # (a copy of the keys' table: no key inserted one by one)
        out["id"] = self.id
        out["created_at"] = self.created_at
        out["status"] = status
        out["output"] = output
        out["usage"] = usage
        if incomplete is not None:
            out["incomplete_details"] = {"reason": incomplete}
        if error is not None:
            out["error"] = error
        return out

    def dumps(self, response: dict[str, Any], incomplete: str | None) -> tuple[bytes, int]:
        """``orjson.dumps(response)`` of an ``envelope`` of this frame's without ``error`` (``incomplete``
        its reason), around the echo's bytes where they are made, and then where its ``,"output":``
        starts (0 otherwise); raises ``orjson.JSONEncodeError``."""
        rest = self._data
        if rest is None:
            return orjson.dumps(response), 0
        # output and usage as deep as in the Response: refused where they would be there
        tail = orjson.dumps({"output": response["output"], "usage": response["usage"]})
        status = response["status"].encode()
        body = _BODY % (self.id.encode(), self.created_at, status, _DETAILS[incomplete], rest, tail[1:])
        return body, len(body) - len(tail)


def responses_usage(usage: Any, counts: TokenUsage | None = None) -> dict[str, Any] | None:
    """A chat ``usage`` object in Responses' names (``input_tokens``, ``output_tokens``, their details);
    ``counts``: its token counts where the caller read them already (``usage_of(usage)``)."""
    if counts is None:
        counts = usage_of(usage)
        if counts is None:
            return None
    prompt, completion = counts.prompt_tokens, counts.completion_tokens
    cached = reasoning = 0
    # ``in`` and ``[]``, not ``get``: no call for the usage without details (most upstreams': their
    # usage is read for nothing else)
    if type(usage) is dict and ("prompt_tokens_details" in usage or "completion_tokens_details" in usage):
        prompt_details = usage["prompt_tokens_details"] if "prompt_tokens_details" in usage else None
        completion_details = usage["completion_tokens_details"] if "completion_tokens_details" in usage else None
        said = prompt_details.get("cached_tokens") if type(prompt_details) is dict else None
        cached = said if type(said) is int else 0
        said = completion_details.get("reasoning_tokens") if type(completion_details) is dict else None
        reasoning = said if type(said) is int else 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def reasoning_text(message: dict[str, Any]) -> str | None:
    """The chat message's reasoning, under either of its names (``reasoning_content``, ``reasoning``)."""
    text = message.get("reasoning_content")
    if text is None:
        text = message.get("reasoning")
    return text if isinstance(text, str) and text else None


def reasoning_item(frame: ResponseFrame, text: str, item_id: str, status: str = "completed") -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": item_id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": text}] if frame.summarises else [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }
    return item


def output_items(frame: ResponseFrame, message: dict[str, Any], logprobs: Any, status: str) -> list[dict[str, Any]]:
    """The Response ``output`` for one chat ``message`` (module docstring)."""
    items: list[dict[str, Any]] = []
    # ``in`` and ``[]`` rather than ``get``: no call for what a plain answer does not hold.
    if "reasoning_content" in message or "reasoning" in message:
        thought = reasoning_text(message)
        if thought is not None:
            items.append(reasoning_item(frame, thought, new_id("rs")))
    content = message["content"] if "content" in message else None
    refusal = message["refusal"] if "refusal" in message else None
    calls = message["tool_calls"] if "tool_calls" in message else None
    text = type(content) is str
    if (text and (content or not calls)) or refusal:
        parts: list[dict[str, Any]] = []
        if text and (content or not refusal):
            part: dict[str, Any] = {"type": "output_text", "text": content, "annotations": []}
            if frame.logprobs:
                part["logprobs"] = _logprobs(logprobs)
            parts = [part]
        if refusal and type(refusal) is str:
            parts.append({"type": "refusal", "refusal": refusal})
        msg_id = "msg_" + (ID_DIGITS.pop() if ID_DIGITS else more_id_digits())  # new_id("msg"), inline
        items.append({"id": msg_id, "type": "message", "role": "assistant", "status": status, "content": parts})
    if calls:
        for call in calls:
            items.append(call_item(frame, call))
    return items


def call_item(frame: ResponseFrame, call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    """One chat tool call as a Response item (a function's namespace split back out of its name)."""
    if call.get("type") == "custom":
        custom = call.get("custom") or {}
        return {
            "id": new_id("ctc"),
            "type": "custom_tool_call",
            "call_id": call.get("id"),
            "name": custom.get("name"),
            "input": custom.get("input") or "",
            "status": status,
        }
    function = call.get("function") or {}
    name, namespace = frame.names.split(str(function.get("name")))
    item: dict[str, Any] = {
        "id": new_id("fc"),
        "type": "function_call",
        "call_id": call.get("id"),
        "name": name,
        "arguments": function.get("arguments") or "",
        "status": status,
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item


def _logprobs(logprobs: Any) -> list[Any]:
    """Chat's token logprobs (``{"content": [...]}``) as Responses' (the same entries)."""
    if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
        return list(logprobs["content"])
    return []


def response_from_chat(
    data: bytes, frame: ResponseFrame, backend: str, obj: Any = None, usage: TokenUsage | None = None
) -> tuple[CompletionResult, dict[str, Any]]:
    """A ``chat.completion`` body as the Response the client gets (and the object, for the store).

    ``obj``: the body already parsed, where the chat translator kept it (``CompletionResult.answer``);
    ``usage``: its token counts, where the chat result read them (``CompletionResult.usage``).
    """
    if obj is None:
        obj = loads_keeping_integers(data, backend)
    # ``in`` and ``[]`` rather than ``get`` (no call): this is every bridged non-stream answer's path.
    choices = obj["choices"] if type(obj) is dict and "choices" in obj else None
    if type(choices) is not list or not choices or type(choices[0]) is not dict:
        raise UpstreamProtocolError("the chat translation gave no choice to answer with", backend=backend)
    choice = choices[0]
    finish = choice["finish_reason"] if "finish_reason" in choice else None
    incomplete = _INCOMPLETE[finish] if type(finish) is str and finish in _INCOMPLETE else None
    status = "incomplete" if incomplete else "completed"
    message = choice["message"] if "message" in choice else None
    output = output_items(
        frame, message if type(message) is dict else {}, choice.get("logprobs") if frame.logprobs else None, status
    )
    chat_usage = obj["usage"] if "usage" in obj else None
    if usage is None:
        usage = usage_of(chat_usage)
    # (incomplete by position: a call by keyword parses its name on every answer)
    response = frame.envelope(status, output, None if usage is None else responses_usage(chat_usage, usage), incomplete)
    try:
        body, output_at = frame.dumps(response, incomplete)
    except orjson.JSONEncodeError:  # (an integer beyond 64 bits, nesting past orjson's levels)
        return CompletionResult(dumps_exact(response, backend), usage, answer=response), response
    # (positional: a dataclass's __init__ called by keyword parses its names on every answer)
    return CompletionResult(body, usage, "application/json", None, response, True, output_at), response
