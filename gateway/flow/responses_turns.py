"""Where ``POST /v1/responses`` differs from the other endpoints on the request path, and nothing else.

:class:`ResponsesTurns` is the Responses endpoint's hooks (``EndpointOps.turns``), called by
the handler at three points:

- :meth:`ResponsesTurns.begin_now` (or ``begin``, awaiting it), after the model lookup and before the
  guard's check (so caps and rate limits count the whole conversation): the model's built-in-tools
  choice (``models[].responses.builtin_tools``) goes onto the request, and ``previous_response_id`` is
  expanded (the coroutine it hands back): the stored turns (:class:`~gateway.responses_state.ResponsesState`)
  go upstream ahead of the request's own ``input``, whichever backend served them;
- :meth:`ResponsesTurns.headers`: the answer's extra headers (``x-gateway-omitted-tools`` when the
  operator's ``omit`` left built-in tools out on this backend; the log says it too);
- :meth:`ResponsesTurns.end_now` (a stream's ``end``, through :class:`StreamEnd`), once the Response reached
  a terminal status (a client that left mid-stream: ``cancelled``): the turn is saved when ``store`` allows.

The tenant is the caller's key name (one tenant without auth: ``NO_AUTH_TENANT``).
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from pydantic import TypeAdapter, ValidationError

from backends.base import Backend, CompletionStream, ResponsesTable
from backends.responses.answer import new_id
from backends.responses.bridge import responses_table
from gateway.conversations.records import item_id, text_input_line
from gateway.conversations.store import ConversationStore
from gateway.conversations.window import fit
from gateway.responses_state import NO_AUTH_TENANT, FinishedTurn, ResponsesState
from gateway.served import ServedRequest
from schemas.endpoints import Endpoint
from schemas.errors import InvalidRequestError
from schemas.responses import DUPLICATE_ITEM, ResponsesRequest
from schemas.responses_items import InputItem, MessageItem
from schemas.responses_tools import BUILTIN_TOOL_TYPES

if TYPE_CHECKING:
    from gateway.security.auth import ApiKey


class _Route(Protocol):
    def context_length(self) -> int | None: ...


class ModelEntry(Protocol):
    """What :meth:`ResponsesTurns.begin` reads of the model (``gateway.flow.router.ModelEntry``,
    which imports this module through ``endpoints``)."""

    @property
    def omit_builtin_tools(self) -> bool: ...
    @property
    def served(self) -> Mapping[Endpoint, Sequence[_Route]]: ...


__all__ = ["OMITTED_HEADER", "ResponsesTurns", "StreamEnd", "own_items", "tenant_of"]

log = logging.getLogger("gateway")

OMITTED_HEADER = "x-gateway-omitted-tools"
_ITEMS: TypeAdapter[list[Any]] = TypeAdapter(list[InputItem])


def tenant_of(key: ApiKey | None) -> str:
    return NO_AUTH_TENANT if key is None else key.name


def own_items(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's own ``input`` as items with ids, as the store keeps them (never the history)."""
    items = request.input
    if items is None:
        return []
    if isinstance(items, str):
        text = {"type": "input_text", "text": items}
        return [{"id": new_id("msg"), "type": "message", "role": "user", "content": [text]}]
    out = []
    for item in items:
        data = item.model_dump(mode="json", by_alias=True, exclude_none=True)
        if "id" not in data:
            data["id"] = item_id(item.type)
        out.append(data)
    return out


def _check_not_repeated(own: Sequence[Any], history: list[dict[str, Any]]) -> None:
    """An item of the request whose id an earlier turn of the conversation holds is OpenAI's 400
    (the model would see it twice; an openai upstream, sent the history by value, refuses it)."""
    if not any(item.id for item in own):
        return
    earlier = {item.get("id") for item in history}
    for i, item in enumerate(own):
        if item.id and item.id in earlier:
            raise InvalidRequestError(DUPLICATE_ITEM.format(item.id), param=f"input[{i}].id")


