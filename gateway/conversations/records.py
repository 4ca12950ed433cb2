"""What the store keeps per response, and the ids the gateway mints.

One record per stored response, one JSON value (orjson), under the response's id::

    {"response": <the Response object as answered>, "input": [<its input items>],
     "chain": [<ids of the earlier responses of its conversation, oldest first>]}

``chain`` lets ``previous_response_id`` load a whole conversation in one store read. Input items
are kept in the form ``GET /v1/responses/{id}/input_items`` lists them: each has an ``id``, and a
message's ``content`` is a list of parts (a string becomes one ``input_text`` part, or
``output_text`` for an assistant's).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["Record", "Turn", "decode", "encode", "input_items", "new_id"]

# Id prefixes of the items the gateway names when a client sent them without an id.
_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
    "item_reference": "ref",
}


def new_id(prefix: str) -> str:
    """``{prefix}_`` and 48 random hex digits (192 bits): ids that cannot be guessed or enumerated."""
    return f"{prefix}_{secrets.token_hex(24)}"


@dataclass(frozen=True, slots=True)
class Turn:
    """One earlier response of a conversation: what it was sent and what it answered."""

    response_id: str
    input: list[dict[str, Any]]
    output: list[dict[str, Any]]

    @property
    def items(self) -> list[dict[str, Any]]:
        return self.input + self.output


@dataclass(frozen=True, slots=True)
class Record:
    """A decoded stored response."""

    response: dict[str, Any]
    input: list[dict[str, Any]]
    chain: list[str]

    @property
    def model(self) -> str | None:
        model = self.response.get("model")
        return model if isinstance(model, str) else None

    def turn(self, response_id: str) -> Turn:
        output = self.response.get("output")
        return Turn(response_id, self.input, output if isinstance(output, list) else [])


def encode(response: Mapping[str, Any] | bytes, items: Sequence[Mapping[str, Any]], chain: Sequence[str]) -> bytes:
    """A record's bytes; ``response`` as a mapping or as the JSON already written for the client."""
    body = orjson.Fragment(response) if isinstance(response, bytes) else response
    return orjson.dumps({"response": body, "input": items, "chain": chain})


def decode(blob: bytes) -> Record:
    data = orjson.loads(blob)
    return Record(data["response"], data["input"], data["chain"])


def _message(item: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(item)
    out.setdefault("type", "message")
    content = out.get("content")
    if isinstance(content, str):
        if out.get("role") == "assistant":
            out["content"] = [{"type": "output_text", "text": content, "annotations": []}]
        else:
            out["content"] = [{"type": "input_text", "text": content}]
    return out


def input_items(request_input: str | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A request's ``input`` as the items to keep: each named (its own ``id`` or a new one), a
    string or a message's string content as parts, an item's other fields as sent."""
    if isinstance(request_input, str):
        request_input = [{"type": "message", "role": "user", "content": request_input}]
    out: list[dict[str, Any]] = []
    for item in request_input:
        kind = item.get("type", "message")
        entry = _message(item) if kind == "message" else dict(item)
        if not isinstance(entry.get("id"), str) or not entry["id"]:
            entry["id"] = new_id(_PREFIXES.get(str(kind), "item"))
        if kind == "message":
            entry.setdefault("status", "completed")
        out.append(entry)
    return out
