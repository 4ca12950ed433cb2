"""A Response's output items written as Responses events: the chat bridge's writing half.

:class:`ResponseWriter` owns what the events say and their order: the sequence numbers, the
output items (the open one last) and their parts, ``response.created`` / ``in_progress``, the
delta events, each part's and item's closing events, and the bytes ``response.completed`` is
written from (:mod:`backends.responses.lifecycle_bytes`). What it is fed, and when, is the
reader's (:class:`~backends.responses.events.ChatResponseEvents`, whose ``__init__`` sets the
state declared here: one constructor call per stream). Not thread-safe; one consumer.
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.exact_json import dumps_exact
from backends.responses.answer import ResponseFrame
from backends.responses.event_stream import ResponseEventStream
from backends.responses.lifecycle_bytes import (
    ARGUMENTS_DONE,
    DELTA,
    ENDS,
    INPUT_DONE,
    ITEM_DONE,
    LAST_EVENT,
    LAST_RESPONSE,
    OPEN_REASONING,
    REASONING_DONE,
    REASONING_ITEM,
    START,
    SUMMARY,
    SUMMARY_ADDED,
    SUMMARY_DONE,
    TEXT_DONE,
    TEXT_MESSAGE,
    WHERE_DELTA,
    detailed,
    final_bytes,
)

__all__ = ["ResponseWriter"]


class ResponseWriter(ResponseEventStream):
    """The output items of one Response and their events (module docstring)."""

    # Lifecycle events written from bytes (a message opened with its text part: OPEN_TEXT; a text
    # part's, an item's and the last Response's closing events: _close_part, _item_done, final_bytes);
    # off: each from its dict, the same bytes (the tests' reference).
    lifecycle_bytes = True

    _frame: ResponseFrame
    _backend: str
    _seq: int  # the next event's sequence number
    _started: bool  # response.created and response.in_progress written
    _items: list[dict[str, Any]]  # output items, in order (the open one last)
    _open: str | None  # "reasoning" | "message" | "call"
    _part: str | None  # the open message part: "output_text" | "refusal"
    _texts: list[str]  # the open part's (or reasoning's, or arguments') pieces
    _logprobs: list[Any]
    _part_where: bytes | None  # the open part's delta fields, made once
    # While an output_text part is open without logprobs: a text delta's bytes around its
    # sequence number, so the common event is one concatenation, and the same as a template, so a
    # run of them is one format (backends.responses.text_run).
    _fast: tuple[bytes, bytes, bytes] | None
    _summary: bool  # reasoning written as a summary
    _reasoning_delta: tuple[bytes, bytes]  # the open reasoning item's delta type and fixed fields (_open_reasoning)
    _logprobs_wanted: bool
    # The first Response's bytes around its status (_start: ResponseFrame.around_status), and each closed
    # item's bytes (_item_done): response.completed is written from them (_complete); None once a piece
    # could differ from the whole event's serialisation (orjson refused one, an item holds what the
    # upstream nested).
    _frame_bytes: tuple[bytes, bytes] | None
    _item_bytes: list[bytes]
    final: dict[str, Any] | None  # the last Response (the store's), once written

    # --- writing -------------------------------------------------------------------------------
    def _emit(self, out: list[bytes], event: dict[str, Any]) -> None:
        """``event`` (its ``type`` the first key, an event type: ASCII) written with the next sequence
        number after its type, as :func:`event_bytes` writes it, without a copy of the dict."""
        kind: str = event["type"]
        try:
            data = orjson.dumps(event)
        except orjson.JSONEncodeError:  # (integers beyond 64 bits, nesting past orjson's levels)
            data = dumps_exact(event, self._backend, "a stream event")
        at = len(kind) + 10  # past '{"type":"<kind>"'
        out.append(b'event: %b\ndata: %b,"sequence_number":%d%b\n\n' % (kind.encode(), data[:at], self._seq, data[at:]))
        self._seq += 1

    def _start(self, out: list[bytes]) -> None:
        """``response.created`` and ``response.in_progress``: the same Response, its echo serialised once."""
        self._started = True
        frame = self._frame.around_status() if self.lifecycle_bytes else None
        if frame is None:  # (the dicts' way: an echo orjson refuses, or the tests' reference)
            response = self._frame.envelope("in_progress", [])
            self._emit(out, {"type": "response.created", "response": response})
            self._emit(out, {"type": "response.in_progress", "response": response})
            return
        # Both events from one template; response.completed reuses the same bytes (_complete).
        self._frame_bytes = frame
        seq = self._seq
        self._seq = seq + 2
        head, echo = frame
        out.append(START % (seq, head, echo, seq + 1, head, echo))

    def _delta(self, out: list[bytes], kind: bytes, where: bytes, text: str, tail: bytes = b"}") -> None:
        """A delta event from bytes (every token of a stream is one: no dict, no general serialiser).

        ``kind``: the event type; ``where``: its fixed fields after ``sequence_number`` (item id and
        indexes, ending in ``"delta":``); ``tail``: what follows the delta's JSON string.
        """
        seq = self._seq
        self._seq = seq + 1
        out.append(DELTA % (kind, kind, seq, where, orjson.dumps(text), tail))

    def _open_reasoning(self, out: list[bytes], item_id: str) -> None:
        """Open a reasoning item ``item_id``: its ``output_item.added`` (and the summary's part, where one
        is given) from templates, and its deltas' type and fixed fields made once."""
        item = {"id": item_id, "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
        self._items.append(item)
        self._open, self._texts = "reasoning", []
        index, at, summary = len(self._items) - 1, item_id.encode(), self._summary
        if summary:
            kind, key = b"response.reasoning_summary_text.delta", b"summary_index"
        else:
            kind, key = b"response.reasoning_text.delta", b"content_index"
        if not self.lifecycle_bytes:  # (the tests' reference: from dicts, and _where)
            self._emit(out, {"type": "response.output_item.added", "output_index": index, "item": item})
            if summary:
                added = {"type": "response.reasoning_summary_part.added", **self._at(), "summary_index": 0}
                self._emit(out, {**added, "part": {"type": "summary_text", "text": ""}})
            self._reasoning_delta = (kind, self._where(key))
            return
        seq = self._seq
        if summary:
            self._seq = seq + 2
            out.append(OPEN_REASONING % (seq, index, at) + SUMMARY_ADDED % (seq + 1, at, index))
        else:
            self._seq = seq + 1
            out.append(OPEN_REASONING % (seq, index, at))
        self._reasoning_delta = (kind, b',"item_id":"%b","output_index":%d,"%b":0,"delta":' % (at, index, key))

    def _where(self, index_key: bytes = b"", index: int = 0) -> bytes:
        """The fixed fields of a delta of the open item: ``item_id``, ``output_index`` (and an index)."""
        item = self._items[-1]
        out = b',"item_id":' + orjson.dumps(item["id"]) + b',"output_index":' + str(len(self._items) - 1).encode()
        if index_key:
            out += b',"' + index_key + b'":' + str(index).encode()
        return out + b',"delta":'

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
                at_bytes, seq = where[:-WHERE_DELTA], self._seq
                self._seq = seq + 2
                out.append(TEXT_DONE % (seq, at_bytes, data, seq + 1, at_bytes, data))
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
        if self._open != "message" and self.lifecycle_bytes and self._closed_from_bytes(out, item, status):
            self._open, self._part, self._texts = None, None, []
            return
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

    def _closed_from_bytes(self, out: list[bytes], item: dict[str, Any], status: str) -> bool:
        """A reasoning item's or a call's closing events from templates, its text's JSON made once (the
        bytes _close's dicts give); False: orjson refused a piece, the dicts' way."""
        text = "".join(self._texts)
        index, seq = len(self._items) - 1, self._seq
        custom = item["type"] == "custom_tool_call"
        try:
            data = orjson.dumps(text)
            name = orjson.dumps(item["name"]) if self._open == "call" and not custom else b""
        except orjson.JSONEncodeError:  # (not reached: strings read as JSON, the name ours)
            return False
        item_id = item["id"].encode()
        if self._open == "reasoning":
            summary = self._summary
            if summary:
                out.append(SUMMARY_DONE % (seq, item_id, index, data, seq + 1, item_id, index, data))
                seq += 2
            else:
                out.append(REASONING_DONE % (seq, item_id, index, data))
                seq += 1
            item["summary"] = [{"type": "summary_text", "text": text}] if summary else []
            item["content"] = [{"type": "reasoning_text", "text": text}]
            item["status"] = status
            self._seq = seq + 1
            closed = REASONING_ITEM % (item_id, SUMMARY % data if summary else b"[]", data, status.encode())
            out.append(ITEM_DONE % (seq, index, closed))
            if self._frame_bytes is not None:
                self._item_bytes.append(closed)
            return True
        if custom:
            out.append(INPUT_DONE % (seq, item_id, index, data))
            item["input"] = text
        else:
            out.append(ARGUMENTS_DONE % (seq, item_id, index, data, name))
            item["arguments"] = text
        item["status"] = status
        self._seq = seq + 1
        self._item_done(out, item)
        return True

    def _item_done(self, out: list[bytes], item: dict[str, Any]) -> None:
        """``response.output_item.done`` for ``item``, its bytes kept for response.completed (final_bytes)
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
        out.append(ITEM_DONE % (self._seq, len(self._items) - 1, data))
        self._seq += 1

    # --- the end ------------------------------------------------------------------------------------
    def _complete(self, out: list[bytes], incomplete: str | None, usage: dict[str, Any] | None) -> None:
        """Close the open item, then ``response.completed`` (``response.incomplete`` with ``incomplete``, its
        reason); ``final``: that Response."""
        status = "completed" if incomplete is None else "incomplete"
        items = self._items
        frame = self._frame_bytes
        where = self._part_where
        # (With frame bytes, every closed item's bytes are kept: _item_done drops the frame otherwise.)
        if (
            frame is not None and where is not None and self._part == "output_text" and self._open == "message"
            and not self._logprobs_wanted and not items[-1]["content"]
        ):  # fmt: skip
            # The common end, a message's one text part open: its closing events, the message's and the
            # last one in one template, the text's JSON made once (the bytes _close and final_bytes write).
            text = "".join(self._texts)
            try:
                data, counts = orjson.dumps(text), orjson.dumps(usage)
            except orjson.JSONEncodeError:  # (a count beyond 64 bits: the general way)
                data = b""
            if data:
                item = items[-1]
                head, echo = frame
                closed, template = ENDS[incomplete]  # (TEXT_END, its last event's type written in)
                if incomplete is not None:
                    echo = detailed(echo, incomplete)
                message = TEXT_MESSAGE % (item["id"].encode(), closed, data)
                earlier = self._item_bytes
                outputs = b",".join([*earlier, message]) if earlier else message
                at, seq = where[:-WHERE_DELTA], self._seq
                self._seq = seq + 4
                dumped = LAST_RESPONSE % (head, closed, echo, outputs, counts)
                out.append(
                    template % (seq, at, data, seq + 1, at, data, seq + 2, len(items) - 1, message, seq + 3, dumped)
                )
                item["content"].append({"type": "output_text", "text": text, "annotations": []})
                item["status"] = status
                self._open, self._part, self._texts, self._fast = None, None, [], None
                self.final = self._frame.envelope(status, items, usage, incomplete=incomplete)
                self.final_dumped = dumped
                self.final_output_at = len(head) + len(closed) + 2 + len(echo)  # (output_at's, inline)
                return
        self._close(out, status)
        self.final = self._frame.envelope(status, items, usage, incomplete=incomplete)
        last = final_bytes(frame, self._item_bytes, len(items), usage, incomplete)
        if last is None:
            self._emit(out, {"type": f"response.{status}", "response": self.final})
        else:
            kind = b"response.completed" if incomplete is None else b"response.incomplete"
            dumped, offset = last
            out.append(LAST_EVENT % (kind, kind, self._seq, dumped))
            self._seq += 1
            self.final_dumped, self.final_output_at = dumped, offset