def _context(entry: ModelEntry) -> int | None:
    """The smallest known context window among the routes that may serve the request (failover
    included), so the conversation sent fits whichever answers; None when none is known."""
    windows = [w for route in entry.served.get(Endpoint.RESPONSES, ()) if (w := route.context_length()) is not None]
    return min(windows) if windows else None


def omitted_tools(request: ResponsesRequest, table: ResponsesTable | None) -> list[str]:
    """The built-in tools this attempt leaves out (the operator's ``omit``, on a backend that cannot run them)."""
    if not request.omits_builtin_tools or table is None:
        return []
    return [
        kind
        for kind in request.builtin_tools
        if kind in BUILTIN_TOOL_TYPES and table.level("tools", kind) == "unsupported"
    ]


class ResponsesTurns:
    """The Responses endpoint's hooks on the request path (module docstring). Stateless: the store is passed in."""

    async def begin(
        self, served: ServedRequest, entry: ModelEntry, store: ResponsesState, key: ApiKey | None
    ) -> ResponsesRequest:
        """The request as it goes on (:meth:`begin_now`, its continuation awaited where there is one)."""
        continuing = self.begin_now(served, entry, store, key)
        return served if continuing is None else await continuing  # type: ignore[return-value]  # (the parse's)

    def begin_now(
        self, served: ServedRequest, entry: ModelEntry, store: ResponsesState, key: ApiKey | None
    ) -> Coroutine[Any, Any, ResponsesRequest] | None:
        """The request's built-in tools choice and its ``store`` check, done now; then None when it goes
        on as it is (no ``previous_response_id``: the usual turn), else the conversation's expansion to
        await (:meth:`continued`). Not a coroutine itself: a first turn makes none.
        ``entry``: the model (its ``responses.builtin_tools`` choice, its routes' context windows)."""
        request: ResponsesRequest = served  # type: ignore[assignment]  # the Responses parse made it
        if entry.omit_builtin_tools and request.tools:
            request.omit_builtin_tools()
        if request.store is not False:  # ResponsesRequest.stores, read inline (as in end)
            store.check_storable()  # refused by name before any upstream call when it cannot be kept
        previous = request.previous_response_id
        if previous is None:
            return None
        return self.continued(request, previous, entry, store, key)

    async def continued(
        self, request: ResponsesRequest, previous: str, entry: ModelEntry, store: ResponsesState, key: ApiKey | None
    ) -> ResponsesRequest:
        """``request`` with the stored turns of ``previous`` before its own input (fitted to the context)."""
        turns = fit(
            await store.turns(tenant_of(key), previous),
            request.prompt_estimate(),
            context=_context(entry),
            output_tokens=request.max_output_tokens or 1,
            truncation=request.truncation,
        )
        history = [item for turn in turns for item in turn]
        own = request.input
        if own and not isinstance(own, str):
            _check_not_repeated(own, history)
        try:
            earlier = _ITEMS.validate_python(history)
        except ValidationError:
            raise InvalidRequestError(
                f"The stored conversation of '{previous}' holds an item this gateway cannot send again.",
                param="previous_response_id",
            ) from None
        current = [MessageItem(role="user", content=own)] if isinstance(own, str) else list(own or ())
        expanded = request.with_input([*earlier, *current])
        expanded.keep_stored_input(own_items(request))
        return expanded

    def headers(self, served: ServedRequest, backend: Backend) -> dict[str, str]:
        request: ResponsesRequest = served  # type: ignore[assignment]  # (not cast(): a call per use)
        state = request.__pydantic_private__  # ResponsesRequest.omits_builtin_tools, read inline: on every request
        if not (state and "omit" in state):  # the common case: nothing to say
            return {}
        omitted = omitted_tools(request, responses_table(backend))
        if not omitted:
            return {}
        log.info(
            "model %s on backend %s: built-in tools %s omitted (models[].responses.builtin_tools: omit)",
            request.model,
            backend.name,
            ", ".join(omitted),
        )
        return {OMITTED_HEADER: ", ".join(omitted)}

    async def end(
        self, served: ServedRequest, answer: dict[str, Any] | None, store: ResponsesState, key: ApiKey | None,
        dumped: bytes | None = None, output_at: int = 0,
    ) -> None:  # fmt: skip
        """The turn's save (:meth:`end_now`), awaited where it must be."""
        saving = self.end_now(served, answer, store, key, dumped, output_at)
        if saving is not None:
            await saving

    def end_now(
        self,
        served: ServedRequest,
        answer: dict[str, Any] | None,
        store: ResponsesState,
        key: ApiKey | None,
        dumped: bytes | None = None,
        output_at: int = 0,
    ) -> Coroutine[Any, Any, None] | None:
        """Save the turn when ``store`` allows: done now where nothing is to be awaited (the gateway's
        memory store, :meth:`ConversationStore.save_now`), else the save to await (None: nothing to
        await). Not a coroutine itself: the handler awaits only where there is something to wait for
        (a coroutine object and its frame less on every stored turn). ``dumped``: ``orjson.dumps(answer)``,
        where its producer says so (``CompletionResult.dumped``); ``output_at``: where its output starts,
        where the producer noted it (``CompletionResult.output_at``; 0: not noted)."""
        request: ResponsesRequest = served  # type: ignore[assignment]  # (not cast(): a call per use)
        # ResponsesRequest.stores and tenant_of, read inline, and the request's fields from its __dict__
        # (each attribute of a pydantic model goes through its __getattr__ hook): on every turn
        fields = request.__dict__
        if fields["store"] is False or answer is None or "id" not in answer:
            return None
        previous = fields["previous_response_id"]
        # (stored_input is set by begin only when previous_response_id expanded the input: a first
        # turn, the usual one, makes its items without reading it; and a first turn's string input is
        # written as its record's line at once, without the dicts own_items makes of it)
        items: list[dict[str, Any]] | bytes
        if previous is None:
            own = fields["input"]
            items = text_input_line(own) if isinstance(own, str) else own_items(request)
        else:
            items = request.stored_input or own_items(request)
        tenant = NO_AUTH_TENANT if key is None else key.name
        # The gateway's store keeps the turn from its fields, without a FinishedTurn or a coroutine, where it can
        if type(store) is ConversationStore and store.save_now(tenant, answer, items, previous, dumped, output_at):
            return None
        # a store to wait for keeps the items themselves (a written line read back: the same items)
        kept: list[dict[str, Any]] = orjson.loads(items) if isinstance(items, bytes) else items
        return store.save(tenant, FinishedTurn(answer, kept, previous, dumped, output_at))


