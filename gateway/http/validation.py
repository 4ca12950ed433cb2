"""Client JSON to a validated request of the endpoint's type, or a 400 naming the field.

One parse per endpoint (:func:`parse_completion_request`, :func:`parse_chat_request`,
:func:`parse_responses_request`):
pydantic validates straight from the body bytes (its JSON parser is the fastest path
available). Its errors become OpenAI's envelope here, once for both endpoints, with
``param`` set to the offending field: ``stream_options.include_usage`` for a nested
completions option; for chat the whole path, as OpenAI writes it (``messages[1].tool_call_id``,
``tools[0].function.name``); for Responses likewise (``input[2].content[0].type``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
from pydantic import ValidationError

from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest
from schemas.embeddings import EmbeddingRequest
from schemas.errors import FieldRuleError, InvalidRequestError
from schemas.rerank import RerankRequest
from schemas.responses import ResponsesRequest
from schemas.responses_tools import TOOL_TYPE_MESSAGE
from schemas.tokenize import DetokenizeRequest, TokenizeRequest

__all__ = [
    "parse_chat_request",
    "parse_completion_request",
    "parse_detokenize_request",
    "parse_embedding_request",
    "parse_rerank_request",
    "parse_responses_request",
    "parse_tokenize_request",
]

_Params = Callable[[tuple[int | str, ...], bytes], str | None]

# A readable description for fields whose pydantic union errors are noisy (keyed by the last name).
_SHAPES: dict[str, str] = {
    "prompt": "a string, an array of strings, an array of token ids, or an array of token-id arrays (none empty)",
    "stop": "a non-empty string or an array of 1 to 4 non-empty strings",
    "guided_json": "a JSON schema, as an object or a string",
    "content": "a string or an array of content parts",
    "tool_choice": '"none", "auto", "required" or an object naming a tool',
    "input": "a non-empty string, an array of 1 to 2048 non-empty strings, an array of token ids, "
    "or an array of 1 to 2048 token-id arrays (none empty)",
    "documents": "an array of 1 to 10000 documents, each a string or an object with a text",
}

# Responses' own ``input`` (the embeddings' one is above).
_RESPONSES_SHAPES: dict[str, str] = {**_SHAPES, "input": "a string or an array of input items"}


# Each parse is written out for its model rather than shared through a generic helper: the
# helper was one more Python call on every request. For the same reason each asks the model's
# validator itself: ``model_validate_json`` is only a Python wrapper around it (the same call,
# with the same defaults).
def parse_completion_request(body: bytes) -> CompletionRequest:
    if not body:
        raise _empty_body()
    try:
        request: CompletionRequest = CompletionRequest.__pydantic_validator__.validate_json(body)
        return request
    except ValidationError as exc:
        raise _to_client_error(exc, body, _completions_param) from None


def parse_chat_request(body: bytes) -> ChatCompletionRequest:
    if not body:
        raise _empty_body()
    try:
        request: ChatCompletionRequest = ChatCompletionRequest.__pydantic_validator__.validate_json(body)
        return request
    except ValidationError as exc:
        raise _to_client_error(exc, body, _chat_param) from None


def parse_embedding_request(body: bytes) -> EmbeddingRequest:
    if not body:
        raise _empty_body()
    try:
        request: EmbeddingRequest = EmbeddingRequest.__pydantic_validator__.validate_json(body)
        return request
    except ValidationError as exc:
        raise _to_client_error(exc, body, _embedding_param) from None


def parse_rerank_request(body: bytes) -> RerankRequest:
    if not body:
        raise _empty_body()
    try:
        request: RerankRequest = RerankRequest.__pydantic_validator__.validate_json(body)
        return request
    except ValidationError as exc:
        raise _to_client_error(exc, body, _chat_param) from None


def parse_responses_request(body: bytes) -> ResponsesRequest:
    if not body:
        raise _empty_body()
    try:
        request: ResponsesRequest = ResponsesRequest.__pydantic_validator__.validate_json(body)
        return request
    except ValidationError as exc:
        raise _to_client_error(exc, body, _responses_param) from None


def parse_tokenize_request(body: bytes) -> TokenizeRequest:
    if not body:
        raise _empty_body()
    try:
        request: TokenizeRequest = TokenizeRequest.__pydantic_validator__.validate_json(body)
        return request
    except ValidationError as exc:
        raise _to_client_error(exc, body, _chat_param) from None


def parse_detokenize_request(body: bytes) -> DetokenizeRequest:
    if not body:
        raise _empty_body()
    try:
        request: DetokenizeRequest = DetokenizeRequest.__pydantic_validator__.validate_json(body)
        return request
    except ValidationError as exc:
        raise _to_client_error(exc, body, _chat_param) from None


def _empty_body() -> InvalidRequestError:
    return InvalidRequestError("The request body is empty; expected a JSON object.")


def _completions_param(loc: tuple[int | str, ...], body: bytes) -> str | None:
    if not loc:
        return None
    head = str(loc[0])
    if head == "stream_options" and len(loc) > 1 and isinstance(loc[1], str):
        return f"stream_options.{loc[1]}"
    return head


def _embedding_param(loc: tuple[int | str, ...], body: bytes) -> str | None:
    """The field (``input``); in vLLM's chat-style ``messages``, the path as for chat."""
    if loc and loc[0] == "messages":
        return _chat_param(loc, body)
    return _completions_param(loc, body)


