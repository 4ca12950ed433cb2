"""What the store keeps per response, and the ids the gateway mints.

One record per stored response, under the response's id: four JSON values (orjson, which never
writes a raw newline) on four lines, so each reader parses only what it needs::

    [<ids of the earlier responses of its conversation, oldest first>]   chain
    [<its input items>]                                                   input
    [<its output items>]                                                  output
    {<the Response object as answered, "output": null>}                   the rest

``chain`` lets ``previous_response_id`` load a whole conversation in one store read, and a
conversation's earlier turns are read as their input and output lines alone (not their chains,
nor the Response's other fields). Saving a turn is one ``orjson.dumps`` per line and nothing
else: input items are kept as the request sent them, each with an ``id`` (named at save, so it
never changes), go upstream again so, and are put in the form ``GET /v1/responses/{id}/input_items``
lists them only there: a message's ``content`` as a list of parts (a string becomes one
``input_text`` part, or ``output_text`` for an assistant's), its ``type`` and ``status`` set
(:func:`listed`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from backends.responses.answer import new_id  # ``{prefix}_`` + 48 random hex digits

__all__ = [
    "Record", "Turn", "decode", "encode", "input_items", "item_id", "listed", "named", "new_id", "text_input_line",
    "turn_of",
]  # fmt: skip

# Id prefixes of the items the gateway names when a client sent them without an id.
_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
    "item_reference": "ref",
}


@dataclass(frozen=True, slots=True)
class Turn:
    """One earlier response of a conversation: what it was sent and what it answered."""

    response_id: str
    input: list[dict[str, Any]]
    output: list[dict[str, Any]]

    @property
    def items(self) -> list[dict[str, Any]]:
        return self.input + self.output


class Record:
    """A stored response, read from its record's bytes; each part is parsed when first asked for."""

    __slots__ = ("_lines", "_rest")

    def __init__(self, blob: bytes) -> None:
        self._lines = blob.split(b"\n", 3)
        self._rest: dict[str, Any] | None = None

    @property
    def chain(self) -> list[str]:
        chain: list[str] = orjson.loads(self._lines[0])
        return chain

    @property
    def input(self) -> list[dict[str, Any]]:
        """The input items in their listed form (``GET .../input_items``)."""
        return listed(self._input())

    def _input(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = orjson.loads(self._lines[1])
        return items

    @property
    def output(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = orjson.loads(self._lines[2])
        return items

    @property
    def response(self) -> dict[str, Any]:
        """The Response object as it was answered (its output in its place)."""
        response = dict(self._fields())
        response["output"] = self.output
        return response

    @property
    def model(self) -> str | None:
        model = self._fields().get("model")
        return model if isinstance(model, str) else None

    def _fields(self) -> dict[str, Any]:
        if self._rest is None:
            self._rest = orjson.loads(self._lines[3])
        return self._rest

    def turn(self, response_id: str) -> Turn:
        """This response as a turn of a conversation: its input items as the request sent them
        (each with its id), which is how they go upstream again."""
        return Turn(response_id, self._input(), self.output)


def turn_of(response_id: str, blob: bytes) -> Turn:
    """``decode(blob).turn(response_id)`` without the :class:`Record`: how a continuation reads
    each earlier turn of its conversation (its input and output lines alone, four calls a turn)."""
    _, items, output, _ = blob.split(b"\n", 3)
    return Turn(response_id, orjson.loads(items), orjson.loads(output))


_OUTPUT_KEY = b',"output":'
_USAGE_KEY = b',"usage":'
_OUTPUT_KEY_LEN = len(_OUTPUT_KEY)
_NULL_OUTPUT = b',"output":null'


# A request's input given as a string, as its record's input line: its one user message, named
# (``orjson.dumps`` of what gateway.flow.responses_turns.own_items makes of it, written without the dicts)
_TEXT_INPUT = b'[{"id":"%b","type":"message","role":"user","content":[{"type":"input_text","text":%b}]}]'


def text_input_line(text: str) -> bytes:
    """The input line of a turn whose request's ``input`` is the string ``text`` (a new ``msg_`` id):
    what :func:`encode` writes of that turn's items, for it to write as they are (``items`` as bytes)."""
    return _TEXT_INPUT % (new_id("msg").encode(), orjson.dumps(text))


def encode(
    response: dict[str, Any],
    items: Sequence[Mapping[str, Any]] | bytes,
    chain: Sequence[str],
    dumped: bytes | None = None,
    output_at: int = 0,
) -> bytes:
    """A record's bytes (module docstring). Raises ``TypeError`` for what JSON cannot hold.
    ``response`` is the same dict after (its ``output`` is null only while the last line is written).
    ``dumped``: ``orjson.dumps(response)``, where ``output`` then ``usage`` are its last keys (the
    bridge's Response, ``CompletionResult.dumped``): the last line is cut from it, not dumped again.
    ``output_at``: where in ``dumped`` its ``,"output":`` starts, where its writer says so
    (``CompletionResult.output_at``; 0: not said): the output's line is cut there too.
    ``items`` as bytes: their line already written (:func:`text_input_line`)."""
    # Written on every stored turn: no call but the dumps and the join (the lookup by ``in`` and
    # subscript, the list's test by ``type``: as quick, without a call each), and a first turn's
    # empty chain (the usual one) without its dumps.
    head = orjson.dumps(chain) if chain else b"[]"
    sent = items if type(items) is bytes else orjson.dumps(items)
    if output_at and dumped is not None:
        # usage's key is the last (its value: integers; rfind, as its writer said, from the end)
        usage_at = dumped.rfind(_USAGE_KEY)
        out, rest = dumped[output_at + _OUTPUT_KEY_LEN : usage_at], dumped[usage_at:]
        return b"".join((head, b"\n", sent, b"\n", out, b"\n", dumped[:output_at], _NULL_OUTPUT, rest))
    had = "output" in response
    output = response["output"] if had else None
    if dumped is not None and type(output) is list:
        # orjson writes a dict member by member: the Response with "output": null is its bytes with
        # the output's value (its own dumps, found between its key and usage's, the last) as null.
        # (One slice compared, not two startswith: their arguments' parse is most of their cost.)
        out = orjson.dumps(output)
        usage_at = dumped.rfind(_USAGE_KEY)
        key_at = usage_at - len(out) - _OUTPUT_KEY_LEN
        if key_at > 0 and dumped[key_at:usage_at] == _OUTPUT_KEY + out:
            rest = dumped[usage_at:]
            return b"".join((head, b"\n", sent, b"\n", out, b"\n", dumped[:key_at], _NULL_OUTPUT, rest))
    # The last line is the Response itself with "output": null, not a copy of it with that key
    # changed (copying its thirty-odd keys cost more than its dumps). Nothing runs in between, the
    # key keeps its place (the Response reads back in its order), and it is put back even when
    # the dumps raises.
    response["output"] = None
    try:
        rest = orjson.dumps(response)
    finally:
        if had:
            response["output"] = output
        else:
            del response["output"]
    return b"\n".join((head, sent, orjson.dumps(output) if type(output) is list else b"[]", rest))


def decode(blob: bytes) -> Record:
    return Record(blob)


def _message(item: dict[str, Any]) -> dict[str, Any]:
    content = item.get("content")
    if isinstance(content, str):
        text = (
            {"type": "output_text", "text": content, "annotations": []}
            if item.get("role") == "assistant"
            else {"type": "input_text", "text": content}
        )
        item = {**item, "content": [text]}
    elif "type" in item and "status" in item:
        return item  # already in its listed form (kept so, or a record written before items were kept as sent)
    return {"type": "message", **item, "status": item.get("status", "completed")}


def listed(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kept input items in their listed form (module docstring); an item already in it is not copied."""
    return [_message(item) if item.get("type", "message") == "message" else item for item in items]


def named(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` with an ``id`` each (the list itself when they all have one: the usual turn)."""
    for item in items:
        # _has_id, inline and without a call (as in encode): once per item of every stored turn
        name = item["id"] if "id" in item else None
        if not (type(name) is str and name):
            return [item if _has_id(item) else {**item, "id": _item_id(item)} for item in items]
    return items


def _has_id(item: Mapping[str, Any]) -> bool:
    name = item.get("id")
    return isinstance(name, str) and name != ""


def item_id(kind: str) -> str:
    """A new id for an input item of type ``kind`` that came without one (``msg_``, ``fc_``, ...)."""
    return new_id(_PREFIXES.get(kind, "item"))


def _item_id(item: Mapping[str, Any]) -> str:
    return item_id(str(item.get("type", "message")))


def input_items(request_input: str | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A request's ``input`` as the items to keep, in their listed form: each named (its own ``id``
    or a new one), a string or a message's string content as parts, an item's other fields as sent."""
    if isinstance(request_input, str):
        request_input = [{"type": "message", "role": "user", "content": request_input}]
    return listed(named([dict(item) for item in request_input]))
