"""The chat side of the native backends: one translator per server, one OpenAI answer for all.

A :class:`ChatTranslator` (``tgi_chat``, ``ollama_chat``, ``llamacpp_chat``) knows one
server's chat API: where to POST, how its stream is framed, the request body
(:meth:`ChatTranslator.payload`, every default made explicit) and how to read its answers
into :class:`ChatPiece`s (a whole answer, or one stream event). Everything after that is the
same for every server and lives here (:class:`ChatTurn`):

- OpenAI's ``chat.completion`` message and ``chat.completion.chunk`` deltas: ``role`` in a
  choice's first delta only; tool calls numbered in order of first appearance with a stable
  ``index`` per upstream call (so fragments of two calls can never mix), ``id``/``type``/
  ``name`` in a call's first delta only, ids minted where the server gives none (TGI's ``""``,
  Ollama before 0.12.10);
- ``finish_reason``: ``tool_calls`` when calls were made and the server says it stopped on its
  own, except for a call forced by name (``stop``, as OpenAI and vLLM answer);
- chat logprobs (``{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}``),
  cut to ``top_logprobs``; an answer with text but without the logprobs asked for is an error
  naming ``logprobs`` (a server that ignores the field must not look like a success);
- usage, estimated when a server omits its prompt count (Ollama on a prompt-cache hit).

``n`` is fanned out by ``backends.emulation.fanout`` (one upstream request per choice), the
same machinery as completions; :class:`NativeBackend` (``backends.native.base``) runs it.
"""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from backends.base import TokenUsage
from backends.capabilities import Capabilities
from backends.chat_capabilities import ChatCapabilities
from backends.errors import UpstreamProtocolError
from backends.exact_json import dumps_exact
from backends.native.common import answer_head, no_logprobs
from schemas.chat import MAX_TOP_LOGPROBS, ChatCompletionRequest
from schemas.chat_messages import AssistantMessage, FunctionMessage, NamedFunctionChoice, TextPart
from schemas.errors import UnsupportedParameterError

__all__ = [
    "CallPiece",
    "ChatPiece",
    "ChatTranslator",
    "ChatTurn",
    "arguments_text",
    "as_dict",
    "call_objects",
    "chat_head",
    "chat_logprobs",
    "estimate_prompt_tokens",
    "estimate_usage",
    "piece_chars",
    "text_field",
    "text_of",
]

# A function name the client can call: not empty, no control characters (NUL included).
_BAD_NAME = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(slots=True)
class CallPiece:
    """A tool call, or a fragment of one: ``key`` is the server's handle on the call.

    ``whole``: the piece is a complete call (Ollama sends no fragments), always a new call,
    whatever its key: two whole calls can never merge into one.
    """

    key: int | str
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    whole: bool = False


@dataclass(slots=True)
class ChatPiece:
    """A whole native answer (``finish`` set) or one stream event, in the server's terms mapped."""

    content: str = ""
    reasoning: str = ""
    calls: list[CallPiece] = field(default_factory=list)
    logprobs: list[dict[str, Any]] | None = None  # chat-shaped entries (see chat_logprobs); None: none sent
    finish: str | None = None  # "stop" | "length" | "tool_calls", already mapped
    usage: TokenUsage | None = None
    done: bool = False  # the last event of the stream (a server that ends with a usage-only event)


def as_dict(value: Any, what: str, backend: str) -> dict[str, Any]:
    """An object of an answer: a JSON object, or null/absent (an empty one); any other type is the
    upstream's error (upstream shapes are not trusted, and nothing in them is silently dropped)."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    raise UpstreamProtocolError(f"the upstream sent a {what} that is not an object", backend=backend)


def estimate_usage(request: ChatCompletionRequest, chars: int) -> TokenUsage:
    """Usage when the server sent no usable counts: the prompt from the messages, the completion
    from the characters generated (about 4 a token, at least 1 when anything was)."""
    return TokenUsage(estimate_prompt_tokens(request), (chars + 3) // 4)


def piece_chars(piece: ChatPiece) -> int:
    """The characters a piece generated (what an estimate of its completion counts)."""
    return len(piece.content) + len(piece.reasoning) + sum(len(c.arguments) for c in piece.calls)


def call_objects(raw: Any, backend: str) -> list[dict[str, Any]]:
    """A message's ``tool_calls``: a list of objects, one object (TGI 2.x) or null/absent (none);
    anything else is the upstream's error, never silently no calls."""
    if raw is None:
        return []
    if isinstance(raw, dict):
        return [raw]
    if isinstance(raw, list) and all(isinstance(call, dict) for call in raw):
        return raw
    raise UpstreamProtocolError("the upstream sent tool calls that are not a list of objects", backend=backend)


