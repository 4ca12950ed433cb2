"""One part's native stream as choice deltas: the frame reader both endpoints share, and one decoder each.

:class:`NativeChoiceStream` reads an upstream body (SSE or NDJSON, bounded events), parses each
event and hands it to a decoder: :class:`TextEvents` (completions: ``text_completion`` deltas
from the translator's :class:`~backends.native.common.Event`) or :class:`ChatEvents` (chat:
``chat.completion.chunk`` deltas from :class:`~backends.native.chat.ChatPiece`). A stream that
ends without its final event, or with a native error event, raises after the deltas before it.

Who closes what: :meth:`NativeChoiceStream.aclose` releases the response exactly once, first
draining (bounded) what the upstream still sends after its final event so the connection can
be reused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

from backends.base import TokenUsage
from backends.emulation.fanout import ChoiceStream, PartResult
from backends.errors import UpstreamError, UpstreamProtocolError, UpstreamTooLargeError
from backends.exact_json import loads_keeping_integers
from backends.native.chat import ChatPiece, ChatTranslator, ChatTurn, estimate_usage, piece_chars
from backends.native.choice import ChoiceTracker
from backends.native.common import Event
from backends.transport.base import UpstreamResponse
from backends.transport.sse import sse_data
from backends.transport.upstream_events import UpstreamEvents
from schemas.chat import ChatCompletionRequest

__all__ = ["ChatEvents", "Events", "Finished", "NativeChoiceStream", "TextEvents"]

_CALL_BYTES = 64  # what one tool call costs whatever its size (its id, type, index, dicts)


class Finished(ChoiceStream):
    """A part answered without streaming (``max_tokens: 0``)."""

    def __init__(self, result: PartResult) -> None:
        self._choice: dict[str, Any] | None = result.choice
        self.usage = result.usage

    async def next(self) -> list[dict[str, Any]]:
        if self._choice is None:
            raise StopAsyncIteration
        choice, self._choice = self._choice, None
        self.done = True
        return [choice]

    async def aclose(self) -> None:
        self._choice = None


class Events(Protocol):
    """One part's native events -> choice deltas; ``done`` and ``usage`` once the last one came."""

    done: bool
    usage: TokenUsage | None

    def feed(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        """The deltas for one event; raises ``UpstreamError`` on a native error event."""
        ...

    def end(self) -> list[dict[str, Any]]:
        """SSE's ``data: [DONE]``."""
        ...


class TextEvents:
    """Completions: a native event -> ``text_completion`` choice deltas (the last event has the counts)."""

    def __init__(self, event: Callable[[dict[str, Any]], Event | None], tracker: ChoiceTracker) -> None:
        self._event = event  # the completions translator's reading of one native event
        self._tracker = tracker
        self.done = False
        self.usage: TokenUsage | None = None

    def feed(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        event = self._event(obj)
        if event is None:
            return []
        tracker = self._tracker
        if event.finish is None:
            choice = tracker.piece(event.text, event.tokens)
            return [] if choice is None else [choice]
        last = tracker.last(event.text, event.tokens, event.finish, event.stop_word)
        usage = event.usage or TokenUsage(0, 0)
        self.usage = TokenUsage(usage.prompt_tokens, 0) if tracker.dropped else usage
        self.done = True
        return [last]

    def end(self) -> list[dict[str, Any]]:
        return []  # the native completion APIs end with their final event, not [DONE]


class ChatEvents:
    """Chat: native events -> ``chat.completion.chunk`` choice deltas.

    The stream is done at the event that has both the finish reason and the counts, or at
    the first event after the finish that has the counts or says it is the last (servers in
    OpenAI's shape send usage in a chunk of its own, then ``[DONE]``). Without counts, usage
    is estimated (:func:`~backends.native.chat.estimate_usage`).

    Tool calls are bounded by ``max_calls_bytes`` per choice (names, arguments and
    ``_CALL_BYTES`` per call): unlike text, a client (and the gateway's own call ordering,
    which holds later calls until the one before closes) keeps every call in memory, so a
    stream may carry no more of them than a whole non-streamed answer may be
    (``limits.max_response_bytes``).
    """

    def __init__(
        self, translator: ChatTranslator, turn: ChatTurn, request: ChatCompletionRequest, *, max_calls_bytes: int
    ) -> None:
        self._translator = translator
        self._turn = turn
        self._request = request
        self._finished = False
        self._usage: TokenUsage | None = None
        self._chars = 0
        self._calls_bytes = 0
        self._max_calls_bytes = max_calls_bytes
        self.done = False
        self.usage: TokenUsage | None = None

    def feed(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        return self._take(self._translator.event(obj, self._request))

    def end(self) -> list[dict[str, Any]]:
        return self._take(self._translator.end())

    def _take(self, piece: ChatPiece | None) -> list[dict[str, Any]]:
        if piece is None:
            return []
        if piece.usage is not None:
            self._usage = piece.usage
        out: list[dict[str, Any]] = []
        if not self._finished:
            self._chars += piece_chars(piece)
            if piece.calls:
                self._count_calls(piece)
            choice = self._turn.delta(piece)
            if choice is not None:
                out.append(choice)
            self._finished = piece.finish is not None
        if self._finished and (piece.done or self._usage is not None):
            self.done = True
            self.usage = self._usage or estimate_usage(self._request, self._chars)
        elif piece.done:
            raise UpstreamProtocolError(
                "the upstream ended the stream without a finish reason",
                backend=self._translator.backend,
                reason="stream_cut",
            )
        return out

    def _count_calls(self, piece: ChatPiece) -> None:
        for call in piece.calls:
            self._calls_bytes += _CALL_BYTES + len(call.name or "") + len(call.arguments)
        if self._calls_bytes > self._max_calls_bytes:
            raise UpstreamTooLargeError(
                f"the upstream's tool calls in one stream are larger than {self._max_calls_bytes} bytes "
                "(limits.max_response_bytes)",
                backend=self._translator.backend,
            )


class NativeChoiceStream(UpstreamEvents[list[dict[str, Any]]], ChoiceStream):
    """One native stream as choice deltas (see :class:`backends.emulation.fanout.ChoiceStream`)."""

    _cut_message = "the upstream closed the stream before its last event"

    def __init__(
        self,
        backend: str,
        resp: UpstreamResponse,
        events: Events,
        *,
        framing: Literal["sse", "ndjson"],
        max_event_bytes: int,
    ) -> None:
        self._sse = framing == "sse"
        super().__init__(resp, backend, sep=b"\n\n" if self._sse else b"\n", max_event=max_event_bytes)
        self._events_of = events

    next = UpstreamEvents._pull  # an alias: the loop is the shared one, no call more per read

    def _process(self, block: bytes) -> list[dict[str, Any]]:
        if self._sse:
            frames = list(sse_data(block))
        else:
            frames = [line for line in block.split(b"\n") if line.strip()]
        out: list[dict[str, Any]] = []
        events = self._events_of
        for frame in frames:
            if self.done:
                break  # anything after the final event is not the client's
            try:
                if frame == b"[DONE]":
                    out.extend(events.end())
                else:
                    try:
                        obj = loads_keeping_integers(frame, self._backend)
                        if not isinstance(obj, dict):
                            raise ValueError
                    except ValueError:  # orjson.JSONDecodeError is a ValueError
                        raise UpstreamProtocolError(
                            "the upstream sent a stream event that is not a JSON object",
                            backend=self._backend,
                            reason="stream_garbage",
                        ) from None
                    out.extend(events.feed(obj))
            except UpstreamError as exc:
                self._pending = exc
                break
            if events.done:
                self.usage = events.usage
                self.done = self.finished = True  # finished: the shared loop's end
        return out