class StreamEnd:
    """A streamed turn's save, done once: by the handler just before it writes the stream's last
    event (so a client that continues the moment it has ``response.completed`` finds the turn, on
    any worker), or, for a stream cut short (the client left), when the handler ends (``done``: it
    was saved already, and the handler skips the call)."""

    __slots__ = ("_args", "_turns", "done")

    def __init__(
        self, turns: ResponsesTurns, served: ServedRequest, stream: CompletionStream, store: ResponsesState,
        key: ApiKey | None,
    ) -> None:  # fmt: skip
        self._turns = turns
        self._args = (served, stream, store, key)
        self.done = False

    async def __call__(self) -> None:
        """The stream's turn: its final Response, or where it stood when the client left (``cancelled``)."""
        if self.done:
            return
        self.done = True
        served, stream, store, key = self._args
        request: ResponsesRequest = served  # type: ignore[assignment]  # (not cast(): a call per use)
        if request.store is False:
            return
        # A ResponseEventStream's snapshot (every Responses stream has one), found without
        # isinstance: ResponseEventStream is an ABC, whose test is three calls on every stored stream.
        snapshot = getattr(stream, "snapshot", None)
        if snapshot is not None:
            # (final_dumped: the finished Response's bytes, its last event's, where it was written from them;
            # final_output_at: where its output starts in them, where the stream says)
            dumped, at = getattr(stream, "final_dumped", None), getattr(stream, "final_output_at", 0)
            await self._turns.end(request, snapshot("cancelled"), store, key, dumped, at)
