"""The output of a relayed Responses stream as far as it came, for a stream cut short (``openai``).

:class:`OutputSoFar` folds OpenAI's semantic events (the relay's reads, kept as bytes: see
:mod:`backends.responses.native_events`) into the Response's output items, as the chat bridge's
snapshot has them (``ResponseWriter._closed_item``): an item done as the upstream sent it; an
item still open with what it holds so far (its parts, its text, arguments or summary: the deltas
joined) and status ``incomplete``. The fold stops at the upstream's failure (``error``,
``response.failed``) or at anything that is not an event, as the relay does: what it did not
relay is not kept. Built only when asked for, so a stream that ends well parses nothing here.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

from backends.errors import UpstreamProtocolError
from backends.exact_json import loads_keeping_integers
from backends.transport.sse import sse_data

__all__ = ["OutputSoFar"]

# Where a text event writes: the item's list its part is in ("" for the item itself) and the field.
_TEXT = {
    "response.output_text": ("content", "text"),
    "response.refusal": ("content", "refusal"),
    "response.reasoning_text": ("content", "text"),
    "response.reasoning_summary_text": ("summary", "text"),
    "response.function_call_arguments": ("", "arguments"),
    "response.custom_tool_call_input": ("", "input"),
}
# The part a delta writes to where its ``part.added`` never came: the type it has in OpenAI's API.
_PART = {"response.output_text": "output_text", "response.refusal": "refusal",
         "response.reasoning_text": "reasoning_text", "response.reasoning_summary_text": "summary_text"}  # fmt: skip
_ENDS = frozenset({"error", "response.failed"})

_Slot = tuple[int, str, int, str]  # (output_index, "content" / "summary" / "", part index, field)


class OutputSoFar:
    """The output items folded from a stream's events so far (module docstring). Not thread-safe."""

    __slots__ = ("_backend", "_done", "_items", "_stopped", "_texts")

    def __init__(self, backend: str) -> None:
        self._backend = backend
        self._items: dict[int, dict[str, Any]] = {}  # by output_index
        self._done: set[int] = set()
        # A text being streamed: its pieces, joined only for the output (a long answer is many).
        self._texts: dict[_Slot, list[str]] = {}
        self._stopped = False

    def fold(self, reads: list[bytes]) -> None:
        """Take the events of ``reads`` (blocks of whole SSE events, as the relay read them)."""
        for block in reads:
            for data in sse_data(block):
                if self._stopped:
                    return
                try:
                    event = loads_keeping_integers(data, self._backend)
                except (orjson.JSONDecodeError, UpstreamProtocolError):
                    event = None
                if not isinstance(event, dict) or not isinstance(event.get("type"), str) or event["type"] in _ENDS:
                    self._stopped = True  # the relay's end too: nothing after it reached the client
                    return
                self._take(event)

    def output(self) -> list[dict[str, Any]]:
        """The items in order: those done as sent, the open ones closed ``incomplete`` (copies)."""
        out = []
        for index in sorted(self._items):
            item = self._items[index]
            if index not in self._done:
                item = copy.deepcopy(item)
                for (at, where, part, field), pieces in self._texts.items():
                    if at == index:
                        target = item[where][part] if where else item
                        target[field] = "".join(pieces)
                item["status"] = "incomplete"
            out.append(item)
        return out

    def _take(self, event: dict[str, Any]) -> None:
        kind: str = event["type"]
        index = event.get("output_index")
        if type(index) is not int:
            return  # the lifecycle events (the relay keeps their Response), or none of the output's
        if kind == "response.output_item.added" or kind == "response.output_item.done":
            item = event.get("item")
            if isinstance(item, dict):
                self._items[index] = item
                self._texts = {slot: pieces for slot, pieces in self._texts.items() if slot[0] != index}
                if kind == "response.output_item.done":
                    self._done.add(index)
                else:
                    self._done.discard(index)
            return
        item = self._items.get(index)
        if item is None or index in self._done:
            return  # an event for an item never added (or already done): nothing to show it in
        if kind.startswith("response.content_part.") or kind.startswith("response.reasoning_summary_part."):
            where = "content" if kind.startswith("response.content_part.") else "summary"
            at, part = _part_index(event, where), event.get("part")
            if at is not None and isinstance(part, dict) and _holds(item, where, at):
                item[where][at] = dict(part)
                self._texts = {slot: pieces for slot, pieces in self._texts.items() if slot[:3] != (index, where, at)}
            return
        stem, _, end = kind.rpartition(".")
        if stem not in _TEXT or end not in ("delta", "done"):
            if kind == "response.output_text.annotation.added":
                at = _part_index(event, "content")
                if at is not None and _holds(item, "content", at, "output_text"):
                    annotations = item["content"][at].setdefault("annotations", [])
                    if isinstance(annotations, list):
                        annotations.append(event.get("annotation"))
            return
        where, field = _TEXT[stem]
        at = 0
        if where:
            found = _part_index(event, where)
            if found is None or not _holds(item, where, at := found, _PART[stem]):
                return
        slot = (index, where, at, field)
        if end == "done":
            value = event.get(field)  # the whole text, under the field's own name
            if isinstance(value, str):
                (item[where][at] if where else item)[field] = value
                self._texts.pop(slot, None)
            return
        delta = event.get("delta")
        if isinstance(delta, str):
            pieces = self._texts.get(slot)
            if pieces is None:
                now = (item[where][at] if where else item).get(field)
                pieces = self._texts[slot] = [now] if isinstance(now, str) else []
            pieces.append(delta)


def _part_index(event: dict[str, Any], where: str) -> int | None:
    at = event.get("content_index" if where == "content" else "summary_index")
    return at if type(at) is int and 0 <= at < 1024 else None


def _holds(item: dict[str, Any], where: str, at: int, new: str | None = None) -> bool:
    """Whether ``item[where]`` has a part at ``at``; one is made where the list ends there (a
    ``part.added`` about to set it, or of type ``new``: a delta whose ``part.added`` never came).
    False where the item has no such list or the index is past its end."""
    parts = item.get(where)
    if parts is None:
        parts = item[where] = []
    if not isinstance(parts, list) or at > len(parts):
        return False
    if at == len(parts):
        if new is None:
            parts.append({})
        else:
            text = "refusal" if new == "refusal" else "text"
            parts.append({"type": new, text: "", **({"annotations": []} if new == "output_text" else {})})
    return isinstance(parts[at], dict)
