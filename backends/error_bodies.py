"""Upstream error bodies and events read as words: parsed once, redacted, then cut.

Every upstream message passes through :func:`error_fields` (OpenAI's, vLLM's old flat shape, TGI's
and Ollama's string, FastAPI's ``detail``, or any text), which redacts the process's registered
secrets (:func:`register_secret`) *before* it cuts a message, so a secret that straddles the cut
never leaks its start; :func:`redact` does the same for a whole body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["ErrorFields", "error_fields", "redact", "register_secret"]

_MAX_TEXT = 500  # a non-JSON body (an HTML error page, a traceback): its start is enough
_MAX_MESSAGE = 4096  # a structured message (validation errors can be long)
_REDACTED = "[redacted]"
_MIN_SECRET = 6  # shorter values would redact ordinary words
_secrets: set[str] = set()  # every secret of every config loaded in this process
_secret_bytes: set[bytes] = set()  # the same, as sent and as escaped inside a JSON string


def register_secret(value: str) -> None:
    """Remember a secret so no upstream message or error body carries it (process-wide)."""
    if len(value) >= _MIN_SECRET and value not in _secrets:
        _secrets.add(value)
        _secret_bytes.add(value.encode())
        _secret_bytes.add(orjson.dumps(value)[1:-1])


def redact(body: bytes) -> bytes:
    """``body`` with every registered secret replaced by ``[redacted]``."""
    for secret in _secret_bytes:
        if secret in body:
            body = body.replace(secret, _REDACTED.encode())
    return body


def _clip(text: str, limit: int) -> str:
    """``text`` redacted, *then* cut to ``limit`` characters, and no secret's start left at the cut.

    Redacting first is what keeps a secret that straddles the cut from leaking minus its
    tail; the prefix check covers a secret that only begins before the cut.
    """
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, _REDACTED)
    if len(text) <= limit:
        return text
    text = text[:limit]
    for secret in _secrets:
        for k in range(min(len(secret) - 1, len(text)), 0, -1):
            if text.endswith(secret[:k]):
                text = text[:-k]
                break
    return text + "..."


@dataclass(frozen=True, slots=True)
class ErrorFields:
    """What an upstream error body or event says: its message (redacted, bounded), ``param`` and ``code``."""

    message: str
    param: str | None = None
    code: str | None = None


def error_fields(body: bytes | dict[str, Any]) -> ErrorFields:
    """The one reader of upstream error bodies and error events, whatever their shape.

    Shapes: OpenAI/vLLM>=0.10.1 ``{"error": {"message", "type", "param", "code"}}``; vLLM<0.10.1
    flat ``{"object": "error", "message", "param", ...}``; TGI/Ollama ``{"error": "..."}``;
    vLLM's 401 ``{"error": "Unauthorized"}``; FastAPI ``{"detail": "..."}``; anything else:
    the text itself. vLLM's integer ``code`` (its HTTP status) is not a code in OpenAI's sense.
    """
    data: Any = body
    if isinstance(body, bytes):
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            text = body.decode("utf-8", "replace").strip()
            return ErrorFields(_clip(text, _MAX_TEXT) if text else "(empty body)")
    if isinstance(data, dict):
        inner = data.get("error")
        source = inner if isinstance(inner, dict) else data
        param, code = source.get("param"), source.get("code")
        fields: dict[str, Any] = {
            "param": param if isinstance(param, str) else None,
            "code": code if isinstance(code, str) and code else None,
        }
        if isinstance(inner, dict):
            message = inner.get("message")
            return ErrorFields(_clip(_text(message or inner), _MAX_MESSAGE), **fields)
        if isinstance(inner, str):
            return ErrorFields(_clip(inner, _MAX_MESSAGE))
        for key in ("message", "detail"):
            if isinstance(data.get(key), str):
                return ErrorFields(_clip(data[key], _MAX_MESSAGE), **(fields if key == "message" else {}))
        detail = _validation_detail(data.get("detail"))
        if detail is not None:
            return ErrorFields(_clip(detail, _MAX_MESSAGE))
    if isinstance(body, bytes):  # the upstream's own text, not a Python repr of what it parses to
        return ErrorFields(_clip(body.decode("utf-8", "replace").strip(), _MAX_TEXT))
    return ErrorFields(_clip(_text(data), _MAX_TEXT))


def _text(value: Any) -> str:
    """A message as words: a string as it is, anything else as its JSON (never Python's repr)."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value, default=str).decode()


def _validation_detail(detail: Any) -> str | None:
    """FastAPI's 422 ``{"detail": [{"loc": [...], "msg": ...}, ...]}`` (vLLM's request validation) as
    one line, ``messages.0.content: Field required; ...`` (``body`` left out of each location), or
    None when ``detail`` is not that list."""
    if not isinstance(detail, list) or not detail:
        return None
    parts = []
    for entry in detail:
        if not isinstance(entry, dict) or not isinstance(entry.get("msg"), str):
            return None
        loc = entry.get("loc")
        where = [str(x) for x in loc if x != "body"] if isinstance(loc, list) else []
        parts.append(f"{'.'.join(where)}: {entry['msg']}" if where else entry["msg"])
    return "; ".join(parts)