def _chat_param(loc: tuple[int | str, ...], body: bytes) -> str | None:
    """The field's path as the client wrote it: union members and discriminator tags dropped.

    pydantic puts a tagged union's tag into the location (``messages, 1, 'tool', 'tool_call_id'``);
    the body tells a tag (the node's ``role``/``type`` value, once per node) from a key.
    """
    if not loc:
        return None
    node: Any = _tree(body)
    path = ""
    tag_seen = False
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
            node = node[part] if isinstance(node, list) and -len(node) <= part < len(node) else None
            tag_seen = False
            continue
        if _is_union_tag(part):
            continue
        if isinstance(node, dict) and not tag_seen and part in (node.get("role"), node.get("type")):
            tag_seen = True  # the discriminator's value, not a key
            continue
        path = f"{path}.{part}" if path else part
        node = node.get(part) if isinstance(node, dict) else None
        tag_seen = False
    return path or None


def _tree(body: bytes) -> Any:
    """The body as JSON data, to tell a union's tag from a key (an error's path only). pydantic's parser
    takes ``NaN`` and ``Infinity``, orjson refuses them: without this fallback one such number anywhere
    in the body put every union tag of the path into ``param`` (``tools[0].function.parameters``)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(body)  # the standard parser reads NaN, Infinity and -Infinity
    except (ValueError, RecursionError):
        return None


# Union tags of the Responses schema that no node carries as a value: an untyped item is a
# message or a reference (also when its type is null), the built-in tool choices share one tag, as
# do allowed_tools' named refs.
_UNTYPED_TAGS = frozenset({"message", "item_reference", "message-null", "item_reference-null", "builtin", "named"})
# A union member's own errors that say more than the union's shapes.
_SAYS_MORE = frozenset({"value_error", "too_long"})
# Errors of a discriminated union whose tag matched no member: the client's ``type`` is wrong.
_TAG_ERRORS = frozenset({"union_tag_invalid", "item_type", "tool_type", "tool_choice_type"})


def _responses_param(loc: tuple[int | str, ...], body: bytes) -> str | None:
    """The field's path as the client wrote it (``input[2].content[0].text``): union members and
    tags dropped, a key told from a tag by the body (a tag is the node's ``type``, never a key)."""
    if not loc:
        return None
    node: Any = _tree(body)
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
            node = node[part] if isinstance(node, list) and -len(node) <= part < len(node) else None
            continue
        if _is_union_tag(part):
            continue
        if (
            isinstance(node, dict)
            and part not in node
            and (part == node.get("type") or part in _UNTYPED_TAGS or part[:1].isupper())
        ):
            continue  # a tag, or a model member of a plain union (``ConversationRef``): no field is capitalised
        path = f"{path}.{part}" if path else part
        node = node.get(part) if isinstance(node, dict) else None
    return path or None


# The errors of the tools' union at a tool itself (``tools[i]``): no object, no type, an unknown type.
# The union is told apart by pydantic (schemas/responses_tools.py: no Python discriminator, which cost
# a Python copy of every tool); they read as the one error that discriminator raised.
_TOOL_UNION_ERRORS = frozenset({"dict_type", "union_tag_not_found", "union_tag_invalid"})


def _as_tool_type(error: Any) -> Any:
    loc = error["loc"]
    if error["type"] in _TOOL_UNION_ERRORS and len(loc) == 2 and loc[0] == "tools" and isinstance(loc[1], int):
        return {"type": "tool_type", "loc": loc, "msg": TOOL_TYPE_MESSAGE, "input": error["input"]}
    return error


def _to_client_error(exc: ValidationError, body: bytes, param_of: _Params) -> InvalidRequestError:
    errors = exc.errors(include_url=False)
    if param_of is _responses_param:
        errors = [_as_tool_type(error) for error in errors]
    first: dict[str, Any] = dict(errors[0])
    kind = first["type"]
    ctx = first.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, FieldRuleError):
        return InvalidRequestError(cause.message, param=cause.param)
    loc = tuple(first["loc"])
    if kind == "json_invalid":
        return InvalidRequestError(
            f"We could not parse the JSON body of your request: {ctx.get('error', 'invalid JSON')}."
        )
    if kind == "model_type" and not loc:
        return InvalidRequestError("The request body must be a JSON object.")
    params = [param_of(tuple(e["loc"]), body) for e in errors]
    param = params[0]
    if kind == "missing":
        return InvalidRequestError(f"Missing required parameter: '{param}'.", param=param)
    if kind == "extra_forbidden":
        return InvalidRequestError(
            f"Unrecognized request argument supplied: {param}", param=param, code="unknown_parameter"
        )
    # Several members of a union failed: the deepest failure is where the client went wrong
    # (a bad URL inside an image part, not "content should be a string").
    deepest = max(range(len(errors)), key=lambda i: len(errors[i]["loc"]))
    if len(errors[deepest]["loc"]) > len(loc) and params[deepest] != param:
        first, param = dict(errors[deepest]), params[deepest]
        loc = tuple(first["loc"])
        if first["type"] == "extra_forbidden":  # an unknown key inside a content part, say
            return InvalidRequestError(
                f"Unrecognized request argument supplied: {param}", param=param, code="unknown_parameter"
            )
        if first["type"] == "missing":
            return InvalidRequestError(f"Missing required parameter: '{param}'.", param=param)
    if first["type"] in _TAG_ERRORS:
        if not isinstance(first.get("input"), dict):  # a string or null where an item or a tool goes
            return InvalidRequestError(f"Invalid value for '{param}': expected an object.", param=param)
        param = f"{param}.type" if param else "type"  # an unknown type: name the type key itself
        return InvalidRequestError(f"Invalid value for '{param}': {first['msg']}.", param=param)
    if first["type"] == "union_tag_not_found":  # a content part or a format without its type
        param = f"{param}.type" if param else "type"
        return InvalidRequestError(f"Missing required parameter: '{param}'.", param=param)
    leaf = (param or "").rsplit(".", 1)[-1].split("[", 1)[0]
    shapes = _RESPONSES_SHAPES if param_of is _responses_param else _SHAPES
    if leaf in shapes and params.count(param) > 1:
        # A member whose own check failed (a schema with an integer past 2^64, an array past its bound)
        # says more than the shapes.
        said = next(
            (e["msg"] for e, p in zip(errors, params, strict=True) if p == param and e["type"] in _SAYS_MORE), None
        )
        if said is not None:
            said = said.removeprefix("Value error, ")
            return InvalidRequestError(f"Invalid value for '{param}': {said}.", param=param)
        return InvalidRequestError(f"Invalid value for '{param}': expected {shapes[leaf]}.", param=param)
    if param_of is _chat_param or param_of is _responses_param:
        where = param
    else:
        where = ".".join(str(part) for part in loc if not _is_union_tag(part))
    said = str(first["msg"]).removeprefix("Value error, ")
    return InvalidRequestError(f"Invalid value for '{where}': {said}.", param=param)


def _is_union_tag(part: int | str) -> bool:
    # pydantic inserts the member type of a union into the location ("str", "list[int]", ...)
    return isinstance(part, str) and ("[" in part or part in {"str", "int", "float", "bool", "constrained-str"})
