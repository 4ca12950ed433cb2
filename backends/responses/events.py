"""A chat stream as OpenAI's Responses events: the bridge's stream half.

:class:`ChatResponseEvents` reads the family's chat stream (OpenAI chunk shape, tool calls one
after another: ``backends.tool_call_order``) and writes OpenAI's semantic events, each
``event: <type>`` / ``data: {...}`` with ``sequence_number`` counting from 0:

``response.created``, ``response.in_progress``, then per output item ``response.output_item.added``
... ``response.output_item.done`` with, inside, ``response.content_part.added`` /
``response.output_text.delta`` / ``.done`` / ``response.content_part.done`` (text; ``refusal``
likewise), ``response.function_call_arguments.delta`` / ``.done`` (calls), reasoning as
``response.reasoning_text.delta`` / ``.done`` (or, when a summary was asked for,
``response.reasoning_summary_part.added`` / ``response.reasoning_summary_text.delta`` / ``.done`` /
``response.reasoning_summary_part.done``); and last ``response.completed``, or
``response.incomplete`` when the output limit (or a content filter) cut the answer.

The first events leave with the chat stream's first chunk, never before: until then an
upstream failure can still fail over. A failure after that is raised to the handler, which ends
the stream with :meth:`ResponseEventStream.failed_event` (``response.failed`` carrying the error
and what was produced): never an invented completion. :meth:`ResponseEventStream.snapshot` is the
Response as it stands, for the conversation store (``cancelled`` when the client left).

This module reads the chat stream; the items' events are written by
:class:`~backends.responses.response_writer.ResponseWriter` (with the byte templates of
:mod:`~backends.responses.lifecycle_bytes`), a run of plain text events by
:mod:`~backends.responses.text_run`.
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import CompletionStream, usage_of
from backends.errors import UpstreamProtocolError
from backends.responses.answer import (
    ResponseFrame,
    call_item,
    new_id,
    responses_usage,
)
from backends.responses.event_stream import failure_of
from backends.responses.lifecycle_bytes import (
    INCOMPLETE,
    NO_LOGPROBS,
    OPEN_TEXT,
    OPEN_TEXT_DELTA,
    TEXT_HEAD,
    delta_template,
)
from backends.responses.response_writer import ResponseWriter
from backends.responses.text_run import RUN, Shape, finish_of, learn, opening_shape, write_run
from schemas.errors import GatewayError

__all__ = ["ChatResponseEvents"]


class ChatResponseEvents(ResponseWriter):
    """The Responses events of one chat stream (module docstring). Not thread-safe; one consumer."""

    relayed_events: int  # chat events translated: what the handler settles a stream cut midway with

    def __init__(self, inner: CompletionStream, frame: ResponseFrame, backend: str) -> None:
        # ResponseWriter's state (its declarations say what each holds) and this reader's, set here
        # in one constructor (no super() call per stream: request_cost counts calls).
        self._inner = inner
        self._frame = frame
        self._backend = backend
        self._seq = 0
        self._started = False
        self._done = False
        self._items: list[dict[str, Any]] = []
        self._open: str | None = None
        self._part: str | None = None
        self._texts: list[str] = []
        self._logprobs: list[Any] = []
        self._part_where: bytes | None = None
        self._fast: tuple[bytes, bytes, bytes] | None = None
        # The bytes of the stream's plain text events around their content (learn), once one was seen.
        self._shape: Shape | None = None
        self._finish: str | None = None
        self._chat_usage: Any = None
        self._summary = frame.summarises
        self._call_index: Any = None
        self._logprobs_wanted = frame.logprobs  # (the request's wants_logprobs, read once by the frame)
        self.final: dict[str, Any] | None = None
        self.relayed_events = 0
        self._frame_bytes: tuple[bytes, bytes] | None = None
        self._item_bytes: list[bytes] = []

    # --- CompletionStream -----------------------------------------------------------------------
    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        out: list[bytes] = []
        inner = self._inner
        while True:
            try:
                chunk = await inner.__anext__()
            except StopAsyncIteration:
                self._end(out)
                return b"".join(out)
            # A read of one text event in the learned shape (a model's tokens, as they come): written
            # here, what _chunk would write for it (no call, no list, no join per token).
            shape, fast = self._shape, self._fast
            if (
                shape is not None
                and fast is not None
                and not out
                and not inner.finished
                and chunk.endswith(shape[5])
                and chunk.startswith(shape[0])
                and chunk.find(b"\n") == len(chunk) - 2
            ):
                piece = chunk[shape[2] : -len(shape[5])]
                try:
                    text = orjson.loads(piece)
                except orjson.JSONDecodeError:
                    text = None
                if type(text) is str:
                    self._texts.append(text)
                    seq = self._seq
                    self._seq = seq + 1
                    self.relayed_events += 1
                    return fast[2] % (seq, piece)
            if not self._started:
                self._start(out)
            self._chunk(chunk, out)
            if inner.finished:
                self._end(out)
                return b"".join(out)
            if out:
                return b"".join(out)

    async def aclose(self) -> None:
        await self._inner.aclose()

    # --- the ResponseEventStream part -------------------------------------------------------------
    def failed_event(self, error: GatewayError) -> bytes:
        response = self.snapshot("failed")
        assert response is not None
        response["error"] = failure_of(error)
        # (not the bytes of a Response before it failed)
        self.final, self.final_dumped, self.final_output_at = response, None, 0
        out: list[bytes] = []
        self._emit(out, {"type": "response.failed", "response": response})
        self._done = True
        return b"".join(out)

    def snapshot(self, status: str) -> dict[str, Any] | None:
        if self.final is not None:
            return self.final
        items = [dict(item) for item in self._items]
        if self._open is not None and items:
            items[-1] = self._closed_item(status="incomplete")
        return self._frame.envelope(status, items, responses_usage(self._chat_usage))

    # --- translation --------------------------------------------------------------------------
    def _chunk(self, chunk: bytes, out: list[bytes]) -> None:
        # orjson reads an integer beyond 64 bits as a float: nothing read here is relayed (ids,
        # created) or taken as a number unchecked (usage_of, call indexes), so the exact reader's
        # extra scan per event is not needed. Locals: this loop runs once per token.
        loads, fast, seq, texts = orjson.loads, self._fast, self._seq, self._texts
        shape = self._shape
        events = 0
        pos, end = 0, len(chunk)
        run = True  # whether a run of plain text events may still be written at once (until one is not)
        while pos < end:
            # The event's end: its first line's end (a memchr) when a blank line follows, as it
            # does after a one-line event (the usual); else the first blank line's after it.
            cut = chunk.find(b"\n", pos)
            if cut < 0:
                cut = end
            elif not chunk.startswith(b"\n", cut + 1):
                cut = chunk.find(b"\n\n", cut + 1)
                if cut < 0:
                    cut = end
            # The common event, while a text part is open: the bytes of the last plain text event
            # with another JSON string as its content (learn). Nothing else differs, so it means
            # what that event meant: written at once, its string as the upstream escaped it.
            if (
                fast is not None
                and shape is not None
                and chunk.startswith(shape[0], pos)
                and chunk.endswith(shape[1], pos, cut)
            ):
                if run and end - cut > RUN * (shape[2] + shape[3]):  # more may follow: the run at once
                    taken, stop, run_text = write_run(chunk, pos, shape, fast[0], fast[1], seq, out)
                    if taken:
                        texts.append(run_text)
                        seq += taken
                        events += taken
                        pos = stop
                        continue
                    run = False
                piece = chunk[pos + shape[2] : cut - shape[3]]  # (the after part is never empty: it closes the event)
                try:
                    text = loads(piece)
                except orjson.JSONDecodeError:
                    text = None
                if type(text) is str:
                    texts.append(text)
                    out += (fast[0], b"%d" % seq, fast[1], piece, NO_LOGPROBS)  # joined once, by the caller
                    seq += 1
                    events += 1
                    pos = cut + 2
                    continue
            # The usual last text event: a learned one's bytes but for a finish reason, without a parse.
            if fast is not None and shape is not None and chunk.startswith(shape[0], pos):
                finished = finish_of(chunk, pos, cut, shape)
                if finished is not None:
                    text, piece, reason = finished
                    if text:  # (_choice writes no empty piece)
                        texts.append(text)
                        out += (fast[0], b"%d" % seq, fast[1], piece, NO_LOGPROBS)
                        seq += 1
                    self._finish = reason
                    events += 1
                    pos = cut + 2
                    continue
            raw = chunk[pos:cut]
            pos = cut + 2
            if raw[:5] != b"data:":
                continue
            try:
                obj = loads(raw[5:])
            except orjson.JSONDecodeError:
                raise UpstreamProtocolError(
                    "the chat stream sent an event that is not JSON", backend=self._backend, reason="stream_garbage"
                ) from None
            if type(obj) is not dict:
                continue
            events += 1
            # ``in`` and ``[]``, not ``get``: no call (every event but a run's and a learned one's comes here).
            usage: Any = obj["usage"] if "usage" in obj else None
            choices: Any = obj["choices"] if "choices" in obj else None
            # A piece of text and nothing else (one choice, no logprobs, no usage; no finish, or a finish
            # with its last piece) while a text part is open (every token of a stream but its first):
            # written at once, as _choice would.
            if fast is not None and usage is None:
                try:
                    (choice,) = choices  # exactly one
                    delta = choice["delta"]
                    text = delta["content"]
                    finish = choice["finish_reason"] if "finish_reason" in choice else None
                    plain = (
                        type(text) is str
                        and len(delta) == 1
                        and ("index" not in choice or choice["index"] == 0)
                        and ("logprobs" not in choice or choice["logprobs"] is None)
                        and (finish is None or type(finish) is str)
                    )
                except (KeyError, TypeError, ValueError):  # another shape: the general way
                    plain = False
                if plain:
                    if finish is None:
                        texts.append(text)
                        out.append(fast[0] + b"%d" % seq + fast[1] + orjson.dumps(text) + NO_LOGPROBS)
                        seq += 1
                        shape = self._shape = learn(raw, text)  # (its bytes: the shape of those to come)
                        continue
                    if text:  # (_choice writes no empty piece)
                        texts.append(text)
                        out.append(fast[0] + b"%d" % seq + fast[1] + orjson.dumps(text) + NO_LOGPROBS)
                        seq += 1
                    self._finish = finish
                    continue
            self._seq = seq
            if type(usage) is dict:
                self._chat_usage = usage
            for choice in choices if type(choices) is list else ():
                if type(choice) is dict and ("index" not in choice or choice["index"] == 0):
                    self._choice(choice, out)
            if fast is None and self._fast is not None:  # it opened a text part: the shape of those to come
                shape = self._shape = opening_shape(obj, raw)
            fast, seq, texts = self._fast, self._seq, self._texts
        self._seq = seq
        self.relayed_events += events

    def _choice(self, choice: dict[str, Any], out: list[bytes]) -> None:
        # Keys looked for with ``in`` (no call): most events carry one or two of the five.
        delta = choice["delta"] if "delta" in choice else None
        if type(delta) is dict:
            if "reasoning_content" in delta or "reasoning" in delta:
                thought = delta.get("reasoning_content")
                if thought is None:
                    thought = delta.get("reasoning")
                if type(thought) is str and thought:
                    self._reasoning(thought, out)
            if "content" in delta:
                content = delta["content"]
                if type(content) is str and content:
                    logprobs = choice["logprobs"] if self._logprobs_wanted and "logprobs" in choice else None
                    self._text("output_text", content, logprobs, out)
            if "refusal" in delta:
                refusal = delta["refusal"]
                if type(refusal) is str and refusal:
                    self._text("refusal", refusal, None, out)
            if "tool_calls" in delta:
                calls = delta["tool_calls"]
                for call in calls if type(calls) is list else ():
                    if type(call) is dict:
                        self._call(call, out)
        if "finish_reason" in choice:
            finish = choice["finish_reason"]
            if type(finish) is str:
                self._finish = finish

    def _reasoning(self, text: str, out: list[bytes]) -> None:
        if self._open != "reasoning":
            if self._open is not None:
                self._close(out)
            self._open_reasoning(out, new_id("rs"))
        self._texts.append(text)
        kind, where = self._reasoning_delta  # (made when the item opened)
        self._delta(out, kind, where, text)

    def _text(self, part: str, text: str, logprobs: Any, out: list[bytes]) -> None:
        if self._open != "message":
            if self._open is not None:  # (an answer's first item: nothing to close, no call)
                self._close(out)
            item_id = new_id("msg")
            item = {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
            self._items.append(item)
            self._open, self._part = "message", None
            if part == "output_text" and not self._logprobs_wanted and self.lifecycle_bytes:
                # The item, its first part (an answer's usual start) and its first delta from templates: no
                # dicts, and nothing more to do (what the rest of this method would write).
                seq, index, at = self._seq, len(self._items) - 1, item_id.encode()
                self._seq = seq + 3
                template = OPEN_TEXT_DELTA % (at, index)
                out += (OPEN_TEXT % (seq, index, at, seq + 1, at, index), template % (seq + 2, orjson.dumps(text)))
                fields = b',"item_id":"%b","output_index":%d,"content_index":0,"delta":' % (at, index)  # (_where's)
                self._part, self._texts, self._logprobs, self._part_where = part, [text], [], fields
                self._fast = (TEXT_HEAD, fields, template)
                return
            else:
                self._emit(
                    out, {"type": "response.output_item.added", "output_index": len(self._items) - 1, "item": item}
                )
        if self._part != part:
            self._close_part(out)
            self._part, self._texts, self._logprobs, self._part_where = part, [], [], None
            empty: dict[str, Any] = (
                {"type": "output_text", "text": "", "annotations": []}
                if part == "output_text"
                else {"type": "refusal", "refusal": ""}
            )
            if part == "output_text" and self._logprobs_wanted:
                empty["logprobs"] = []
            self._emit(
                out,
                {
                    "type": "response.content_part.added",
                    **self._at(),
                    "content_index": len(self._items[-1]["content"]),
                    "part": empty,
                },
            )
        self._texts.append(text)
        where = self._part_where
        if where is None:
            where = self._part_where = self._where(b"content_index", len(self._items[-1]["content"]))
            if part == "output_text" and not self._logprobs_wanted:
                self._fast = (TEXT_HEAD, where, delta_template(TEXT_HEAD, where))
        if part != "output_text":
            self._delta(out, b"response.refusal.delta", where, text)
        elif self._logprobs_wanted:
            entries = logprobs.get("content") if isinstance(logprobs, dict) else None
            entries = entries if isinstance(entries, list) else []
            self._logprobs.extend(entries)
            self._delta(out, b"response.output_text.delta", where, text, b',"logprobs":' + orjson.dumps(entries) + b"}")
        elif self._fast is not None:  # the part's delta template (made when it opened): no _delta call
            seq = self._seq
            self._seq = seq + 1
            out.append(self._fast[2] % (seq, orjson.dumps(text)))
        else:
            self._delta(out, b"response.output_text.delta", where, text, b',"logprobs":[]}')

    def _call(self, call: dict[str, Any], out: list[bytes]) -> None:
        function = call.get("function") if isinstance(call.get("function"), dict) else None
        custom = call.get("custom") if isinstance(call.get("custom"), dict) else None
        index = call.get("index")
        if self._open != "call" or index != self._call_index:  # calls come one after another
            self._close(out)
            self._call_index = index
            item = call_item(self._frame, {**call, "function": {**(function or {}), "arguments": ""}}, "in_progress")
            if custom is not None:
                item["input"] = ""
            self._items.append(item)
            self._open, self._texts = "call", []
            self._emit(out, {"type": "response.output_item.added", "output_index": len(self._items) - 1, "item": item})
        piece = (function or {}).get("arguments") if custom is None else (custom or {}).get("input")
        if isinstance(piece, str) and piece:
            self._texts.append(piece)
            kind = (
                "custom_tool_call_input" if self._items[-1]["type"] == "custom_tool_call" else "function_call_arguments"
            )
            self._delta(out, b"response." + kind.encode() + b".delta", self._where(), piece)

    # --- the end ---------------------------------------------------------------------------------
    def _end(self, out: list[bytes]) -> None:
        """The chat stream ended cleanly: close the open item, then ``response.completed`` (or incomplete)."""
        if not self._started:  # an upstream that ended without a single chunk
            self._start(out)
        chat_usage = self._chat_usage
        if chat_usage is None:  # (the OpenAI-shaped relays hand it over read: usage_fields)
            chat_usage = self._chat_usage = self._inner.usage_fields
            if chat_usage is not None:
                self.relayed_events += 1  # (its chunk, which this stream did not see)
        counts = usage_of(chat_usage)
        if counts is not None:  # (read once: responses_usage takes the counts read)
            usage = responses_usage(chat_usage, counts)
        else:
            counts = self._inner.usage
            usage = None if counts is None else responses_usage(counts.as_json())
        finish = self._finish
        self._complete(out, INCOMPLETE[finish] if finish in INCOMPLETE else None, usage)
        self.usage = counts
        self.finished = True
        self._done = True