def text_field(value: Any, what: str, backend: str) -> str:
    """A text field of an answer: a string, or null/absent (""); any other type is the upstream's
    error, never silently dropped."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise UpstreamProtocolError(f"the upstream sent a {what} that is not a string", backend=backend)


def arguments_text(value: Any, backend: str) -> str:
    """A tool call's ``arguments`` as OpenAI sends them (JSON text): text as it is, an object
    (TGI 2.x, Ollama) written out; anything else, or an object too deep to write, is an error."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, dict):
        raise UpstreamProtocolError("the upstream sent tool call arguments that are not a JSON object", backend=backend)
    # Integers beyond 64 bits (an id, say) are written as sent, never as floats.
    return dumps_exact(value, backend, "tool call arguments").decode()


def text_of(content: Any) -> str:
    """A message's text: a string, or its text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content if isinstance(part, TextPart))


def estimate_prompt_tokens(request: ChatCompletionRequest) -> int:
    """The prompt's size when a server reports none: the same estimate the rate limits reserve
    (:meth:`ChatCompletionRequest.prompt_estimate`), at least 1."""
    return max(1, request.prompt_estimate())


def chat_head(public_model: str) -> dict[str, Any]:
    """The fields every chunk of one chat answer shares (``object`` is the chunk's)."""
    return answer_head(public_model, "chatcmpl-", "chat.completion.chunk")


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", "surrogatepass"))


def _by_logprob(entry: dict[str, Any]) -> float:
    return float(entry["logprob"])


def chat_logprobs(entries: Any, k: int = MAX_TOP_LOGPROBS) -> list[dict[str, Any]] | None:
    """``[{token, logprob, bytes?, top_logprobs: [...]}]`` (every server's shape) as OpenAI's, top cut to ``k``
    (by default the most any request may ask for: :class:`ChatTurn` cuts to the request's)."""
    if not isinstance(entries, list):
        return None
    out: list[dict[str, Any]] = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("logprob"), int | float):
            continue
        token = str(entry.get("token", ""))
        top = entry.get("top_logprobs")
        alternatives = [
            {"token": str(t.get("token", "")), "logprob": float(t["logprob"]), "bytes": _bytes(str(t.get("token", "")))}
            for t in (top if isinstance(top, list) else ())
            if isinstance(t, dict) and isinstance(t.get("logprob"), int | float)
        ]
        alternatives.sort(key=_by_logprob, reverse=True)
        out.append(
            {
                "token": token,
                "logprob": float(entry["logprob"]),
                "bytes": _bytes(token),
                "top_logprobs": alternatives[:k],
            }
        )
    return out


