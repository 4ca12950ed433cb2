"""``GET`` and ``DELETE /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``: thin handlers
over :class:`gateway.conversations.ConversationStore`.

The caller's key is the tenant (one tenant, ``_``, with auth off): another key's response is
the same 404 as one that never existed. A key that may not use the stored response's model
(a configured one) gets the 403 a new request would. Each answer counts once in
``gateway_stored_response_requests_total`` by operation and status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from gateway.conversations import ConversationStore, Record
from gateway.conversations.store import not_found
from gateway.security.auth import ApiKey, KeyRing
from gateway.state import STATE
from gateway.store import ANONYMOUS
from schemas.errors import GatewayError, InvalidRequestError, UnsupportedParameterError
from schemas.stored_responses import InputItemList, InputItemsQuery, ResponseDeleted, RetrieveQuery

__all__ = ["delete_response", "list_input_items", "retrieve_response"]

_JSON = "application/json"
_MAX_ID = 256  # longer ids were never minted: 404 without a store call
Q = TypeVar("Q", bound=BaseModel)
_Operation = Callable[[web.Request, ConversationStore, str, ApiKey | None, str], Awaitable[web.Response]]


def _query(request: web.Request, model: type[Q]) -> Q:
    """The query string as ``model`` (``include[]=a&include[]=b`` or repeated ``include``), or a 400
    naming the parameter."""
    values: dict[str, Any] = {}
    for name, value in request.query.items():
        if name in ("include", "include[]"):
            values.setdefault("include", []).append(value)
        elif name in values:
            raise InvalidRequestError(f"Query parameter '{name}' given more than once.", param=name)
        else:
            values[name] = value
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        param = str(error["loc"][0]) if error["loc"] else None
        if error["type"] == "extra_forbidden":
            raise InvalidRequestError(
                f"Unrecognized query parameter: {param}", param=param, code="unknown_parameter"
            ) from None
        raise InvalidRequestError(f"Invalid value for '{param}': {error['msg']}.", param=param) from None


def _check_model(request: web.Request, key: ApiKey | None, record: Record) -> None:
    model = record.model
    if key is not None and model is not None and model in request.app[STATE].router.models:
        KeyRing.check_model(key, model)


def _stored(operation: str, run: _Operation) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        state = request.app[STATE]
        status = 500
        try:
            guard = state.request_guard
            key = guard.identify(request) if guard.keyring is not None else None
            response_id = request.match_info["response_id"]
            tenant = key.name if key is not None else ANONYMOUS
            if len(response_id) > _MAX_ID:
                raise not_found(response_id)
            response = await run(request, state.responses_state, tenant, key, response_id)
            status = response.status
            return response
        except GatewayError as exc:
            status = exc.status
            raise
        finally:
            state.metrics.stored_request(operation, status)

    handler.__name__ = f"{operation}_response"
    return handler


async def _retrieve(
    request: web.Request, store: ConversationStore, tenant: str, key: ApiKey | None, response_id: str
) -> web.Response:
    query = _query(request, RetrieveQuery)
    if query.stream:
        raise UnsupportedParameterError(
            "Replaying a stored response as events is not supported: retrieve it without 'stream'.",
            param="stream",
            backend="gateway",
        )
    if query.starting_after is not None:
        raise UnsupportedParameterError(
            "'starting_after' applies to a streamed retrieve, which is not supported.",
            param="starting_after",
            backend="gateway",
        )
    record = await store.get(tenant, response_id)
    _check_model(request, key, record)
    return web.Response(body=orjson.dumps(record.response), content_type=_JSON)


async def _delete(
    request: web.Request, store: ConversationStore, tenant: str, key: ApiKey | None, response_id: str
) -> web.Response:
    _query(request, _NoQuery)
    record = await store.get(tenant, response_id)
    _check_model(request, key, record)
    await store.delete(tenant, response_id)
    return web.Response(body=ResponseDeleted(id=response_id).model_dump_json().encode(), content_type=_JSON)


async def _input_items(
    request: web.Request, store: ConversationStore, tenant: str, key: ApiKey | None, response_id: str
) -> web.Response:
    query = _query(request, InputItemsQuery)
    record = await store.get(tenant, response_id)
    _check_model(request, key, record)
    return web.Response(body=orjson.dumps(page(record.input, query)), content_type=_JSON)


def page(items: list[dict[str, Any]], query: InputItemsQuery) -> dict[str, Any]:
    """One page of ``items`` (kept in input order) as OpenAI's cursor list: ``order`` first, then
    the items strictly after ``after`` and before ``before``; with ``before`` alone, the ``limit``
    items just before it."""
    seq = items if query.order == "asc" else items[::-1]
    ids = [item.get("id") for item in seq]
    start, end = 0, len(seq)
    if query.after is not None:
        start = _position(ids, query.after, "after") + 1
    if query.before is not None:
        end = _position(ids, query.before, "before")
    if query.before is not None and query.after is None:
        first = max(start, end - query.limit)
        data, has_more = seq[first:end], first > start
    else:
        data, has_more = seq[start : min(end, start + query.limit)], start + query.limit < end
    body = InputItemList(data=[], first_id=_id(data, 0), last_id=_id(data, -1), has_more=has_more).model_dump()
    body["data"] = data
    return body


def _position(ids: list[Any], item_id: str, param: str) -> int:
    try:
        return ids.index(item_id)
    except ValueError:
        raise InvalidRequestError(f"No input item with id '{item_id}' in this response.", param=param) from None


def _id(data: list[dict[str, Any]], at: int) -> str | None:
    if not data:
        return None
    value = data[at].get("id")
    return value if isinstance(value, str) else None


class _NoQuery(BaseModel):
    model_config = {"extra": "forbid"}


retrieve_response = _stored("retrieve", _retrieve)  # GET /v1/responses/{response_id}
delete_response = _stored("delete", _delete)  # DELETE /v1/responses/{response_id}
list_input_items = _stored("input_items", _input_items)  # GET /v1/responses/{response_id}/input_items
