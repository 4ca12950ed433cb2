"""JSON values generated from a JSON schema: what the chat simulator puts in tool-call arguments
and in ``json_schema`` replies, so that clients (``client.chat.completions.parse``, LangChain's
``with_structured_output``) get values that validate against the schema they sent.

Covered: ``type`` (one or a list), ``object`` (``properties``, every ``required`` one plus a
deterministic subset of the others), ``string`` (``minLength``/``maxLength`` and the common
``format``s), ``integer``/``number`` (``minimum``/``maximum``, exclusive bounds, ``multipleOf``),
``boolean``, ``null``, ``array`` (``items``, ``prefixItems``, ``minItems``/``maxItems``),
``enum``, ``const``, ``anyOf``/``oneOf`` (the first alternative that is not ``null``),
``allOf`` (merged) and local ``$ref`` (``#/$defs/...``, ``#/definitions/...``, as pydantic's
``model_json_schema`` writes them). Not covered: ``pattern`` and ``not`` (no generator can
satisfy an arbitrary regex cheaply); such schemas may get values that do not validate.

Deterministic: every choice comes from the ``random.Random`` the caller passes.
"""

from __future__ import annotations

import math
import random
from typing import Any

__all__ = ["instance"]

_WORDS = ("alpha", "bravo", "river", "stone", "light", "north", "cedar", "amber", "delta", "quartz")
_FORMATS = {
    "date-time": "2024-05-01T12:00:00Z",
    "date": "2024-05-01",
    "time": "12:00:00Z",
    "email": "user@example.com",
    "uri": "https://example.com/item",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
    "hostname": "example.com",
    "ipv4": "192.0.2.1",
}
_MAX_DEPTH = 8  # recursive schemas (a tree of nodes) stop growing here: only required fields below


def instance(schema: Any, rng: random.Random) -> Any:
    """A value valid against ``schema`` (a JSON schema as a dict; ``True``/``{}`` allow anything)."""
    return _value(schema, rng, schema if isinstance(schema, dict) else {}, 0)


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    seen = 0
    while "$ref" in schema and seen < 32:  # bounded: a $ref cycle must not hang the simulator
        ref = schema["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            return {}
        target: Any = root
        for part in (p.replace("~1", "/").replace("~0", "~") for p in ref[1:].split("/") if p):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        extra = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**target, **extra} if isinstance(target, dict) else extra
        seen += 1
    return schema


def _merge_all_of(schema: dict[str, Any]) -> dict[str, Any]:
    merged = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema["allOf"]:
        if not isinstance(part, dict):
            continue
        for key, value in part.items():
            if key == "properties":
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required":
                merged["required"] = [*merged.get("required", []), *value]
            else:
                merged.setdefault(key, value)
    return merged


def _value(schema: Any, rng: random.Random, root: dict[str, Any], depth: int) -> Any:
    if not isinstance(schema, dict):
        return "value"  # ``true`` or a malformed schema: anything goes
    schema = _resolve(schema, root)
    if isinstance(schema.get("allOf"), list):
        schema = _merge_all_of({k: v for k, v in schema.items()})
        schema = _resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            chosen = next((o for o in options if not (isinstance(o, dict) and o.get("type") == "null")), options[0])
            base = {k: v for k, v in schema.items() if k != key}
            return _value({**base, **chosen} if isinstance(chosen, dict) else chosen, rng, root, depth)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        return _object(schema, rng, root, depth)
    if kind == "array":
        return _array(schema, rng, root, depth)
    if kind == "integer":
        return _integer(schema, rng)
    if kind == "number":
        return _number(schema, rng)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _string(schema, rng)


def _object(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> dict[str, Any]:
    properties: dict[str, Any] = schema["properties"] if isinstance(schema.get("properties"), dict) else {}
    required = [name for name in schema.get("required", []) if isinstance(name, str)]
    out: dict[str, Any] = {}
    for name, sub in properties.items():
        # Draw for every optional property (fixed draw count), include about half of them.
        include = rng.random() < 0.5
        if name in required or (include and depth < _MAX_DEPTH):
            out[name] = _value(sub, rng, root, depth + 1)
    for name in required:  # required but not described: any value does
        out.setdefault(name, "value")
    return out


def _array(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> list[Any]:
    low = int(schema.get("minItems", 0))
    high = int(schema.get("maxItems", max(low, 3)))
    prefix: list[Any] = schema["prefixItems"] if isinstance(schema.get("prefixItems"), list) else []
    start = max(low, min(1, high))
    count = low if depth >= _MAX_DEPTH else rng.randint(start, max(start, high))
    items = schema.get("items", {})
    out: list[Any] = []
    for i in range(count):
        sub = prefix[i] if i < len(prefix) else items
        value = _value(sub, rng, root, depth + 1)
        if schema.get("uniqueItems") and value in out:
            for _ in range(8):  # a few redraws; small enums may not have enough distinct values
                value = _value(sub, rng, root, depth + 1)
                if value not in out:
                    break
            else:
                if len(out) >= low:
                    break
        out.append(value)
    return out


def _bounds(schema: dict[str, Any], default_low: float, default_high: float) -> tuple[float, float, bool, bool]:
    low, high = schema.get("minimum"), schema.get("maximum")
    ex_low, ex_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    lo_open = hi_open = False
    if isinstance(ex_low, int | float) and not isinstance(ex_low, bool) and (low is None or ex_low >= low):
        low, lo_open = ex_low, True
    if isinstance(ex_high, int | float) and not isinstance(ex_high, bool) and (high is None or ex_high <= high):
        high, hi_open = ex_high, True
    if low is None:
        low = min(default_low, high - 100) if high is not None else default_low
    if high is None:
        high = max(default_high, low + 100)
    return float(low), float(high), lo_open, hi_open


def _integer(schema: dict[str, Any], rng: random.Random) -> int:
    low, high, lo_open, hi_open = _bounds(schema, 0, 100)
    lo = math.floor(low) + 1 if lo_open else math.ceil(low)
    hi = math.ceil(high) - 1 if hi_open else math.floor(high)
    step = schema.get("multipleOf")
    if isinstance(step, int) and not isinstance(step, bool) and step > 0:
        first = -(-lo // step) * step
        if first <= hi:
            return first + step * rng.randint(0, (hi - first) // step)
    return rng.randint(lo, max(lo, hi))


def _number(schema: dict[str, Any], rng: random.Random) -> float | int:
    if isinstance(schema.get("multipleOf"), int):
        return _integer(schema, rng)
    low, high, lo_open, hi_open = _bounds(schema, 0.0, 100.0)
    value = round(rng.uniform(low, high), 2)
    if (lo_open and value <= low) or (hi_open and value >= high) or not low <= value <= high:
        value = (low + high) / 2
    return value


def _string(schema: dict[str, Any], rng: random.Random) -> str:
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in _FORMATS:
        return _FORMATS[fmt]
    low = int(schema.get("minLength", 1))
    high = int(schema.get("maxLength", max(low, 24)))
    text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))
    while len(text) < low:
        text += " " + rng.choice(_WORDS)
    return text[:high]