class ChatTurn:
    """One choice of one chat answer: native pieces in, OpenAI message / deltas out (no ``index``).

    Contract: :meth:`message` once for a non-streaming answer; or :meth:`delta` for each
    stream event, in order. Choice dicts carry an ``index`` placeholder the fan-out fills in.
    Not thread-safe; one per upstream request.
    """

    __slots__ = ("_backend", "_calls", "_forced", "_ids", "_k", "_started", "_want_logprobs")

    def __init__(self, request: ChatCompletionRequest, *, backend: str, call_ids: str) -> None:
        self._backend = backend
        self._want_logprobs = bool(request.logprobs)
        self._k = request.top_logprobs or 0
        self._forced = isinstance(request.tool_choice, NamedFunctionChoice)
        self._calls: dict[int | str | tuple[str, int], int] = {}  # the server's handle -> our index
        self._ids = call_ids  # what minted call ids are derived from (stable per request and choice)
        self._started = False

    def _mint(self, index: int) -> str:
        return "call_" + hashlib.blake2b(f"{self._ids}:{index}".encode(), digest_size=12).hexdigest()

    def _finish(self, reason: str | None) -> str | None:
        if reason == "stop" and self._calls and not self._forced:
            return "tool_calls"
        if reason == "tool_calls" and self._forced:
            return "stop"
        return reason

    def _logprobs(self, piece: ChatPiece) -> dict[str, Any] | None:
        if not self._want_logprobs:
            return None
        if piece.logprobs is None and piece.content:
            raise no_logprobs(self._backend)
        entries = [{**e, "top_logprobs": e["top_logprobs"][: self._k]} for e in piece.logprobs or ()]
        return {"content": entries, "refusal": None}

    def _call_deltas(self, calls: list[CallPiece]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for call in calls:
            index = None if call.whole else self._calls.get(call.key)
            if index is None:
                name = call.name
                if not name or _BAD_NAME.search(name):
                    raise UpstreamProtocolError(
                        "the upstream sent a tool call without a usable function name", backend=self._backend
                    )
                index = len(self._calls)
                self._calls[("whole", index) if call.whole else call.key] = index
                out.append(
                    {
                        "index": index,
                        "id": call.id or self._mint(index),
                        "type": "function",
                        "function": {"name": name, "arguments": call.arguments},
                    }
                )
            elif call.arguments:
                out.append({"index": index, "function": {"arguments": call.arguments}})
        return out

    def delta(self, piece: ChatPiece) -> dict[str, Any] | None:
        """The chunk choice for one stream event, or None when it has nothing for the client."""
        delta: dict[str, Any] = {}
        if not self._started:
            self._started = True
            delta["role"] = "assistant"
        if piece.content:
            delta["content"] = piece.content
        if piece.reasoning:
            delta["reasoning_content"] = piece.reasoning
        calls = self._call_deltas(piece.calls)
        if calls:
            delta["tool_calls"] = calls
        finish = self._finish(piece.finish)
        logprobs = self._logprobs(piece)
        if not delta and finish is None and not (logprobs and logprobs["content"]):
            return None
        if "role" in delta and "content" not in delta and not calls:
            delta["content"] = ""  # OpenAI's first delta: the role with empty content
        return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def message(self, piece: ChatPiece) -> dict[str, Any]:
        """The whole non-streaming choice."""
        calls = self._call_deltas(piece.calls)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": piece.content if piece.content or not calls else None,
            "refusal": None,
        }
        if piece.reasoning:
            message["reasoning_content"] = piece.reasoning
        if calls:  # a whole message's calls carry no ``index`` (that key is for stream deltas only)
            message["tool_calls"] = [{k: v for k, v in call.items() if k != "index"} for call in calls]
        return {
            "index": 0,
            "message": message,
            "logprobs": self._logprobs(piece),
            "finish_reason": self._finish(piece.finish),
        }


class ChatTranslator(ABC):
    """One server's chat API (see the module docstring); stateless, one per backend."""

    path: ClassVar[str]
    framing: ClassVar[Literal["sse", "ndjson"]]
    table: ClassVar[ChatCapabilities]

    def __init__(self, backend: str, kind: str) -> None:
        self.backend = backend
        self.kind = kind

    def refuse(self, param: str, why: str) -> UnsupportedParameterError:
        return Capabilities.refusal_error(param, self.backend, self.kind, why)

    def check(self, request: ChatCompletionRequest) -> None:
        """The capability table again (for callers that did not route), then rules on values."""
        error = self.table.refusal(request, self.backend, self.kind)
        if error is not None:
            raise error
        for i, message in enumerate(request.messages):
            if isinstance(message, FunctionMessage):
                raise self.refuse("messages", f"messages[{i}]: the deprecated function role (send a tool message)")
            if isinstance(message, AssistantMessage) and (message.audio is not None or message.function_call):
                raise self.refuse("messages", f"messages[{i}]: assistant audio or function_call (OpenAI only)")

    @abstractmethod
    def payload(self, request: ChatCompletionRequest, model: str, *, stream: bool) -> dict[str, Any]:
        """The native body for one choice (``n`` is the fan-out's)."""

    @abstractmethod
    def answer(self, obj: Any, request: ChatCompletionRequest) -> ChatPiece:
        """The native non-streaming answer (``finish`` and ``usage`` set); raise ``UpstreamProtocolError``
        on a bad shape."""

    @abstractmethod
    def event(self, obj: dict[str, Any], request: ChatCompletionRequest) -> ChatPiece | None:
        """One native stream event (None: nothing in it); raise on a native error event."""

    def end(self) -> ChatPiece | None:
        """The stream's ``[DONE]`` (SSE servers): the end, when no event said so."""
        return ChatPiece(done=True)
