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
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from backends.base import CompletionStream, usage_of
from backends.errors import UpstreamProtocolError
from backends.exact_json import dumps_exact
from backends.responses.answer import (
    ResponseFrame,
    call_item,
    new_id,
    reasoning_item,
    responses_usage,
)
from schemas.errors import GatewayError

__all__ = ["ChatResponseEvents", "ResponseEventStream", "event_bytes", "failure_of"]

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
_TEXT_DELTA = b"response.output_text.delta"
_TEXT_HEAD = b"event: " + _TEXT_DELTA + b'\ndata: {"type":"' + _TEXT_DELTA + b'","sequence_number":'
_NO_LOGPROBS = b',"logprobs":[]}\n\n'
_STATUS = b'"status":"in_progress"'
_NO_OUTPUT = b',"output":[],"usage":null}'
_NO_DETAILS = b'"incomplete_details":null'
_DETAILS = {reason: b'"incomplete_details":{"reason":"%b"}' % reason.encode() for reason in _INCOMPLETE.values()}
_WHERE_DELTA = len(b'"delta":')
# A message item opened with an empty output_text part (its sequence number, output index, id; the
# part's sequence number, the item's id and output index), as _emit writes the two events' dicts.
_OPEN_TEXT = (
    b'event: response.output_item.added\ndata: {"type":"response.output_item.added","sequence_number":%d,'
    b'"output_index":%d,"item":{"id":"%b","type":"message","role":"assistant","status":"in_progress","content":[]}}'
    b'\n\nevent: response.content_part.added\ndata: {"type":"response.content_part.added","sequence_number":%d,'
    b'"item_id":"%b","output_index":%d,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}\n\n'
)
_RUN = 3  # plain text events a read must still hold after one for a run of them to be written at once (_run)


# A JSON string (and the blanks before it), as a text event's content is written.
_JSON_STRING = re.compile(rb'\s*"(?:[^"\\]|\\.)*"')
_CONTENT_KEY = b'"content":'


# A plain text event's shape (_learn): the bytes before and after its string, their lengths, and
# what lies between two such events: after, separator, before (_run); after and the separator.
_Shape = tuple[bytes, bytes, int, int, bytes, bytes]


def _learn(raw: bytes) -> _Shape | None:
    """The shape of a plain text event (its bytes around its content string); None when
    ``"content":`` is not there exactly once or the event spans lines (then no shape is kept).
    A key is JSON structure, never generated text (quotes inside strings are escaped)."""
    if raw.count(_CONTENT_KEY) != 1 or b"\n" in raw:
        return None
    start = raw.index(_CONTENT_KEY) + len(_CONTENT_KEY)
    match = _JSON_STRING.match(raw, start)
    if match is None:
        return None
    before, after = raw[:start], raw[match.end() :]
    if not after:
        return None
    return before, after, len(before), len(after), after + b"\n\n" + before, after + b"\n\n"


def _delta_template(head: bytes, where: bytes) -> bytes:
    """A text delta event as a ``%`` template of its sequence number and its JSON string (_run)."""
    return head.replace(b"%", b"%%") + b"%d" + where.replace(b"%", b"%%") + b"%b" + _NO_LOGPROBS


def event_bytes(event: dict[str, Any], backend: str) -> bytes:
    """One SSE event as OpenAI writes it: ``event: <type>`` then the JSON ``data`` line."""
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + dumps_exact(event, backend, "a stream event") + b"\n\n"


def failure_of(error: GatewayError) -> dict[str, Any]:
    """A Response's ``error`` object for ``error`` (the envelope's code and message)."""
    body = error.envelope()["error"]
    return {"code": body.get("code") or "server_error", "message": body.get("message") or "upstream failure"}


class ResponseEventStream(CompletionStream):
    """A stream of Responses events: it can end itself with ``response.failed``, and say where it stands."""

    def failed_event(self, error: GatewayError) -> bytes:
        """The last event after a failure midway: ``response.failed`` with ``error``."""
        raise NotImplementedError

    def snapshot(self, status: str) -> dict[str, Any] | None:
        """The Response now (its final form once finished; else with ``status``), for the store."""
        raise NotImplementedError


