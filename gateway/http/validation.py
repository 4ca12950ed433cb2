"""Client JSON to a validated :class:`CompletionRequest`, or a 400 naming the field.

One parse: pydantic validates straight from the body bytes (its JSON parser is
the fastest path available). Its errors are turned into OpenAI's envelope here,
with ``param`` set to the offending field (``stream_options.include_usage`` for
nested ones).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from schemas.completions import CompletionRequest
from schemas.errors import FieldRuleError, InvalidRequestError

__all__ = ["parse_completion_request"]

# A readable description for fields whose pydantic union errors are noisy.
_SHAPES: dict[str, str] = {
    "prompt": "a string, an array of strings, an array of token ids, or an array of token-id arrays (none empty)",
    "stop": "a non-empty string or an array of 1 to 4 non-empty strings",
    "guided_json": "a JSON schema, as an object or a string",
}


def parse_completion_request(body: bytes) -> CompletionRequest:
    if not body:
        raise InvalidRequestError("The request body is empty; expected a JSON object.")
    try:
        return CompletionRequest.model_validate_json(body)
    except ValidationError as exc:
        raise _to_client_error(exc) from None


def _param(loc: tuple[int | str, ...]) -> str | None:
    if not loc:
        return None
    head = str(loc[0])
    if head == "stream_options" and len(loc) > 1 and isinstance(loc[1], str):
        return f"stream_options.{loc[1]}"
    return head


def _to_client_error(exc: ValidationError) -> InvalidRequestError:
    errors = exc.errors(include_url=False)
    first: dict[str, Any] = dict(errors[0])
    kind = first["type"]
    ctx = first.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, FieldRuleError):
        return InvalidRequestError(cause.message, param=cause.param)
    loc = tuple(first["loc"])
    param = _param(loc)
    if kind == "json_invalid":
        return InvalidRequestError(
            f"We could not parse the JSON body of your request: {ctx.get('error', 'invalid JSON')}."
        )
    if kind == "model_type" and not loc:
        return InvalidRequestError("The request body must be a JSON object.")
    if kind == "missing":
        return InvalidRequestError(f"Missing required parameter: '{param}'.", param=param)
    if kind == "extra_forbidden":
        return InvalidRequestError(
            f"Unrecognized request argument supplied: {param}", param=param, code="unknown_parameter"
        )
    if param in _SHAPES and sum(1 for e in errors if _param(tuple(e["loc"])) == param) > 1:
        return InvalidRequestError(f"Invalid value for '{param}': expected {_SHAPES[param]}.", param=param)
    where = ".".join(str(part) for part in loc if not _is_union_tag(part))
    return InvalidRequestError(f"Invalid value for '{where}': {first['msg']}.", param=param)


def _is_union_tag(part: int | str) -> bool:
    # pydantic inserts the member type of a union into the location ("str", "list[int]", ...)
    return isinstance(part, str) and ("[" in part or part in {"str", "int", "float", "bool", "constrained-str"})