class ChatResponseEvents(ResponseEventStream):
    """The Responses events of one chat stream (module docstring). Not thread-safe; one consumer."""

    relayed_events: int  # chat events translated: what the handler settles a stream cut midway with
    # Lifecycle events written from bytes (a message opened with its text part: _OPEN_TEXT; a text
    # part's, an item's and the last Response's closing events: _close_part, _item_done, _final_bytes);
    # off: each from its dict, the same bytes (the tests' reference).
    lifecycle_bytes = True

    def __init__(self, inner: CompletionStream, frame: ResponseFrame, backend: str) -> None:
        self._inner = inner
        self._frame = frame
        self._backend = backend
        self._seq = 0
        self._started = False
        self._done = False
        self._items: list[dict[str, Any]] = []  # output items, in order (the open one last)
        self._open: str | None = None  # "reasoning" | "message" | "call"
        self._part: str | None = None  # the open message part: "output_text" | "refusal"
        self._texts: list[str] = []  # the open part's (or reasoning's, or arguments') pieces
        self._logprobs: list[Any] = []
        self._part_where: bytes | None = None  # the open part's delta fields, made once
        # While an output_text part is open without logprobs: a text delta's bytes around its
        # sequence number, so the common event is one concatenation (_chunk), and the same as a
        # template, so a run of them is one format (_run).
        self._fast: tuple[bytes, bytes, bytes] | None = None
        # The bytes of the stream's plain text events around their content (_learn), once one was seen.
        self._shape: _Shape | None = None
        self._finish: str | None = None
        self._chat_usage: Any = None
        self._summary = frame.summarises
        self._call_index: Any = None
        self._logprobs_wanted = frame.request.wants_logprobs
        self.final: dict[str, Any] | None = None
        self.relayed_events = 0
        self._run_text = ""  # the text of the last run of events written at once (_run)
        # The first Response's bytes around its status and output (_start), and each closed item's
        # bytes (_item_done): response.completed is written from them (_final_bytes); None once
        # a piece could differ from the whole event's serialisation (orjson refused one, an item
        # holds what the upstream nested).
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
        self.final = response
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
    def _emit(self, out: list[bytes], event: dict[str, Any]) -> None:
        """``event`` (its ``type`` the first key, an event type: ASCII) written with the next sequence
        number after its type, as :func:`event_bytes` writes it, without a copy of the dict."""
        kind: str = event["type"]
        try:
            data = orjson.dumps(event)
        except orjson.JSONEncodeError:  # (integers beyond 64 bits, nesting past orjson's levels)
            data = dumps_exact(event, self._backend, "a stream event")
        at = len(kind) + 10  # past '{"type":"<kind>"'
        out.append(
            b"event: " + kind.encode() + b"\ndata: " + data[:at] + b',"sequence_number":%d' % self._seq
            + data[at:] + b"\n\n"
        )  # fmt: skip
        self._seq += 1

    def _start(self, out: list[bytes]) -> None:
        """``response.created`` and ``response.in_progress``: the same Response, serialised once."""
        self._started = True
        envelope = self._frame.envelope("in_progress", [])
        try:
            response = orjson.dumps(envelope)
        except orjson.JSONEncodeError:  # (an integer beyond 64 bits in the echoed request)
            response = dumps_exact(envelope, self._backend, "a stream event")
        else:
            # Its status is the first (only the id and created_at, both ours, come before it), its
            # output and usage the last keys (ResponseFrame.envelope): the echo between is reused.
            at = response.find(_STATUS)
            if self.lifecycle_bytes and at > 0 and response.endswith(_NO_OUTPUT):
                self._frame_bytes = (response[: at + 10], response[at + len(_STATUS) : -len(_NO_OUTPUT)])
        for seq, kind in enumerate((b"response.created", b"response.in_progress"), self._seq):
            out += (b"event: ", kind, b'\ndata: {"type":"', kind, b'","sequence_number":%d,"response":' % seq)
            out += (response, b"}\n\n")
        self._seq += 2

    def _delta(self, out: list[bytes], kind: bytes, where: bytes, text: str, tail: bytes = b"}") -> None:
        """A delta event from bytes (every token of a stream is one: no dict, no general serialiser).

        ``kind``: the event type; ``where``: its fixed fields after ``sequence_number`` (item id and
        indexes, ending in ``"delta":``); ``tail``: what follows the delta's JSON string.
        """
        seq = self._seq
        self._seq = seq + 1
        out.append(
            b"event: " + kind + b'\ndata: {"type":"' + kind + b'","sequence_number":' + str(seq).encode()
            + where + orjson.dumps(text) + tail + b"\n\n"
        )  # fmt: skip

    def _where(self, index_key: bytes = b"", index: int = 0) -> bytes:
        """The fixed fields of a delta of the open item: ``item_id``, ``output_index`` (and an index)."""
        item = self._items[-1]
        out = b',"item_id":' + orjson.dumps(item["id"]) + b',"output_index":' + str(len(self._items) - 1).encode()
        if index_key:
            out += b',"' + index_key + b'":' + str(index).encode()
        return out + b',"delta":'

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
            cut = chunk.find(b"\n\n", pos)
            if cut < 0:
                cut = end
            raw = chunk[pos:cut]
            pos = cut + 2
            # The common event, while a text part is open: the bytes of the last plain text event
            # with another JSON string as its content (_learn). Nothing else differs, so it means
            # what that event meant: written at once, its string as the upstream escaped it.
            if fast is not None and shape is not None and raw.startswith(shape[0]) and raw.endswith(shape[1]):
                if run and end - cut > _RUN * (shape[2] + shape[3]):  # more may follow: the run at once
                    taken, stop = self._run(chunk, cut - len(raw), shape, fast[2], seq, out)
                    if taken:
                        texts.append(self._run_text)
                        seq += taken
                        events += taken
                        pos = stop
                        continue
                    run = False
                piece = raw[shape[2] : -shape[3]]  # the after part is never empty (it closes the event)
                try:
                    text = loads(piece)
                except orjson.JSONDecodeError:
                    text = None
                if type(text) is str:
                    texts.append(text)
                    out += (fast[0], b"%d" % seq, fast[1], piece, _NO_LOGPROBS)  # joined once, by the caller
                    seq += 1
                    events += 1
                    continue
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
            # A piece of text and nothing else (one choice, no finish, no logprobs, no usage) while a
            # text part is open (every token of a stream but its first): written at once.
            if fast is not None:
                try:
                    (choice,) = obj["choices"]  # exactly one
                    text = choice["delta"]["content"]
                    plain = (
                        type(text) is str
                        and len(choice["delta"]) == 1
                        and choice.get("index", 0) == 0
                        and choice.get("finish_reason") is None
                        and choice.get("logprobs") is None
                        and obj.get("usage") is None
                    )
                except (KeyError, TypeError, ValueError, AttributeError):  # another shape: the general way
                    plain = False
                if plain:
                    texts.append(text)
                    out.append(fast[0] + b"%d" % seq + fast[1] + orjson.dumps(text) + _NO_LOGPROBS)
                    seq += 1
                    shape = self._shape = _learn(raw)
                    continue
            self._seq = seq
            if "usage" in obj and type(obj["usage"]) is dict:
                self._chat_usage = obj["usage"]
            choices = obj.get("choices")
            for choice in choices if type(choices) is list else ():
                if type(choice) is dict and choice.get("index", 0) == 0:
                    self._choice(choice, out)
            fast, seq, texts = self._fast, self._seq, self._texts
        self._seq = seq
        self.relayed_events += events

    def _run(
        self, chunk: bytes, start: int, shape: _Shape, template: bytes, seq: int, out: list[bytes]
    ) -> tuple[int, int]:
        """The plain text events of ``chunk`` from ``start`` (where one begins) written at once: how
        many, and where the next event begins; ``(0, start)`` when the loop is to take them one by
        one. Their text goes to ``_run_text``.

        The rest of the read is cut after each ``after`` and separator; the pieces up to the last
        such cut, or up to one that spans two events (an event of another kind between: it holds
        a separator), are taken. They are plain text events when (1) each but the first starts with
        ``before``: the cuts are the only places the shape's middle (``after``, separator,
        ``before``) can be, since ``after`` holds no line feed, so its count over them says so; and
        (2) what follows ``before`` in each is one JSON string: read together as one JSON array,
        they give as many strings as pieces (an empty piece, or one with two values, gives no
        array of that length) and hold no line feed (each lies within one event).
        """
        pieces = chunk[start:].split(shape[5])
        stop = len(chunk) - len(pieces.pop())  # what follows the last event ending in ``after``: the loop's
        taken = len(pieces)
        if taken < 2:
            return 0, start
        cut = shape[2]
        strings = [piece[cut:] for piece in pieces]
        array = b"[" + b"\n,".join(strings) + b"]"  # (JSON allows the line feed before a comma)
        if array.count(b"\n") != taken - 1:  # a piece spans two events: the run ends before it
            spans = array.find(b"\n\n")
            taken = array.count(b"\n,", 0, spans) if spans > 0 else 0
            if taken < 2:
                return 0, start
            strings = strings[:taken]
            array = b"[" + b"\n,".join(strings) + b"]"
            if array.count(b"\n") != taken - 1:
                return 0, start
            stop = start + len(b"".join(pieces[:taken])) + taken * len(shape[5])
        if chunk.count(shape[4], start, stop) != taken - 1:
            return 0, start
        try:
            texts = orjson.loads(array)
            self._run_text = "".join(texts)  # (a TypeError for anything but strings)
        except (orjson.JSONDecodeError, TypeError):
            return 0, start
        if len(texts) != taken:
            return 0, start
        args: list[Any] = strings * 2  # sequence numbers and strings, taken in turns by the template
        args[::2] = range(seq, seq + taken)
        args[1::2] = strings
        out.append((template * taken) % tuple(args))
        return taken, stop

    def _choice(self, choice: dict[str, Any], out: list[bytes]) -> None:
        # Keys looked for with ``in``: most events carry one or two of the five.
        delta = choice.get("delta")
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
                    self._text("output_text", content, choice.get("logprobs"), out)
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
            self._close(out)
            item = reasoning_item(self._frame, "", new_id("rs"), "in_progress")
            item["summary"], item["content"] = [], []
            self._items.append(item)
            self._open, self._texts = "reasoning", []
            self._emit(out, {"type": "response.output_item.added", "output_index": len(self._items) - 1, "item": item})
            if self._summary:
                part = {"type": "summary_text", "text": ""}
                self._emit(
                    out,
                    {"type": "response.reasoning_summary_part.added", **self._at(), "summary_index": 0, "part": part},
                )
        self._texts.append(text)
        if self._summary:
            self._delta(out, b"response.reasoning_summary_text.delta", self._where(b"summary_index"), text)
        else:
            self._delta(out, b"response.reasoning_text.delta", self._where(b"content_index"), text)

    def _text(self, part: str, text: str, logprobs: Any, out: list[bytes]) -> None:
        if self._open != "message":
            self._close(out)
            item_id = new_id("msg")
            item = {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
            self._items.append(item)
            self._open, self._part = "message", None
            if part == "output_text" and not self._logprobs_wanted and self.lifecycle_bytes:
                # The item and its first part (an answer's usual start) from one template: no dicts.
                seq, index, at = self._seq, len(self._items) - 1, item_id.encode()
                self._seq = seq + 2
                out.append(_OPEN_TEXT % (seq, index, at, seq + 1, at, index))
                fields = b',"item_id":"%b","output_index":%d,"content_index":0,"delta":' % (at, index)  # (_where's)
                self._part, self._texts, self._logprobs, self._part_where = part, [], [], fields
                self._fast = (_TEXT_HEAD, fields, _delta_template(_TEXT_HEAD, fields))
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
                self._fast = (_TEXT_HEAD, where, _delta_template(_TEXT_HEAD, where))
        if part != "output_text":
            self._delta(out, b"response.refusal.delta", where, text)
        elif self._logprobs_wanted:
            entries = logprobs.get("content") if isinstance(logprobs, dict) else None
            entries = entries if isinstance(entries, list) else []
            self._logprobs.extend(entries)
            self._delta(out, b"response.output_text.delta", where, text, b',"logprobs":' + orjson.dumps(entries) + b"}")
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

    # --- closing ------------------------------------------------------------------------------------
    def _at(self) -> dict[str, Any]:
        return {"item_id": self._items[-1]["id"], "output_index": len(self._items) - 1}

    def _close_part(self, out: list[bytes]) -> None:
        self._fast = None
        if self._part is None:
            return
        text = "".join(self._texts)
        where = self._part_where
        if self._part == "output_text" and not self._logprobs_wanted and where is not None and self.lifecycle_bytes:
            # The two events from bytes: the part's fixed fields (its deltas') and its text's JSON, once.
            try:
                data = orjson.dumps(text)
            except orjson.JSONEncodeError:  # (not reached: the text was read as JSON)
                data = b""
            if data:
                at_bytes, seq = where[:-_WHERE_DELTA], self._seq
                self._seq = seq + 2
                out.append(
                    b'event: response.output_text.done\ndata: {"type":"response.output_text.done","sequence_number":%d'
                    b'%b"text":%b,"logprobs":[]}\n\nevent: response.content_part.done\ndata: {"type":'
                    b'"response.content_part.done","sequence_number":%d%b"part":{"type":"output_text","text":%b,'
                    b'"annotations":[]}}\n\n' % (seq, at_bytes, data, seq + 1, at_bytes, data)
                )
                self._items[-1]["content"].append({"type": "output_text", "text": text, "annotations": []})
                self._part, self._texts = None, []
                return
        at = {**self._at(), "content_index": len(self._items[-1]["content"])}
        if self._part == "output_text":
            part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
            done: dict[str, Any] = {"type": "response.output_text.done", **at, "text": text}
            if self._logprobs_wanted:
                part["logprobs"] = done["logprobs"] = self._logprobs
            else:
                done["logprobs"] = []
        else:
            part = {"type": "refusal", "refusal": text}
            done = {"type": "response.refusal.done", **at, "refusal": text}
        self._emit(out, done)
        self._emit(out, {"type": "response.content_part.done", **at, "part": part})
        self._items[-1]["content"].append(part)
        self._part, self._texts = None, []

    def _closed_item(self, status: str) -> dict[str, Any]:
        """The open item as it stands, closed with ``status`` (its text joined), without events."""
        item = dict(self._items[-1])
        text = "".join(self._texts)
        if self._open == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": text}]
            item["summary"] = [{"type": "summary_text", "text": text}] if self._summary else []
        elif self._open == "call":
            item["input" if item["type"] == "custom_tool_call" else "arguments"] = text
        elif self._open == "message" and self._part is not None:
            part = (
                {"type": "output_text", "text": text, "annotations": []}
                if self._part == "output_text"
                else {"type": "refusal", "refusal": text}
            )
            item["content"] = [*item["content"], part]
        item["status"] = status
        return item

    def _close(self, out: list[bytes], status: str = "completed") -> None:
        """Close the open item, with its ``.done`` events."""
        if self._open is None:
            return
        item = self._items[-1]
        at = self._at()
        text = "".join(self._texts)
        if self._open == "reasoning":
            if self._summary:
                self._emit(
                    out, {"type": "response.reasoning_summary_text.done", **at, "summary_index": 0, "text": text}
                )
                part = {"type": "summary_text", "text": text}
                self._emit(
                    out, {"type": "response.reasoning_summary_part.done", **at, "summary_index": 0, "part": part}
                )
            else:
                self._emit(out, {"type": "response.reasoning_text.done", **at, "content_index": 0, "text": text})
            item.update(self._closed_item(status))
        elif self._open == "call":
            if item["type"] == "custom_tool_call":
                self._emit(out, {"type": "response.custom_tool_call_input.done", **at, "input": text})
            else:
                done = {"type": "response.function_call_arguments.done", **at, "arguments": text, "name": item["name"]}
                self._emit(out, done)
            item.update(self._closed_item(status))
        else:
            self._close_part(out)
            item["status"] = status
        self._item_done(out, item)
        self._open, self._part, self._texts = None, None, []

    def _item_done(self, out: list[bytes], item: dict[str, Any]) -> None:
        """``response.output_item.done`` for ``item``, its bytes kept for response.completed (_final_bytes)
        where they are what the whole event's serialisation holds: only strings from the upstream
        (no logprobs, a call's id and name strings), so orjson writes them the same at any depth."""
        kind = item["type"]
        flat = self._frame_bytes is not None and (
            not self._logprobs_wanted
            if kind == "message"
            else kind == "reasoning" or all(type(v) is str for v in item.values())
        )
        if flat:
            try:
                data = orjson.dumps(item)
            except orjson.JSONEncodeError:  # (not reached: strings only)
                flat = False
        if not flat:
            self._frame_bytes = None
            self._emit(out, {"type": "response.output_item.done", "output_index": len(self._items) - 1, "item": item})
            return
        self._item_bytes.append(data)
        out.append(
            b'event: response.output_item.done\ndata: {"type":"response.output_item.done","sequence_number":%d,'
            b'"output_index":%d,"item":%b}\n\n' % (self._seq, len(self._items) - 1, data)
        )
        self._seq += 1

    def _end(self, out: list[bytes]) -> None:
        """The chat stream ended cleanly: close the open item, then ``response.completed`` (or incomplete)."""
        if not self._started:  # an upstream that ended without a single chunk
            self._start(out)
        incomplete = _INCOMPLETE.get(self._finish or "")
        self._close(out, "incomplete" if incomplete else "completed")
        counts = usage_of(self._chat_usage)
        if counts is not None:  # (read once: responses_usage takes the counts read)
            usage = responses_usage(self._chat_usage, counts)
        else:
            counts = self._inner.usage
            usage = None if counts is None else responses_usage(counts.as_json())
        status = "incomplete" if incomplete else "completed"
        self.final = self._frame.envelope(status, self._items, usage, incomplete=incomplete)
        data = self._final_bytes(usage, incomplete)
        if data is None:
            self._emit(out, {"type": f"response.{status}", "response": self.final})
        else:
            kind = b"response.completed" if status == "completed" else b"response.incomplete"
            out.append(
                b'event: %b\ndata: {"type":"%b","sequence_number":%d,"response":%b}\n\n' % (kind, kind, self._seq, data)
            )
            self._seq += 1
        self.usage = counts
        self.finished = True
        self._done = True

    def _final_bytes(self, usage: dict[str, Any] | None, incomplete: str | None) -> bytes | None:
        """The final Response's bytes from the first one's and the items' (what ``orjson.dumps(self.final)``
        gives, without serialising the echoed request and the texts again); None: the general way."""
        frame = self._frame_bytes
        if frame is None or len(self._item_bytes) != len(self._items):
            return None
        try:
            counts = orjson.dumps(usage)
        except orjson.JSONEncodeError:  # (a count beyond 64 bits)
            return None
        head, echo = frame
        if incomplete is not None:  # the first such key is the Response's own (only ours come before it)
            echo = echo.replace(_NO_DETAILS, _DETAILS[incomplete], 1)
        status_bytes = b"completed" if incomplete is None else b"incomplete"
        return b'%b%b"%b,"output":[%b],"usage":%b}' % (head, status_bytes, echo, b",".join(self._item_bytes), counts)
